// Which file of a bitgpu model folder (model/bitgpu_model.h) holds its tokenizer: a folder made
// from a 1-bit GGUF file keeps that file, unchanged, as its data file, and with it the
// tokenizer.ggml.* metadata and the chat template, which the tokenizer and template loaders read
// where the folder has no tokenizer.json or tokenizer_config.json of its own.
#pragma once

#include <string>

namespace gizllm {

// The path of the GGUF file that `dir`'s manifest.json names as its data file ("data_file", a
// plain file name ending in .gguf), or "" where `dir` has no manifest.json, it cannot be read, or
// its data file is not named so (the caller then reports its own missing file).
std::string BitgpuGgufDataFile(const std::string& dir);

}  // namespace gizllm
