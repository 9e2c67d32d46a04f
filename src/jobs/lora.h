// PEFT LoRA adapters, merged into a model's linears before they are quantized:
// W' = W + scale * B A, scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/safetensors.h"

namespace gizllm::quant {

// A tensor of any float dtype (F32, BF16, F16), or a GGUF matrix kept in ggml's blocks
// (TensorInfo::ggml_type), as float32.
Expected<std::vector<float>> ReadFloats(const TensorInfo& t);
// The same into `out` [t.Elements()], split over `pool` where given (a large tensor's reading is
// otherwise the serial part of a conversion on many cores).
Status ReadFloatsInto(const TensorInfo& t, float* out, ThreadPool* pool = nullptr);

class LoraAdapter {
 public:
  // Reads dir/adapter_config.json (r, lora_alpha, use_rslora, target_modules) and
  // dir/adapter_model.safetensors (base_model.model.<module>.lora_A.weight [r, in] and
  // .lora_B.weight [out, r]).
  static Expected<LoraAdapter> Open(const std::string& dir);

  double scale() const { return scale_; }
  int rank() const { return rank_; }
  // Names of the base weights the adapter changes, e.g. "model.layers.0.self_attn.q_proj.weight".
  std::set<std::string> Targets() const;

  // w [rows, cols] += scale * B A when the adapter changes `weight_name`; returns whether it did.
  Expected<bool> Merge(const std::string& weight_name, float* w, int64_t rows, int64_t cols) const;

 private:
  struct Pair {
    const TensorInfo* a = nullptr;  // [r, cols]
    const TensorInfo* b = nullptr;  // [rows, r]
  };
  std::string dir_;
  int rank_ = 0;
  double scale_ = 1.0;
  std::unique_ptr<SafetensorsFile> file_;
  std::map<std::string, Pair> pairs_;  // base weight name -> its A and B
};

}  // namespace gizllm::quant
