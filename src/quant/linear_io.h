// Linears of converted checkpoints: how convert names and describes them, and how a loader reads
// one back as a host Weight.
//
// A quantized linear "<name>" (e.g. "model.layers.0.mlp.up_proj.weight") is stored as
//   <name>          U8  [rows, cols / 128 * GroupBytes(format)]   codes (quant/layout.h)
//   <name>.scales   F32 [rows, cols / 128]
//   <name>.zeros    F32 [rows, cols / 128]                        when the format has zeros
// and described in the file's metadata under "gizllm.linear:<name>" by a JSON object
//   {"format": "q4", "rows": R, "cols": C, "group": 128, "rotated": true}.
// The rotation seed of all linears is the metadata "gizllm.rotation_seed" (decimal). Plain
// linears (BF16, F16, F32 [rows, cols]) have no description.
//
// A matrix kept in a GGUF file's ggml blocks (convert from a GGUF file without --bits; the
// embedding too) is stored as the file holds it,
//   <name>          U8  [rows, cols / block elements * block bytes]   each row's blocks in turn
// and described by {"format": "ggml", "type": "Q4_0", "rows": R, "cols": C} (the type as
// GgmlTypeName writes it; one of formats/ggml_blocks.h's CanDequantize types).
#pragma once

#include <string>

#include "core/status.h"
#include "formats/safetensors.h"
#include "ops/weight.h"

namespace gizllm::quant {

inline constexpr char kFormatVersionKey[] = "gizllm.format_version";  // "1"
inline constexpr char kFormatVersion[] = "1";
inline constexpr char kBitsKey[] = "gizllm.bits";  // "4/8": layers/head
inline constexpr char kRotationSeedKey[] = "gizllm.rotation_seed";
inline constexpr char kLayersKey[] = "gizllm.layers";  // present in cut models
inline constexpr char kLinearKeyPrefix[] = "gizllm.linear:";
inline constexpr char kScalesSuffix[] = ".scales";
inline constexpr char kZerosSuffix[] = ".zeros";

// Format from its name ("bf16", "q8", "q4", "q2", "q1", "f16", "f32").
Expected<Format> ParseFormat(const std::string& name);

// The linear `weight_name` of a checkpoint as a host Weight: a plain matrix (BF16/F16/F32, 2-D)
// or a quantized one (or ggml blocks, Format::kGgml) described in the metadata. Pointers go into
// the mapped file (valid while `ckpt` lives). Errors name the file and tensor: missing tensors, bad
// shapes or dtypes, a description that does not match the tensors.
Expected<Weight> ReadLinear(const Checkpoint& ckpt, const std::string& weight_name);

// The description of a matrix of `rows` x `cols` kept in ggml's blocks of `ggml_type`.
std::string GgmlLinearDescription(uint32_t ggml_type, int64_t rows, int64_t cols);

}  // namespace gizllm::quant
