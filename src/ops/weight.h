// How a linear's matrix is stored, as the kernels read it.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace gizllm {

// Storage of one linear's matrix W [rows = outputs, cols = inputs].
enum class Format : uint8_t {
  kF32,   // plain float32, row-major
  kF16,   // plain float16, row-major
  kBf16,  // plain bfloat16, row-major (Bits 16)
  kQ8,    // int8 codes, one scale per output row and group of `group` inputs
  kQ4,    // 4-bit codes, one scale (and optional zero) per group
  kQ2,    // 2-bit codes, one scale (and zero) per group
  kQ1,    // signs, one scale per group
  kGgml,  // ggml's blocks as a GGUF file holds them (formats/ggml_blocks.h), row by row
};

std::string FormatName(Format f);
Format FormatOf(DType plain);  // F32/F16/BF16 -> kF32/kF16/kBf16
int FormatBits(Format f);      // 0 for kGgml (its bits depend on the block type)

// A linear's matrix on some device. Plain formats use `data` alone; quantized formats also
// use `scales` (and `zeros`), laid out as the quantized kernels define.
struct Weight {
  Format format = Format::kBf16;
  int64_t rows = 0;              // outputs
  int64_t cols = 0;              // inputs
  const void* data = nullptr;    // [rows, cols] for plain formats
  const void* scales = nullptr;  // quantized: per group scales
  const void* zeros = nullptr;   // quantized: per group zero points, or null
  int32_t group = 0;             // quantized: inputs per group (128)
  bool rotated = false;          // inputs were rotated by the block Hadamard transform
  uint64_t rotation_seed = 0;    // rotated: seed of the random signs (quant/hadamard.h)
  // How the backend that prepared this weight arranged data, scales and zeros: 0 as described
  // above (and in quant/layout.h); other values are that backend's own (kCpuVnniLayout).
  uint8_t layout = 0;
  // kGgml: the block type (a GgmlType, formats/gguf.h); data holds each row's blocks in turn.
  uint32_t ggml_type = 0;
  // A quantized or kGgml weight's values as bf16 [rows, cols] (rotated inputs where `rotated`),
  // kept beside it by a backend that multiplies many rows by them (CudaOptions::bf16_copies);
  // null when it decodes the weight for each product instead.
  const void* bf16 = nullptr;

  bool empty() const { return data == nullptr; }
  int64_t Bytes() const;  // bytes of data + scales + zeros
};

}  // namespace gizllm
