// bitgpu model folders (bitgpu's FORMAT.md) read as the loader reads a Hugging Face folder.
//
// A folder holds manifest.json, a small aux file and the data file, an export's weights used
// unchanged (for a 1-bit GGUF, the .gguf itself). The manifest (version 1 or 2) gives the arch
// contract (a Qwen3-family model: act silu, head_dim <= 128, blocks of 128) and maps each tensor,
// by its logical name, to a ref {dtype, shape, src: "data" | "aux", off, len}; luts.tgt2 and
// luts.tgt4 are refs into the aux file. Tensors: f32 (norms), and binary (the layers' linears),
// q4 (embed_tokens) and q2 (lm_head), each either planar (an ONNX export's sign bytes [N, K/8],
// f32 scales [N, K/128] and zero points) or, in version 2, a "q1_0" container whose ref covers
// the tensor's GGUF Q1_0 blocks (18 bytes a block of 128: an f16 scale, 16 sign bytes LSB-first,
// bit 1 = +1). The lookup tables must be the 1-bit recipe's and the zero points its midpoints (2
// and 8), so that every weight is +-scale: a container loads as Q1_0 blocks (Format::kGgml, kept
// where the backend reads Q1_0, else float32), a planar linear or head as an unrotated q1 linear
// over its bytes in place (quant/layout.h), a planar embedding as float32. The checkpoint reads as
// a converted folder's (its metadata describes the linears, quant/linear_io.h). A planar lm_head
// has scales of its own, so the model's head is then untied. Baked rope tables without arch.rope,
// and YaRN, are refused by name.
//
// Every offset, length, shape and count is checked against the files before it is used (a ref's
// bytes lie inside its file and match its dtype and shape; refs share bytes only as the exact same
// range); errors name manifest.json and the field.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/arch.h"
#include "model/bitgpu_manifest.h"

namespace gizllm {

struct BitgpuModel {
  Arch arch;
  Checkpoint checkpoint;  // tensors under TensorName(arch, role, layer)
};

// Opens the folder's files and maps its tensors to the family's names; `keep` (may be empty:
// none) says whether Q1_0 stays in its blocks.
Expected<BitgpuModel> OpenBitgpuModel(const std::string& dir,
                                      const std::function<bool(GgmlType)>& keep = {});

}  // namespace gizllm
