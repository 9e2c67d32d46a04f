// Arch: what a model computes, as its family reads config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace gizllm {

enum class LayerKind : uint8_t { kAttention, kRecurrent };

// The most positions config.json may declare (max_position_embeddings): 2^24, beyond every
// released model (Llama 4 Scout: 10M). A larger value is a mistake, not a context to size for.
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

// Rotary embedding frequencies, as config.json's rope_type describes them.
struct Rope {
  std::string type = "default";  // "default", "llama3", "linear"
  double theta = 10000.0;
  int rotary_dims = 0;  // dims of each head that rotate (head_dim * partial_rotary_factor)
  // llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings.
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;
  // Interleaved M-RoPE (Qwen3-VL, Qwen3.5: rope_parameters.mrope_section): a row has three
  // positions (time, height, width) and frequency i rotates with the height position where
  // i % 3 == 1 and i < 3 * section[1], the width position where i % 3 == 2 and
  // i < 3 * section[2], else the time position. Empty: one position per row. A text row's three
  // positions are equal, so it rotates as the plain table does.
  std::vector<int> mrope_section;

  // inv_freq[i] for i in [0, rotary_dims / 2), exactly as transformers computes it.
  std::vector<float> InvFreq() const;
  // The axis (0 time, 1 height, 2 width) that rotates frequency i under mrope_section.
  int MropeAxis(int i) const;
  // InvFreq() with the frequencies of every other axis set to 0 (a rotation by angle 0 leaves
  // its pair as it is, exactly): three rotations by these tables, each with its axis'
  // positions, are the M-RoPE rotation.
  std::vector<float> MropeInvFreq(int axis) const;
};

// One attention layer: causal grouped-query attention over the layer's KV pages.
struct AttentionSpec {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int rope = 0;        // which of Arch::ropes rotates its queries and keys
  int32_t window = 0;  // sliding window: the positions a row sees, itself included (0: all)
  float scale = 0.0f;  // score = scale * q.k (1/sqrt(head_dim), Gemma: query_pre_attn_scalar^-1/2)
  float softcap = 0.0f;  // score = softcap * tanh(score / softcap) (0: off)
  bool qk_norm = false;  // per-head RMSNorm of q and k before the rotation (Qwen3, Gemma 3)
  // q_proj gives each head's query and then its gate, [heads, 2 * head_dim]; the attention's
  // output is multiplied by sigmoid(gate) before o_proj (Qwen3-Next, Qwen3.5).
  bool output_gate = false;
  bool qkv_bias = false;     // biases on q, k, v (Qwen2)
  bool output_bias = false;  // bias on o_proj (Llama attention_bias)

  int64_t QDim() const { return static_cast<int64_t>(heads) * head_dim; }
  int64_t KvDim() const { return static_cast<int64_t>(kv_heads) * head_dim; }
};

// One dense feed-forward: down(act(gate(x)) * up(x)).
struct FeedForwardSpec {
  int64_t ffn = 0;  // intermediate_size
  Activation act = Activation::kSilu;
  bool bias = false;  // biases on gate, up and down (Llama mlp_bias)
};

// A mixture-of-experts feed-forward (Qwen3-MoE): a router picks, for each row, the
// experts_per_token experts of the largest softmax(router(x)) (float32, the lowest index first
// among equals), their weights renormalized to sum to 1 when norm_topk_prob; the output is the
// weighted sum of those experts' down(silu(gate(x)) * up(x)).
struct MoeSpec {
  int experts = 0;            // num_experts
  int experts_per_token = 0;  // num_experts_per_tok
  int64_t ffn = 0;            // moe_intermediate_size: each expert's width
  bool norm_topk_prob = false;
  // A shared expert every row goes through beside the routed ones (Qwen3-Next, Qwen3.5-MoE):
  // its width (shared_expert_intermediate_size, 0: none), and whether its output is scaled by
  // sigmoid(shared_expert_gate(x)).
  int64_t shared_ffn = 0;
  bool shared_gate = false;
  // The stacked experts (kExpertsGateUp, kExpertsDown) may also be stored transposed, as
  // Qwen3-VL-MoE's released checkpoints hold them: gate_up_proj [experts, dim, 2 * ffn] and
  // down_proj [experts, ffn, dim]. A tensor of transformers 5's shape reads as it is, one of the
  // transposed shape transposed (transformers' own rule, so a shape both could be reads as is).
  bool transposed_stacks = false;
};

