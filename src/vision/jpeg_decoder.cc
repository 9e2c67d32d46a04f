// JPEG through libjpeg(-turbo). Its errors end in error_exit, which longjmps here: the
// functions that call into libjpeg (ReadJpegHeader, ReadJpegRows) hold no object with a
// destructor, so a jump skips none; what they fill lives in their caller's JpegRead.
#include <cstddef>
#include <cstdio>
// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "vision/picture_decoders.h"

namespace gizllm::vision {
namespace {

struct JpegRead {
  jpeg_error_mgr errors;  // first: libjpeg hands error callbacks a pointer to it
  jmp_buf jump;
  jpeg_progress_mgr progress;
  jpeg_decompress_struct info;
  bool created = false;
  bool multiple_scans = false;  // progressive, or sequential in several scans
  long max_memory = 0;          // what libjpeg's own allocations may reach
  bool truncated = false;
  int max_scans = 0;
  bool too_many_scans = false;
  char error[JMSG_LENGTH_MAX] = {};

  uint8_t* row = nullptr;  // [width, output_components], owned by the caller
  uint8_t* rgb = nullptr;  // [height, width, 3], owned by the caller
};

JpegRead* ReadOf(j_common_ptr cinfo) { return reinterpret_cast<JpegRead*>(cinfo->err); }

void OnError(j_common_ptr cinfo) {
  JpegRead* r = ReadOf(cinfo);
  (*cinfo->err->format_message)(cinfo, r->error);
  longjmp(r->jump, 1);
}

// Warnings (level -1) are corrupt data libjpeg decodes past, as Pillow does, but for the end
// of the data coming before the end of the picture: libjpeg would fill the rest with gray.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    ReadOf(cinfo)->truncated = true;
    longjmp(ReadOf(cinfo)->jump, 1);
  }
}

void OnProgress(j_common_ptr cinfo) {
  JpegRead* r = ReadOf(cinfo);
  if (cinfo->is_decompressor &&
      reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > r->max_scans) {
    r->too_many_scans = true;
    longjmp(r->jump, 1);
  }
}

// Reads the header and chooses the output colors. False on an error.
bool ReadJpegHeader(JpegRead* r, const uint8_t* data, size_t size) {
  if (setjmp(r->jump)) return false;
  jpeg_create_decompress(&r->info);
  r->created = true;
  r->info.mem->max_memory_to_use = r->max_memory;
  r->info.progress = &r->progress;
  jpeg_mem_src(&r->info, data, static_cast<unsigned long>(size));
  jpeg_read_header(&r->info, TRUE);
  r->multiple_scans = jpeg_has_multiple_scans(&r->info);
  // Pillow's modes: L stays gray, CMYK and YCCK come out as CMYK, the rest as RGB.
  switch (r->info.jpeg_color_space) {
    case JCS_GRAYSCALE:
      r->info.out_color_space = JCS_GRAYSCALE;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      r->info.out_color_space = JCS_CMYK;
      break;
    default:
      r->info.out_color_space = JCS_RGB;
      break;
  }
  return true;
}

// Pillow's MULDIV255: a * b / 255, rounded.
inline int MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// Decodes every row into r->rgb. False on an error.
bool ReadJpegRows(JpegRead* r) {
  if (setjmp(r->jump)) return false;
  jpeg_start_decompress(&r->info);
  const JDIMENSION width = r->info.output_width;
  const int components = r->info.output_components;
  if (width != r->info.image_width || r->info.output_height != r->info.image_height ||
      (components != 1 && components != 3 && components != 4)) {
    std::snprintf(r->error, sizeof(r->error), "unexpected output layout (%d components)",
                  components);
    return false;
  }
  while (r->info.output_scanline < r->info.output_height) {
    uint8_t* out = r->rgb + size_t{r->info.output_scanline} * width * 3;
    JSAMPROW row = r->row;
    if (jpeg_read_scanlines(&r->info, &row, 1) != 1) {  // only a suspending source stops
      std::snprintf(r->error, sizeof(r->error), "no row at %u", r->info.output_scanline);
      return false;
    }
    if (components == 3) {
      std::memcpy(out, r->row, size_t{width} * 3);
    } else if (components == 1) {
      for (JDIMENSION x = 0; x < width; ++x)
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = r->row[x];
    } else {
      // Pillow reads CMYK JPEG inverted (Adobe's convention, "CMYK;I"), then converts to RGB
      // as (255 - k) - c * (255 - k) / 255 per channel.
      for (JDIMENSION x = 0; x < width; ++x) {
        const uint8_t* cmyk = r->row + 4 * x;
        const int not_k = cmyk[3];  // 255 - (255 - stored k)
        for (int c = 0; c < 3; ++c)
          out[3 * x + c] = static_cast<uint8_t>(not_k - MulDiv255(255 - cmyk[c], not_k));
      }
    }
  }
  return true;
}

Status JpegError(const JpegRead& r) {
  if (r.truncated) return DataLoss("JPEG truncated");
  if (r.too_many_scans) {
    return InvalidArgument("JPEG has more than " + std::to_string(r.max_scans) +
                           " progressive scans");
  }
  return DataLoss(std::string("JPEG corrupt: ") + r.error);
}

// Frees libjpeg's memory however the decode ended.
struct JpegHandle {
  JpegRead* r;
  ~JpegHandle() {
    if (r->created) jpeg_destroy_decompress(&r->info);
  }
};

}  // namespace

Expected<Picture> DecodeJpeg(std::span<const uint8_t> bytes, const PictureLimits& limits) {
  JpegRead r;
  r.info.err = jpeg_std_error(&r.errors);
  r.errors.error_exit = OnError;
  r.errors.emit_message = OnMessage;
  r.progress.progress_monitor = OnProgress;
  r.max_scans = limits.max_jpeg_scans;
  r.max_memory = static_cast<long>(limits.max_decoded_bytes);
  JpegHandle handle{&r};
  if (!ReadJpegHeader(&r, bytes.data(), bytes.size())) return JpegError(r);

  // A picture in several scans keeps every coefficient (2 bytes each, up to 4 components at
  // full resolution) until the last one.
  const int64_t decoder_bytes = r.multiple_scans ? 8 : 0;
  GZ_RETURN_IF_ERROR(
      CheckPictureSize(r.info.image_width, r.info.image_height, decoder_bytes, limits)
          .Annotate("JPEG"));
  Picture picture;
  picture.width = static_cast<int>(r.info.image_width);
  picture.height = static_cast<int>(r.info.image_height);
  picture.rgb.resize(size_t{r.info.image_width} * r.info.image_height * 3);
  std::vector<uint8_t> row(size_t{r.info.image_width} * 4);
  r.rgb = picture.rgb.data();
  r.row = row.data();
  if (!ReadJpegRows(&r)) return JpegError(r);
  return picture;
}

}  // namespace gizllm::vision
