// bitgpu model folders (bitgpu's FORMAT.md) read as the loader reads a Hugging Face folder.
//
// A folder holds manifest.json, a small aux file and the data file, an export's weights used
// unchanged (for a 1-bit GGUF, the .gguf itself). The manifest (version 1 or 2) gives the arch
// contract (a Qwen3-family model: act silu, head_dim <= 128, blocks of 128) and maps each tensor,
// by its logical name, to a ref {dtype, shape, src: "data" | "aux", off, len}; luts.tgt2 and
// luts.tgt4 are refs into the aux file. Tensors read here: f32 (norms), and binary (the layers'
// linears), q4 (embed_tokens) and q2 (lm_head) in a version-2 "q1_0" container, whose ref covers
// the tensor's GGUF Q1_0 blocks (18 bytes a block of 128: an f16 scale, 16 sign bytes LSB-first,
// bit 1 = +1). The lookup tables must be the 1-bit recipe's (their codes' midpoints, 2 and 8,
// make each weight +-scale), so a container's blocks are its values: they load as GGUF Q1_0
// weights (Format::kGgml), kept in their blocks where the backend reads Q1_0, else converted to
// float32. Planar tensors (the ONNX exports' separate sign bytes, scales and zero points) and
// baked rope tables without arch.rope are refused by name.
//
// Every offset, length, shape and count is checked against the files before it is used (a ref's
// bytes lie inside its file and match its dtype and shape; refs share bytes only as the exact same
// range); errors name manifest.json and the field.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/arch.h"

namespace gizllm {

inline constexpr char kBitgpuManifest[] = "manifest.json";

// Whether `dir` is a bitgpu folder: a folder with manifest.json and without config.json.
bool IsBitgpuFolder(const std::string& dir);

// bitgpu's lookup tables, from their defining property: tgt2 [256, 2] turns a byte's 8 sign bits
// (LSB first) into 2-bit codes, 1 for -1 and 3 for +1, four a byte from the low bits up; tgt4
// [256, 4] into 4-bit codes 7 and 9, two a byte.
std::array<uint8_t, 512> BitgpuTgt2();
std::array<uint8_t, 1024> BitgpuTgt4();

// The config.json fields of the manifest's arch contract, and the Arch they give.
Expected<nlohmann::json> ReadBitgpuConfig(const std::string& dir);
Expected<Arch> ReadBitgpuArch(const std::string& dir);

struct BitgpuModel {
  Arch arch;
  Checkpoint checkpoint;  // tensors under TensorName(arch, role, layer)
};

// Opens the folder's files and maps its tensors to the family's names; `keep` (may be empty:
// none) says whether Q1_0 stays in its blocks.
Expected<BitgpuModel> OpenBitgpuModel(const std::string& dir,
                                      const std::function<bool(GgmlType)>& keep = {});

}  // namespace gizllm