// One recurrent layer (Qwen3-Next's and Qwen3.5's gated delta net): q, k, v (and z, b, a)
// projections; a causal depthwise convolution of kernel taps with SiLU over q, k, v; q and k
// L2-normalized; the gated delta rule over a state [v_heads, k_dim, v_dim] per sequence (each
// key head shared by v_heads / k_heads value heads); the gated RMSNorm with silu(z); out_proj.
struct RecurrentSpec {
  int k_heads = 0;  // linear_num_key_heads
  int v_heads = 0;  // linear_num_value_heads
  int k_dim = 0;    // linear_key_head_dim
  int v_dim = 0;    // linear_value_head_dim
  int kernel = 0;   // linear_conv_kernel_dim
  // Qwen3-Next's fused in_proj_qkvz and in_proj_ba, grouped by key head; Qwen3.5's are four
  // linears (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
  bool fused_projections = false;

  int64_t KeyDim() const { return static_cast<int64_t>(k_heads) * k_dim; }
  int64_t ValueDim() const { return static_cast<int64_t>(v_heads) * v_dim; }
  // The convolution's channels: q, k and v of a row.
  int64_t ConvDim() const { return 2 * KeyDim() + ValueDim(); }
  // Floats of one sequence's state: the convolution's last kernel - 1 inputs and the delta
  // rule's matrices.
  int64_t StateFloats() const {
    return (kernel - 1) * ConvDim() + static_cast<int64_t>(v_heads) * k_dim * v_dim;
  }
  // Floats of one row's inputs to the state update: the convolution's input, b and a.
  int64_t RowInputFloats() const { return ConvDim() + 2 * static_cast<int64_t>(v_heads); }
};

// Which feed-forward a layer has.
enum class FeedForwardKind : uint8_t { kDense, kMoe };

// What one layer computes. Every layer is pre-norm: x += block(norm(x)); with post_norms
// (Gemma's four norms a layer) x += norm(block(norm(x))). The first block is attention
// (kAttention) or recurrent (kRecurrent), the second the feed-forward.
struct LayerSpec {
  LayerKind kind = LayerKind::kAttention;
  AttentionSpec attention;  // kAttention
  RecurrentSpec recurrent;  // kRecurrent
  FeedForwardKind feed_forward_kind = FeedForwardKind::kDense;
  FeedForwardSpec feed_forward;  // kDense
  MoeSpec moe;                   // kMoe
  bool post_norms = false;

  bool IsMoe() const { return feed_forward_kind == FeedForwardKind::kMoe; }
  bool IsRecurrent() const { return kind == LayerKind::kRecurrent; }
};

struct Arch {
  std::string family;        // "llama", "qwen2", "qwen3", "qwen3_moe", "gemma3", "qwen3_next"
  std::string architecture;  // config.json "architectures"[0]
  int64_t vocab = 0;
  int64_t dim = 0;  // hidden_size
  int layers = 0;
  // Each layer, as its family's recipe reads config.json: the forward pass and the KV cache are
  // built from these alone.
  std::vector<LayerSpec> layer;
  // The rotary tables the layers use (AttentionSpec::rope): one, or Gemma's global and local.
  std::vector<Rope> ropes;
  // The fields config.json gives once for every layer, that the recipe expands into `layer`
  // (`info` shows them): intermediate_size, heads, head_dim, and the first rope table.
  int64_t ffn = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  Rope rope;
  bool qk_norm = false;
  bool qkv_bias = false;
  bool output_bias = false;
  bool mlp_bias = false;
  double norm_eps = 1e-6;
  float norm_offset = 0.0f;    // every RMSNorm multiplies by (weight + offset); Gemma: 1
  float embed_scale = 1.0f;    // embeddings times this (Gemma: sqrt(hidden_size))
  float logit_softcap = 0.0f;  // logits = cap * tanh(logits / cap) (Gemma 2 style; 0: off)
  bool tied_head = false;      // head = embedding
  // Where the decoder's tensors are named, first match wins: "model." ("model.layers.0..."), or
  // none where the checkpoint is the bare decoder (a *Model class, as sentence-transformers
  // saves an embedder: "layers.0..."); a multimodal checkpoint's text model has other prefixes
  // (ResolveTensorPrefix picks).
  std::vector<std::string> prefixes = {"model.", ""};
  // Tensors the checkpoint holds beside the decoder that the forward pass does not run, loaded
  // or skipped as a whole by name prefix: the multi-token prediction layer ("mtp.", loaded and
  // run by Runner::MtpStep) and a vision tower (skipped).
  std::string mtp_prefix;                     // "" where the family has none
  std::vector<std::string> skipped_prefixes;  // e.g. "model.visual."
  int64_t context = 0;                        // max_position_embeddings
  std::vector<int32_t> eos;  // stop tokens from config, generation and tokenizer configs
  int32_t bos = -1;
  std::string torch_dtype;  // "bfloat16" ...

  int64_t QDim() const { return static_cast<int64_t>(heads) * head_dim; }
  int64_t KvDim() const { return static_cast<int64_t>(kv_heads) * head_dim; }
  // Every layer an attention layer with the shape, biases and norms of the fields above, rope 0,
  // no window; ropes = {rope}. A recipe calls it, then changes what differs per layer.
  void UniformLayers();
};

}  // namespace gizllm
