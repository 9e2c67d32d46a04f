// The decoders behind DecodePicture, one per format (png_decoder.cc, jpeg_decoder.cc,
// webp_decoder.cc). Each takes the whole file, checks the declared size with
// CheckPictureSize before it allocates, and returns RGB as picture.h describes.
#pragma once

#include <cstdint>
#include <span>

#include "vision/picture.h"

namespace gizllm::vision {

Expected<Picture> DecodePng(std::span<const uint8_t> bytes, const PictureLimits& limits);
Expected<Picture> DecodeJpeg(std::span<const uint8_t> bytes, const PictureLimits& limits);
Expected<Picture> DecodeWebp(std::span<const uint8_t> bytes, const PictureLimits& limits);

}  // namespace gizllm::vision
