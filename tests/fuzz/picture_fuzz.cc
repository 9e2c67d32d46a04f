// Pictures: the input is a whole file (PNG, JPEG or WebP, its type sniffed), decoded under
// limits that keep one input within the fuzzer's memory bound, every byte of the RGB read, then
// the picture through the Qwen-VL image processor (any aspect ratio and size the decoder lets
// through, resized to at most 16384 pixels).
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "fuzz_input.h"
#include "vision/image_processor.h"
#include "vision/picture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gizllm::vision::PictureLimits limits;
  limits.max_pixels = int64_t{1} << 22;
  limits.max_decoded_bytes = int64_t{64} << 20;
  limits.max_jpeg_scans = 100;
  gizllm::Expected<gizllm::vision::Picture> picture =
      gizllm::vision::DecodePicture({data, size}, limits);
  if (!picture.ok()) {
    CHECK(!picture.status().message().empty());
    return 0;
  }
  CHECK(picture->width > 0 && picture->height > 0);
  CHECK(picture->rgb.size() == size_t(picture->width) * size_t(picture->height) * 3);
  size_t sum = 0;
  for (uint8_t v : picture->rgb) sum += v;
  gizllm::vision::ImageProcessorConfig config;
  config.patch_size = 16;
  config.min_pixels = 1024;
  config.max_pixels = 16384;
  config.image_mean = {0.5f, 0.5f, 0.5f};
  config.image_std = {0.5f, 0.5f, 0.5f};
  gizllm::Expected<gizllm::vision::PixelValues> values =
      gizllm::vision::PreprocessPicture(*picture, config);
  if (values.ok()) {
    CHECK(values->values.size() == size_t(values->patches * values->patch_dim));
    for (float v : values->values) CHECK(v >= -1.0f && v <= 1.0f);
    sum += values->values.size();
  }
  gizllm::fuzz::Use(sum);
  return 0;
}
