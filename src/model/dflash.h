// DFlash drafters (block diffusion drafts, z-lab's layout for Qwen3 models): a few Qwen3 decoder
// layers that read, besides their own rows, keys and values made from the target model's hidden
// states after some of its layers, and fill a block of mask tokens in one pass.
//
// A drafter folder: config.json (a Qwen3 config with architectures ["DFlashDraftModel"],
// block_size, dflash_config {mask_token_id, target_layer_ids}, num_target_layers) and
// model.safetensors (or shards) with fc.weight [dim, features * dim], hidden_norm.weight,
// norm.weight and layers.N.{input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj,
// self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}.weight; names may also start with "model.". It
// has no embedding and no head: it reads the target's (Runner::EmbedTokens, HeadLogits).
//
// The computation (z-lab's dflash/model.py):
//   context rows: c = hidden_norm(fc(concat of the target's hidden_states[id + 1], id in
//     target_layer_ids)); each layer's keys k_norm(k_proj(c)) and values v_proj(c), rotated at the
//     rows' positions, kept per sequence (the context grows with every kept row);
//   a draft: the block [newest token, mask x (block_size - 1)] at positions p .. p + block - 1,
//     embedded by the target; each layer: h += o_proj(attention(q_norm(q_proj(x)), keys and
//     values of the context then of the block's own rows k_norm(k_proj(x)), v_proj(x))) with
//     x = input_layernorm(h), no causal mask (every block row sees the whole block); h +=
//     mlp(post_attention_layernorm(h)); then norm(h) of rows 1 .. count through the target's head,
//     the largest logit (lowest id among equals) of row k the draft at position p + k.
// Everything in float32 on the host (matmuls over a thread pool), whatever the target's device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/block_drafter.h"
#include "model/runner.h"

namespace gizllm {

struct DFlashConfig {
  int dim = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  float eps = 1e-6f;
  double rope_theta = 10000.0;
  int32_t block_size = 0;
  int32_t mask_token = -1;
  std::vector<int> target_layer_ids;  // the target's layers whose outputs are read
  int num_target_layers = 0;
};

// config.json of a DFlash drafter, checked against the target `target` (dim, layers, vocab);
// errors name the file and the field.
Expected<DFlashConfig> ReadDFlashConfig(const std::string& dir, const Arch& target);

class DFlashDrafter : public BlockDrafter {
 public:
  // Loads the drafter in `dir` for `target` (which it embeds and runs the head of); `threads`
  // for its matmuls (0: one a core).
  static Expected<std::unique_ptr<DFlashDrafter>> Open(const std::string& dir, Runner* target,
                                                       int threads = 0);
  ~DFlashDrafter() override;

  const DFlashConfig& config() const { return config_; }
  int64_t Parameters() const;

  std::span<const int> FeatureLayers() const override { return feature_layers_; }
  int32_t MostDrafts() const override { return config_.block_size - 1; }
  std::unique_ptr<Context> NewContext() const override;
  Status Extend(Context& context, std::span<const int64_t> positions,
                const float* features) override;
  Status Draft(std::span<Context* const> contexts, std::span<const int32_t> last,
               std::span<const int64_t> positions, int32_t count, int32_t* tokens) override;
  // The logits of the last Draft's rows, [sequences * count, vocab] (row s * count + k: sequence
  // s's draft k), valid until the next Draft.
  std::span<const float> LastLogits() const { return scratch_[9]; }

 private:
  struct Layer;
  DFlashDrafter() = default;
  // y [n, rows(w)] = x [n, cols(w)] w^T.
  void Linear(const float* x, int64_t n, const std::vector<float>& w, int64_t out, int64_t in,
              float* y);
  void Rope(float* x, int64_t n, int heads, const int64_t* positions) const;

  DFlashConfig config_;
  Runner* target_ = nullptr;
  std::vector<int> feature_layers_;
  std::vector<float> fc_, hidden_norm_, norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<float> scratch_[10];  // Extend's and Draft's buffers, kept between calls
};

}  // namespace gizllm
