// Plain scalar references for every backend op: the ground truth the fast CPU kernels and the
// CUDA kernels are tested against. Written for clarity, not speed: sums in double, one element
// at a time, no threads. Each takes the same params struct as the op (see ops/backend.h) and
// host pointers.
#pragma once

#include <cstdint>

#include "ops/backend.h"
#include "ops/weight.h"

namespace gizllm {

// Element (row, col) of a plain-format weight (kF32, kF16, kBf16) as float32.
float ReferenceWeightAt(const Weight& w, int64_t row, int64_t col);

void ReferenceEmbed(const EmbedParams& p);
void ReferenceRmsNorm(const RmsNormParams& p);
// Plain-format weights only.
void ReferenceMatmul(const MatmulParams& p);
// Rotary angles as transformers computes them: float32 angle = float(position) * inv_freq[i],
// then float32 cos and sin; the optional per-head RMSNorm is computed in double.
void ReferenceRope(const RopeParams& p);
void ReferenceKvWrite(const KvWriteParams& p);
void ReferenceAttention(const AttentionParams& p);
void ReferenceGlu(const GluParams& p);
void ReferenceSoftcap(const SoftcapParams& p);
void ReferenceAdd(const AddParams& p);
void ReferenceGatherRows(const GatherRowsParams& p);
// Routing and experts in double, row by row (plain-format weights only).
void ReferenceMoeFeedForward(const MoeFeedForwardParams& p);
// The recurrent layers' ops in double; the gated delta rule row by row (the recurrence, never
// chunked), its state in double within a row.
void ReferenceCausalConv(const CausalConvParams& p);
void ReferenceL2Norm(const L2NormParams& p);
void ReferenceGatedDeltaRule(const GatedDeltaRuleParams& p);
void ReferenceGatedRmsNorm(const GatedRmsNormParams& p);
// The encoder ops in double.
void ReferenceLayerNorm(const LayerNormParams& p);
void ReferenceGelu(const GeluParams& p);
void ReferenceEncoderAttention(const EncoderAttentionParams& p);
void ReferenceMeanRows(const MeanRowsParams& p);

}  // namespace gizllm
