// convert: a Hugging Face model folder, or a GGUF file, into this project's format, once. Every
// linear is stored in the format its bits name (quant/layout.h; 16 bits: bf16, unrotated), the
// norms and other vectors as f32, the embedding as its source holds it; the source's config,
// tokenizer, template, generation and image/video processor files are copied beside it. A vision
// tower's tensors (Arch::skipped_prefixes) are written unchanged to their own file,
// kVisionTowerFile (model/vision_arch.h), which VisionTower::Load reads.
//
// A GGUF file (llama, qwen2, qwen3; model/gguf_model.h) is read as the loader reads it (Llama's
// q/k rows put back in Hugging Face's order). With `keep_types` every matrix keeps its block type
// (ggml blocks as the file holds them, quant/linear_io.h; F32, F16, BF16 as they are); else the
// linears are quantized to `bits` from their dequantized values and the embedding keeps its
// block type. config.json, tokenizer.json and tokenizer_config.json (bos, eos and the chat
// templates) are written from the file's metadata, so the folder runs alone. With `manifest` a
// Q1_0 qwen3 file becomes a bitgpu folder instead: manifest.json (version 2, q1_0 containers),
// the aux file with the tgt2 and tgt4 tables, the file itself as the data file, unchanged, and
// tokenizer.json and tokenizer_config.json.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "jobs/calibrate.h"
#include "ops/backend.h"
#include "ops/weight.h"
#include "quant/gptq.h"
#include "quant/hadamard.h"

namespace gizllm::quant {

// Bits of the layers' linears and of the head: 16, 8, 4, 2 or 1.
struct Bits {
  int layers = 16;
  int head = 16;
  // "b4" / "b8": the 4- and 8-bit linears in gizllm's blocks GZ4 and GZ8 (formats/ggml_blocks.h:
  // an 8-bit scale a group of 32 under an f16 scale a block of 128, GZ4's codes a Gaussian's
  // levels; not rotated), each layer's v_proj at 8 bits when the layers are at 4 (in a model with
  // routed experts also k_proj, the attention and recurrent output projections and the shared
  // expert's down projection); rows of 32 or 64 inputs in GZ4S or Q8_0 (blocks of 32).
  bool blocks = false;
};

// "4" (head too) or "4/8" (layers/head); "b4/b8", "b8", "b4/16": gizllm's blocks.
Expected<Bits> ParseBits(const std::string& text);
std::string BitsString(const Bits& bits);
Format BitsFormat(int bits);  // 16 -> kBf16, 8 -> kQ8, 4 -> kQ4, 2 -> kQ2, 1 -> kQ1

struct ConvertOptions {
  std::string from;  // Hugging Face folder or GGUF file
  std::string to;    // output folder; must not exist
  Bits bits;
  bool keep_types = false;  // a GGUF file only: keep every matrix's block type (no `bits`)
  // A Q1_0 GGUF file (qwen3) only, with keep_types: write a bitgpu folder (model/bitgpu_model.h)
  // instead of the own format.
  bool manifest = false;
  bool rotate = true;  // the block Hadamard rotation before quantizing
  bool zeros = true;   // q4 and q2 with a zero per group
  int layers = -1;     // keep only the first N layers, without final norm and head
  std::string lora;    // PEFT adapter folder to merge first, or empty
  uint64_t seed = kDefaultRotationSeed;
  ThreadPool* pool = nullptr;  // quantizes on it when given
  // GPTQ on calibration (jobs/calibrate.h): every quantized linear is quantized on the inputs the
  // model computes for the calibration text (calibration.file, or the model's own text when
  // empty), instead of rounded to nearest. Runs the model on `backend` (the CPU backend).
  bool calibrate = false;
  CalibrationOptions calibration;
  GptqOptions gptq;
  std::shared_ptr<Backend> backend;
  // Called as calibration starts each of its stages, with what it does.
  std::function<void(const std::string& stage)> stage;
  // Called after each tensor: done of total, the tensor's name.
  std::function<void(int64_t done, int64_t total, const std::string& tensor)> progress;
  Status Check() const;
};

struct ConvertSummary {
  int64_t tensors = 0;        // tensors written
  int64_t tower_tensors = 0;  // of them, a vision tower's, in kVisionTowerFile
  int64_t quantized = 0;      // linears stored quantized
  int64_t narrow_blocks = 0;  // --bits bN: linears of columns that are not blocks of 128, in
                              // blocks of 32 (Q8_0 at 8 bits, GZ4S at 4)
  int64_t kept_bf16 = 0;      // linears meant for fewer bits kept bf16 (columns not a multiple
                              // of 128)
  int64_t lora_merged = 0;    // linears an adapter changed
  int64_t calibrated = 0;     // linears quantized by GPTQ on calibration
  int64_t bytes = 0;          // bytes of every file written
  // A GGUF source: matrices kept in their ggml blocks, by block type ("Q4_0": 57).
  std::map<std::string, int64_t> block_types;
  bool tokenizer = true;  // a GGUF source without tokenizer.ggml.* metadata has none
};

// Writes options.to + ".partial" and renames it to options.to when complete, so that a stopped
// conversion never leaves a folder that loads.
Expected<ConvertSummary> Convert(const ConvertOptions& options);

}  // namespace gizllm::quant
