// Quantizers of gizllm's own block types GZ8 and GZ4 (formats/ggml_blocks.h: 128 inputs a block,
// an f16 scale d and four 8-bit scales s[g], one a group of 32).
//
// Each group of 32 first gets the scale that fits it best on its own: among 33 candidates around
// max |x| / 127 (steps of 2%), each also refit by least squares to the codes it gives, the one of
// least squared error. d is then the largest of the four (rounded up to an f16), and each group's
// s[g] the one within 2 of 255 + 32 log2(scale / d) whose codes, the nearest level of each value
// at scale d * kGzScales[s[g]], give the least squared error. A group of zeros gets s[g] = 0.
// (Factors 2^((s - 255) / 32) rather than multiples s * d / 255: a group far below the block's
// largest keeps steps of 2.2%; on the shipped tiny hybrid, whose weights have outliers, 8-bit
// codes lost 3.6x less (KL) with them.)
// GZ8 codes are the integers -127..127; GZ4 codes index kGz4Levels (a Gaussian's Lloyd-Max
// levels, so that 4-bit codes fit weights that are close to normal in each group).
// GZ4S (a block of 32 with only an f16 scale, for rows of 32 or 64 inputs) takes its group's best
// scale the same way, rounded to the f16 (or a neighbour) whose codes give the least error.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"

namespace gizllm::quant {

// One block of `type` (kGZ8 or kGZ4: x [128]; kGZ4S: x [32]) into out [GgmlBlockOf(type).bytes].
void QuantizeOwnBlock(GgmlType type, const float* x, uint8_t* out);

// W [rows, cols] as rows of blocks of `type`, rows split over `pool` when given: kGZ8 or kGZ4
// (cols a multiple of 128), kGZ4S or kQ8_0 (cols a multiple of 32; Q8_0 by ggml's reference
// quantizer; both for rows GZ8 and GZ4 do not fit). Errors name the type (another one) or the
// shape.
Expected<std::vector<uint8_t>> QuantizeOwnBlocks(GgmlType type, const float* w, int64_t rows,
                                                 int64_t cols, ThreadPool* pool = nullptr);

}  // namespace gizllm::quant
