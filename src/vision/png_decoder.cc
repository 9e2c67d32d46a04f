// PNG through libpng. libpng reports errors by longjmp to a setjmp of the caller's: the
// functions that call into it (ReadPngInfo, ReadPngLayout, ReadPngPixels) hold no object with a
// destructor, so a jump skips none; what they fill lives in their caller's PngRead.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "vision/picture_decoders.h"

namespace gizllm::vision {
namespace {

// Ancillary chunks (iCCP, zTXt, iTXt) libpng may inflate: a few KB in a real file, so a
// small file that inflates to gigabytes is refused.
constexpr png_alloc_size_t kMaxChunkBytes = png_alloc_size_t{8} << 20;

struct PngRead {
  const uint8_t* data = nullptr;  // [size] the whole file
  size_t size = 0;
  size_t offset = 0;  // bytes libpng has taken
  bool truncated = false;
  char error[256] = {};  // libpng's message of the error that stopped it

  // After ReadPngInfo and ReadPngLayout: the picture and the rows libpng hands out.
  png_uint_32 width = 0;
  png_uint_32 height = 0;
  int file_bit_depth = 0;  // as stored: 1, 2, 4, 8 or 16
  int color_type = 0;      // PNG_COLOR_TYPE_*
  int channels = 0;        // 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA
  int bit_depth = 0;       // 8, or 16 for 16-bit grayscale (clipped here, as Pillow does)
  size_t row_bytes = 0;
  int passes = 1;  // 7 when interlaced

  uint8_t* pixels = nullptr;  // [height, row_bytes], owned by the caller
};

void ReadBytes(png_structp png, png_bytep out, size_t n) {
  auto* r = static_cast<PngRead*>(png_get_io_ptr(png));
  if (n > r->size - r->offset) {
    r->truncated = true;
    png_error(png, "truncated");
  }
  std::memcpy(out, r->data + r->offset, n);
  r->offset += n;
}

void OnError(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(r->error, sizeof(r->error), "%s", message);
  png_longjmp(png, 1);
}

void OnWarning(png_structp, png_const_charp) {}

// Reads the chunks before the pixels (the size, the color type). False on an error (r->error
// says).
bool ReadPngInfo(png_structp png, png_infop info, PngRead* r) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, r, ReadBytes);
  // The caller's PictureLimits judge the size, with a message that says so.
  png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  png_set_chunk_malloc_max(png, kMaxChunkBytes);
  png_read_info(png, info);
  png_get_IHDR(png, info, &r->width, &r->height, &r->file_bit_depth, &r->color_type, nullptr,
               nullptr, nullptr);
  return true;
}

// Sets the transforms that bring every color type to 8-bit gray, gray + alpha, RGB or RGBA
// (16-bit grayscale stays 16-bit); libpng then sizes its row buffers. False on an error.
bool ReadPngLayout(png_structp png, png_infop info, PngRead* r) {
  if (setjmp(png_jmpbuf(png))) return false;
  // Pillow's modes: P and low-bit gray expand to 8 bits, 16-bit color keeps its high byte.
  // Transparency (tRNS) plays no part in convert("RGB").
  if (r->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (r->color_type == PNG_COLOR_TYPE_GRAY && r->file_bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  if (r->file_bit_depth == 16 && r->color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);
  r->passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  r->channels = png_get_channels(png, info);
  r->bit_depth = png_get_bit_depth(png, info);
  r->row_bytes = png_get_rowbytes(png, info);
  return true;
}

// Reads every pass of every row into r->pixels. False on an error.
bool ReadPngPixels(png_structp png, PngRead* r) {
  if (setjmp(png_jmpbuf(png))) return false;
  for (int pass = 0; pass < r->passes; ++pass) {
    for (png_uint_32 y = 0; y < r->height; ++y) {
      png_read_row(png, r->pixels + size_t{y} * r->row_bytes, nullptr);
    }
  }
  return true;
}

Status PngError(const PngRead& r) {
  if (r.truncated) return DataLoss("PNG truncated");
  return DataLoss(std::string("PNG corrupt: ") + r.error);
}

// Owns libpng's structures.
struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngHandles() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

}  // namespace

Expected<Picture> DecodePng(std::span<const uint8_t> bytes, const PictureLimits& limits) {
  PngRead r;
  r.data = bytes.data();
  r.size = bytes.size();
  PngHandles h;
  h.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, OnError, OnWarning);
  if (h.png == nullptr) return ResourceExhausted("PNG: libpng could not start");
  h.info = png_create_info_struct(h.png);
  if (h.info == nullptr) return ResourceExhausted("PNG: libpng could not start");
  if (!ReadPngInfo(h.png, h.info, &r)) return PngError(r);
  // At most 4 channels of 8 bits after the transforms, or one of 16.
  const int64_t decoded_bytes =
      r.file_bit_depth == 16 && r.color_type == PNG_COLOR_TYPE_GRAY ? 2 : 4;
  GZ_RETURN_IF_ERROR(CheckPictureSize(r.width, r.height, decoded_bytes, limits).Annotate("PNG"));
  if (!ReadPngLayout(h.png, h.info, &r)) return PngError(r);

  const int64_t sample_bytes = r.bit_depth / 8;
  if (r.channels < 1 || r.channels > 4 || sample_bytes < 1 || sample_bytes > 2 ||
      r.channels * sample_bytes > decoded_bytes ||
      r.row_bytes != size_t{r.width} * r.channels * sample_bytes) {
    return DataLoss("PNG: unexpected layout after conversion (" + std::to_string(r.channels) +
                    " channels of " + std::to_string(r.bit_depth) + " bits)");
  }
  std::vector<uint8_t> pixels(r.row_bytes * r.height);  // [height, width, channels]
  r.pixels = pixels.data();
  if (!ReadPngPixels(h.png, &r)) return PngError(r);

  Picture picture;
  picture.width = static_cast<int>(r.width);
  picture.height = static_cast<int>(r.height);
  const size_t n = size_t{r.width} * r.height;
  picture.rgb.resize(n * 3);
  uint8_t* out = picture.rgb.data();
  const uint8_t* in = pixels.data();
  if (r.bit_depth == 16) {
    // 16-bit grayscale: Pillow's I;16 to RGB clips each big-endian sample to 255.
    for (size_t i = 0; i < n; ++i) {
      const uint8_t v = in[2 * i] != 0 ? 255 : in[2 * i + 1];
      out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = v;
    }
  } else if (r.channels <= 2) {
    for (size_t i = 0; i < n; ++i) {
      const uint8_t v = in[i * r.channels];
      out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = v;
    }
  } else if (r.channels == 3) {
    std::memcpy(out, in, n * 3);
  } else {
    for (size_t i = 0; i < n; ++i) std::memcpy(out + 3 * i, in + 4 * i, 3);
  }
  return picture;
}

}  // namespace gizllm::vision
