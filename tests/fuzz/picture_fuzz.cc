// Pictures: the input is a whole file (PNG, JPEG or WebP, its type sniffed), decoded under
// limits that keep one input within the fuzzer's memory bound, then every byte of the RGB read.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "fuzz_input.h"
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
  gizllm::fuzz::Use(sum);
  return 0;
}
