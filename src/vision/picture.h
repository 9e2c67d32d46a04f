// Pictures from bytes: PNG, JPEG and WebP decoded to 8-bit RGB, as Pillow's
// Image.open(bytes).convert("RGB") gives them (what the Hugging Face processors read).
//
// What comes in is outside input (a request's data: URL, a file a user names): the type is
// sniffed from the first bytes, never from a name; the declared size is checked against
// `PictureLimits` before anything is allocated; truncated or corrupt data is an error Status
// that names the format and what is wrong, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gizllm::vision {

enum class PictureType { kPng, kJpeg, kWebp };

// "PNG", "JPEG", "WebP".
const char* PictureTypeName(PictureType type);

// The type the magic bytes say, or nullopt when they are none of the three.
std::optional<PictureType> SniffPictureType(std::span<const uint8_t> bytes);

// What one picture may cost. The defaults take any photograph a camera or phone makes
// (8192 x 8192) and refuse the small files that declare a picture of gigabytes.
struct PictureLimits {
  int64_t max_pixels = int64_t{8192} * 8192;  // width * height
  // Bytes the decoder may hold at once: the RGB result plus the decoder's own full-size
  // buffer (16-bit and alpha channels before they are dropped).
  int64_t max_decoded_bytes = int64_t{1} << 30;
  // Progressive JPEG scans: each one is a pass over the whole picture, so a small file of
  // thousands of empty scans costs minutes (libjpeg-turbo's advice is to bound them).
  int max_jpeg_scans = 1000;

  Status Check() const;
};

// A decoded picture: 8-bit RGB, rows top to bottom.
struct Picture {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};

// Decodes PNG, JPEG or WebP to RGB the way Pillow's convert("RGB") does: alpha dropped (not
// composited), grayscale repeated in R, G and B, palettes looked up, 16-bit samples cut to
// their high byte (16-bit grayscale is clipped to 255, as Pillow's I;16 to RGB does), CMYK
// JPEG converted with Pillow's formula, EXIF orientation not applied. The first frame of an
// animated PNG; animated WebP is refused. Errors name the format and the fault ("PNG
// truncated", "picture is 40000x40000, over the limit of 67108864 pixels"); callers prefix
// which picture it was (Status::Annotate).
Expected<Picture> DecodePicture(std::span<const uint8_t> bytes, const PictureLimits& limits = {});

// The size check every decoder makes once the header is read, before it allocates:
// `bytes_per_pixel` is what its full-size buffer holds per pixel besides the RGB result.
Status CheckPictureSize(int64_t width, int64_t height, int64_t bytes_per_pixel,
                        const PictureLimits& limits);

}  // namespace gizllm::vision
