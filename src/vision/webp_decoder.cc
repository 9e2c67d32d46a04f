// WebP through libwebp's decoder (no callbacks, no jumps): the features first, then the
// pixels straight into the RGB buffer.
#include <webp/decode.h>

#include <string>

#include "vision/picture_decoders.h"

namespace gizllm::vision {
namespace {

Status WebpError(VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return DataLoss("WebP truncated");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return Unimplemented("WebP uses a feature libwebp does not support");
    case VP8_STATUS_OUT_OF_MEMORY:
      return ResourceExhausted("WebP: out of memory");
    default:
      return DataLoss("WebP corrupt (libwebp status " + std::to_string(static_cast<int>(code)) +
                      ")");
  }
}

}  // namespace

Expected<Picture> DecodeWebp(std::span<const uint8_t> bytes, const PictureLimits& limits) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return Internal("WebP: libwebp version mismatch");
  VP8StatusCode code = WebPGetFeatures(bytes.data(), bytes.size(), &config.input);
  if (code != VP8_STATUS_OK) return WebpError(code);
  if (config.input.has_animation) {
    return Unimplemented("animated WebP is not supported (give its frames as pictures)");
  }
  // A lossless picture is decoded whole into 32-bit ARGB before it is converted.
  GZ_RETURN_IF_ERROR(
      CheckPictureSize(config.input.width, config.input.height, 4, limits).Annotate("WebP"));
  Picture picture;
  picture.width = config.input.width;
  picture.height = config.input.height;
  picture.rgb.resize(size_t(picture.width) * picture.height * 3);
  // Pillow decodes to RGBA (not premultiplied) and convert("RGB") drops the alpha: the same
  // colors as libwebp's RGB output.
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = picture.rgb.data();
  config.output.u.RGBA.stride = picture.width * 3;
  config.output.u.RGBA.size = picture.rgb.size();
  code = WebPDecode(bytes.data(), bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);
  if (code != VP8_STATUS_OK) return WebpError(code);
  return picture;
}

}  // namespace gizllm::vision
