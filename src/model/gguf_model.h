// A GGUF file read as the loader reads a Hugging Face folder: the Arch from its metadata (the
// family's recipe reads the fields config.json would hold) and a Checkpoint of its tensors under
// the family's names, so that everything after the load is the same for both.
//
// Tensors in F32, F16 and BF16 are read in place. Matrices (the embedding, the linears, the head)
// in a block type the backend reads (`keep`) stay in their blocks (TensorInfo::ggml_type); the
// other block types of formats/ggml_blocks.h are dequantized to F32 at load (exact; a one-line
// notice a type says so); the rest are refused, naming the tensor and type.
// llama.cpp's converter interleaves the two rotary halves of each Llama q and k head
// (LlamaModel.permute); the loader puts the rows back in Hugging Face's order.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/arch.h"

namespace gizllm {

// Whether `path` names a GGUF file: a name that ends in ".gguf" and is not a folder (a missing
// file is then reported as such, not as a folder without config.json).
bool IsGgufPath(const std::string& path);

// The config.json a Hugging Face folder of the same model holds, as far as the family's recipe
// reads it: the <arch>.* keys under config.json's names (general.architecture llama, qwen2 or
// qwen3), the rope scaling rope_freqs.weight stands for, and the stop and start tokens from
// tokenizer.ggml.*. Errors name the file and the key.
Expected<nlohmann::json> ReadGgufConfig(const GgufFile& file);

// The Arch of ReadGgufConfig's fields.
Expected<Arch> ReadGgufArch(const GgufFile& file);

struct GgufModel {
  Arch arch;
  Checkpoint checkpoint;  // tensors under TensorName(arch, role, layer)
};

// Opens `path` and maps its tensors to the family's names; `keep` (may be empty: none) says which
// block types stay as they are.
Expected<GgufModel> OpenGgufModel(const std::string& path,
                                  const std::function<bool(GgmlType)>& keep = {});

}  // namespace gizllm
