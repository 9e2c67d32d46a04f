// Sniffing the type and dispatching to its decoder; the size check all decoders share.
#include "vision/picture.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "vision/picture_decoders.h"

namespace gizllm::vision {

const char* PictureTypeName(PictureType type) {
  switch (type) {
    case PictureType::kPng:
      return "PNG";
    case PictureType::kJpeg:
      return "JPEG";
    case PictureType::kWebp:
      return "WebP";
  }
  return "?";
}

std::optional<PictureType> SniffPictureType(std::span<const uint8_t> b) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() >= 8 && std::equal(kPng, kPng + 8, b.begin())) return PictureType::kPng;
  // SOI, then the first marker's 0xFF.
  if (b.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return PictureType::kJpeg;
  if (b.size() >= 12 && b[0] == 'R' && b[1] == 'I' && b[2] == 'F' && b[3] == 'F' && b[8] == 'W' &&
      b[9] == 'E' && b[10] == 'B' && b[11] == 'P') {
    return PictureType::kWebp;
  }
  return std::nullopt;
}

Status PictureLimits::Check() const {
  // Sizes are multiplied by up to 11 bytes a pixel in 64 bits.
  constexpr int64_t kMost = int64_t{1} << 40;
  if (max_pixels <= 0 || max_pixels > kMost) {
    return InvalidArgument("picture limits: max_pixels must be in 1.." + std::to_string(kMost));
  }
  if (max_decoded_bytes <= 0) {
    return InvalidArgument("picture limits: max_decoded_bytes must be positive");
  }
  if (max_jpeg_scans <= 0)
    return InvalidArgument("picture limits: max_jpeg_scans must be positive");
  return Status::Ok();
}

Status CheckPictureSize(int64_t width, int64_t height, int64_t bytes_per_pixel,
                        const PictureLimits& limits) {
  const std::string size = std::to_string(width) + "x" + std::to_string(height);
  if (width <= 0 || height <= 0) return DataLoss("picture is " + size + ", which is empty");
  // Each side is at most 2^31 in every format read here, so the products fit in 64 bits.
  const int64_t pixels = width * height;
  if (pixels > limits.max_pixels) {
    return InvalidArgument("picture is " + size + ", over the limit of " +
                           std::to_string(limits.max_pixels) + " pixels");
  }
  const int64_t bytes = pixels * (3 + bytes_per_pixel);
  if (bytes > limits.max_decoded_bytes) {
    return InvalidArgument("picture is " + size + " and needs " + std::to_string(bytes) +
                           " bytes to decode, over the limit of " +
                           std::to_string(limits.max_decoded_bytes));
  }
  return Status::Ok();
}

Expected<Picture> DecodePicture(std::span<const uint8_t> bytes, const PictureLimits& limits) {
  GZ_RETURN_IF_ERROR(limits.Check());
  if (bytes.empty()) return InvalidArgument("picture is empty (0 bytes)");
  const std::optional<PictureType> type = SniffPictureType(bytes);
  if (!type) {
    std::string start;
    for (size_t i = 0; i < bytes.size() && i < 4; ++i) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "%s%02x", i ? " " : "", bytes[i]);
      start += hex;
    }
    return InvalidArgument("not a PNG, JPEG or WebP picture (it starts with bytes " + start + ")");
  }
  switch (*type) {
    case PictureType::kPng:
      return DecodePng(bytes, limits);
    case PictureType::kJpeg:
      return DecodeJpeg(bytes, limits);
    case PictureType::kWebp:
      return DecodeWebp(bytes, limits);
  }
  return Internal("unknown picture type");
}

}  // namespace gizllm::vision
