// Arch: what a model computes, as its family reads config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gizllm {

enum class LayerKind : uint8_t { kAttention, kRecurrent };

// The most positions config.json may declare (max_position_embeddings): 2^24, beyond every
// released model (Llama 4 Scout: 10M). A larger value is a mistake, not a context to size for.
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

// Rotary embedding frequencies, as config.json's rope_type describes them.
struct Rope {
  std::string type = "default";  // "default", "llama3", "linear"
  double theta = 10000.0;
  int rotary_dims = 0;           // dims of each head that rotate (head_dim * partial_rotary_factor)
  // llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings.
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;

  // inv_freq[i] for i in [0, rotary_dims / 2), exactly as transformers computes it.
  std::vector<float> InvFreq() const;
};

struct Arch {
  std::string family;   // "llama", "qwen2", "qwen3"
  std::string architecture;  // config.json "architectures"[0]
  int64_t vocab = 0;
  int64_t dim = 0;      // hidden_size
  int64_t ffn = 0;      // intermediate_size
  int layers = 0;
  std::vector<LayerKind> kinds;  // per layer
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  Rope rope;
  double norm_eps = 1e-6;
  bool qk_norm = false;        // per-head RMSNorm of q and k (Qwen3)
  bool qkv_bias = false;       // biases on q, k, v (Qwen2)
  bool output_bias = false;    // bias on o_proj (Llama attention_bias)
  bool mlp_bias = false;
  bool tied_head = false;      // head = embedding
  int64_t context = 0;         // max_position_embeddings
  std::vector<int32_t> eos;    // stop tokens from config, generation and tokenizer configs
  int32_t bos = -1;
  std::string torch_dtype;     // "bfloat16" ...

  int64_t QDim() const { return static_cast<int64_t>(heads) * head_dim; }
  int64_t KvDim() const { return static_cast<int64_t>(kv_heads) * head_dim; }
};

}  // namespace gizllm
