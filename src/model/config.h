// Arch from a Hugging Face model folder: config.json read by its family's recipe
// (model/families/), plus stop and start tokens from generation_config.json and
// tokenizer_config.json; and the names of each family's tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/arch.h"

namespace gizllm {

// Reads dir/config.json (or, where `dir` is a .gguf file, its metadata: ReadGgufArch), and
// generation_config.json and tokenizer_config.json when present (tokenizer.json too when a token
// named there must be resolved to its id). Arch::eos is the union, in this order and without
// repeats, of config.json eos_token_id, generation_config.json eos_token_id and
// tokenizer_config.json eos_token. Arch::bos is the first of config.json bos_token_id,
// generation_config.json bos_token_id, tokenizer_config.json bos_token that is set, or -1.
Expected<Arch> ReadArch(const std::string& dir);

// config.json alone; `file_for_errors` names it in error messages.
Expected<Arch> ParseArch(const nlohmann::json& config, const std::string& file_for_errors);

// The tensors of a decoder layer stack, by what they do.
enum class TensorRole {
  kEmbed,
  kFinalNorm,
  kHead,
  kAttnNorm,
  kAttnPostNorm,  // after attention (Gemma: post_attention_layernorm)
  kQ,
  kK,
  kV,
  kO,
  kQBias,
  kKBias,
  kVBias,
  kOBias,
  kQNorm,
  kKNorm,
  kFfnNorm,
  kFfnPostNorm,  // after the feed-forward (Gemma: post_feedforward_layernorm)
  kGate,
  kUp,
  kDown,
  kGateBias,
  kUpBias,
  kDownBias,
  // A mixture-of-experts layer (LayerSpec::IsMoe()): the router [experts, dim]; each expert's
  // gate, up [moe ffn, dim] and down [dim, moe ffn], one tensor per expert (ExpertTensorName);
  // or all experts' in two tensors (transformers 5's layout): gate and up stacked
  // [experts, 2 * moe ffn, dim] (gate rows first) and down [experts, dim, moe ffn].
  kRouter,
  kExpertGate,
  kExpertUp,
  kExpertDown,
  kExpertsGateUp,
  kExpertsDown,
  // A mixture-of-experts layer's shared expert (MoeSpec::shared_ffn): gate, up [shared ffn, dim],
  // down [dim, shared ffn]; its gate [1, dim] where MoeSpec::shared_gate.
  kSharedGate,
  kSharedUp,
  kSharedDown,
  kSharedExpertGate,
  // A recurrent layer (RecurrentSpec): Qwen3.5's in_proj_qkv [conv dim, dim], in_proj_z
  // [value dim, dim], in_proj_b and in_proj_a [v_heads, dim]; or Qwen3-Next's fused in_proj_qkvz
  // [2 key dim + 2 value dim, dim] and in_proj_ba [2 v_heads, dim], grouped by key head. Then
  // conv1d [conv dim, 1, kernel], A_log and dt_bias [v_heads], the gated norm [v_dim] (its
  // weight multiplies as it is, never + norm_offset), out_proj [dim, value dim].
  kRecurrentQkv,
  kRecurrentZ,
  kRecurrentB,
  kRecurrentA,
  kRecurrentQkvz,
  kRecurrentBa,
  kRecurrentConv,
  kRecurrentALog,
  kRecurrentDtBias,
  kRecurrentNorm,
  kRecurrentOut,
};

// The checkpoint's name of a tensor, e.g. "model.layers.3.self_attn.q_proj.weight", under the
// first of arch.prefixes. `layer` is ignored for kEmbed, kFinalNorm and kHead (pass -1). The name
// is given for every role; whether the tensor exists is what the layer's spec says (qk_norm,
// biases, post_norms; tied_head).
std::string TensorName(const Arch& arch, TensorRole role, int layer);

// The name of expert `expert`'s tensor of role kExpertGate, kExpertUp or kExpertDown in layer
// `layer` ("model.layers.3.mlp.experts.5.gate_proj.weight"). TensorName gives expert 0's.
std::string ExpertTensorName(const Arch& arch, TensorRole role, int layer, int expert);

// Whether any layer of `arch` is a mixture of experts; recurrent.
bool HasMoe(const Arch& arch);
bool HasRecurrent(const Arch& arch);

// The roles of the tensors layer `layer` holds under its spec (a mixture-of-experts layer:
// kRouter and the per-expert roles, each standing for every expert's tensor, or kExpertsGateUp
// and kExpertsDown in transformers 5's layout), and those outside the layers
// (embedding, final norm, head unless tied).
std::vector<TensorRole> LayerRoles(const Arch& arch, int layer);

// Makes arch.prefixes[0] the first prefix under which the checkpoint holds the embedding
// (`exists` says whether it holds a tensor name); an error naming the names tried if none.
Status ResolveTensorPrefix(Arch* arch, const std::function<bool(const std::string&)>& exists,
                           const std::string& where);

// The shape a tensor of `role` has in layer `layer` (-1 for kEmbed, kFinalNorm, kHead):
// [outputs, inputs] for the embedding, the head and the linears (one expert's for the expert
// roles), [n] for norms and biases, [experts, outputs, inputs] for kExpertsGateUp, kExpertsDown.
std::vector<int64_t> TensorShape(const Arch& arch, TensorRole role, int layer);

// The one shape check of every path that reads a checkpoint (load, convert): an error naming the
// file, the tensor, its shape and the expected one when they differ.
Status CheckTensorShape(const std::string& file, const std::string& name,
                        std::span<const int64_t> shape, std::span<const int64_t> expected);

}  // namespace gizllm
