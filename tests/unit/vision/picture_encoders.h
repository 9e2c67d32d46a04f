// Test pictures made in memory with the encoders of libpng, libjpeg and libwebp, and a PNG
// chunk writer for hand-made (hostile) files.
#pragma once

#include <png.h>
#include <webp/encode.h>
#include <zlib.h>

#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

namespace gizllm::vision::testing {

using Bytes = std::vector<uint8_t>;

// Fresh, non-flat sample values: a pattern every channel of every pixel differs in.
inline Bytes Pattern(int width, int height, int channels, int seed = 1) {
  Bytes v(size_t(width) * height * channels);
  uint32_t s = 2654435761u * uint32_t(seed);
  for (size_t i = 0; i < v.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = uint8_t(s >> 24);
  }
  return v;
}

struct PngOptions {
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette;  // for PNG_COLOR_TYPE_PALETTE
  Bytes transparency;              // tRNS alpha per palette entry
};

inline void PngWrite(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

// `samples` holds rows of packed samples as PNG stores them (16-bit big-endian, low bit
// depths packed from the high bits), [height, row bytes].
inline Bytes EncodePng(int width, int height, const Bytes& samples, const PngOptions& o) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(png, &out, PngWrite, nullptr);
  png_set_IHDR(png, info, width, height, o.bit_depth, o.color_type,
               o.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!o.palette.empty()) png_set_PLTE(png, info, o.palette.data(), int(o.palette.size()));
  if (!o.transparency.empty()) {
    png_set_tRNS(png, info, o.transparency.data(), int(o.transparency.size()), nullptr);
  }
  png_write_info(png, info);
  const size_t row_bytes = samples.size() / height;
  std::vector<png_bytep> rows(height);
  for (int y = 0; y < height; ++y) rows[y] = const_cast<png_bytep>(samples.data() + y * row_bytes);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// One PNG chunk: length, type, data, CRC.
inline void AppendChunk(Bytes& out, const char* type, const Bytes& data) {
  const uint32_t n = uint32_t(data.size());
  const uint8_t len[4] = {uint8_t(n >> 24), uint8_t(n >> 16), uint8_t(n >> 8), uint8_t(n)};
  out.insert(out.end(), len, len + 4);
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uint32_t crc = uint32_t(crc32(0, out.data() + start, uInt(out.size() - start)));
  const uint8_t c[4] = {uint8_t(crc >> 24), uint8_t(crc >> 16), uint8_t(crc >> 8), uint8_t(crc)};
  out.insert(out.end(), c, c + 4);
}

inline Bytes Be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

inline Bytes Deflate(const Bytes& raw) {
  uLongf n = compressBound(uLong(raw.size()));
  Bytes out(n);
  compress2(out.data(), &n, raw.data(), uLong(raw.size()), 9);
  out.resize(n);
  return out;
}

// A PNG of `width` x `height` 8-bit RGB whose IDAT holds `idat` (zlib data), and any chunks
// given before it.
inline Bytes HandMadePng(uint32_t width, uint32_t height, const Bytes& idat,
                         const std::vector<std::pair<std::string, Bytes>>& extra = {}) {
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr = Be32(width);
  const Bytes h = Be32(height);
  ihdr.insert(ihdr.end(), h.begin(), h.end());
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  AppendChunk(out, "IHDR", ihdr);
  for (const auto& [type, data] : extra) AppendChunk(out, type.c_str(), data);
  AppendChunk(out, "IDAT", idat);
  AppendChunk(out, "IEND", {});
  return out;
}

struct JpegOptions {
  int quality = 90;
  bool progressive = false;
  J_COLOR_SPACE color_space = JCS_RGB;  // JCS_RGB, JCS_GRAYSCALE or JCS_CMYK
  bool full_chroma = false;             // 4:4:4 instead of 4:2:0
};

// `samples`: [height, width, 3 | 1 | 4] as color_space says.
inline Bytes EncodeJpeg(int width, int height, const Bytes& samples, const JpegOptions& o) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &mem, &size);
  c.image_width = width;
  c.image_height = height;
  c.input_components = o.color_space == JCS_GRAYSCALE ? 1 : o.color_space == JCS_CMYK ? 4 : 3;
  c.in_color_space = o.color_space;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, o.quality, TRUE);
  if (o.full_chroma) {
    for (int i = 0; i < c.num_components; ++i)
      c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  }
  if (o.progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  const size_t stride = size_t(width) * c.input_components;
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples.data() + c.next_scanline * stride);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  Bytes out(mem, mem + size);
  free(mem);
  return out;
}

inline Bytes FromWebp(uint8_t* data, size_t size) {
  Bytes out(data, data + size);
  WebPFree(data);
  return out;
}

inline Bytes EncodeWebpLossless(int width, int height, const Bytes& rgb) {
  uint8_t* data = nullptr;
  const size_t n = WebPEncodeLosslessRGB(rgb.data(), width, height, width * 3, &data);
  return FromWebp(data, n);
}

inline Bytes EncodeWebpLosslessRgba(int width, int height, const Bytes& rgba) {
  uint8_t* data = nullptr;
  const size_t n = WebPEncodeLosslessRGBA(rgba.data(), width, height, width * 4, &data);
  return FromWebp(data, n);
}

inline Bytes EncodeWebpLossy(int width, int height, const Bytes& rgb, float quality) {
  uint8_t* data = nullptr;
  const size_t n = WebPEncodeRGB(rgb.data(), width, height, width * 3, quality, &data);
  return FromWebp(data, n);
}

}  // namespace gizllm::vision::testing
