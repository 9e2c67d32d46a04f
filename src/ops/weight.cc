#include "ops/weight.h"

#include "formats/gguf.h"

namespace gizllm {

std::string FormatName(Format f) {
  switch (f) {
    case Format::kF32:
      return "f32";
    case Format::kF16:
      return "f16";
    case Format::kBf16:
      return "bf16";
    case Format::kQ8:
      return "q8";
    case Format::kQ4:
      return "q4";
    case Format::kQ2:
      return "q2";
    case Format::kQ1:
      return "q1";
    case Format::kGgml:
      return "ggml";
  }
  return "?";
}

Format FormatOf(DType plain) {
  switch (plain) {
    case DType::kF32:
      return Format::kF32;
    case DType::kF16:
      return Format::kF16;
    default:
      return Format::kBf16;
  }
}

int FormatBits(Format f) {
  switch (f) {
    case Format::kF32:
      return 32;
    case Format::kF16:
      return 16;
    case Format::kBf16:
      return 16;
    case Format::kQ8:
      return 8;
    case Format::kQ4:
      return 4;
    case Format::kQ2:
      return 2;
    case Format::kQ1:
      return 1;
    case Format::kGgml:
      return 0;
  }
  return 0;
}

int64_t Weight::Bytes() const {
  int64_t n = rows * cols;
  if (format == Format::kGgml) {
    GgmlBlock block;
    if (!GgmlBlockOf(static_cast<GgmlType>(ggml_type), &block)) return 0;
    return n / block.elements * block.bytes;
  }
  int64_t bytes = n * FormatBits(format) / 8;
  if (group > 0) {
    int64_t groups = rows * ((cols + group - 1) / group);
    if (scales) bytes += groups * 4;
    if (zeros) bytes += groups * 4;
  }
  return bytes;
}

}  // namespace gizllm
