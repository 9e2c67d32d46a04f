// A model family's recipe: how its config.json reads as an Arch and how its tensors are named.
// Internal to the model layer; others use model/config.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/arch.h"
#include "model/config.h"

namespace gizllm {

// Typed access to the fields of one JSON object of a config file; errors name the file and the
// field's path ("rope_scaling.factor"). A field that is present but null counts as absent.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string file, std::string prefix = "");

  bool Has(std::string_view field) const;
  const nlohmann::json* Get(std::string_view field) const;  // null when absent or null

  Expected<int64_t> Int(std::string_view field) const;  // required
  Expected<int64_t> Int(std::string_view field, int64_t fallback) const;
  Expected<double> Double(std::string_view field) const;  // required; an integer reads too
  Expected<double> Double(std::string_view field, double fallback) const;
  Expected<bool> Bool(std::string_view field, bool fallback) const;
  Expected<std::string> String(std::string_view field, std::string fallback) const;
  Expected<ConfigReader> Object(std::string_view field) const;  // required

  // "config.json: field \"rope_scaling.factor\": " + what.
  Status Error(StatusCode code, std::string_view field, const std::string& what) const;
  std::string Path(std::string_view field) const { return prefix_ + std::string(field); }
  const std::string& file() const { return file_; }
  const nlohmann::json& object() const { return *object_; }

 private:
  const nlohmann::json* object_;
  std::string file_;
  std::string prefix_;
};

// The defaults a family's configuration class gives to fields config.json leaves out.
struct FamilyDefaults {
  double rope_theta = 10000.0;
  int64_t context = 2048;              // max_position_embeddings
  double norm_eps = 1e-6;              // rms_norm_eps
  double partial_rotary_factor = 1.0;  // where config.json leaves it out (Qwen3-Next: 0.25)
  bool tied_head = false;              // tie_word_embeddings
  bool sliding_window_fields = false;  // use_sliding_window / max_window_layers (Qwen2, Qwen3)
  int64_t max_window_layers = 28;
  // Sizes a configuration class gives when config.json leaves them out (0: required).
  int64_t vocab = 0, dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

// Appends the token id (an integer) or ids (a list) of `field` to `ids`, skipping ids already
// there; null or absent adds nothing.
Status ReadTokenIds(const ConfigReader& config, std::string_view field, std::vector<int32_t>* ids);

// Reads what every Llama-like decoder shares: sizes, heads, head_dim, rope, norm eps, context,
// tied head, dtype, eos and bos ids; with `checks_layers`, also the layer types (all full
// attention) and hidden_act (silu), which a family with other layers reads itself.
Status ReadDecoder(const ConfigReader& config, const FamilyDefaults& defaults, Arch* arch,
                   bool checks_layers = true);

// Rotary frequencies from `config`'s rope fields: transformers 5's rope_parameters (flat, or the
// entry for `layer_type` when keyed by layer type) or the older rope_theta and rope_scaling.
Status ReadRope(const ConfigReader& config, double default_theta, int head_dim,
                std::string_view layer_type, Rope* rope, double default_partial = 1.0);

// Interleaved M-RoPE's rope_parameters.mrope_section (or rope_scaling's, as released Qwen3-VL
// configs write it) into rope->mrope_section when present: three section sizes (time, height,
// width) summing to at most the rotary frequencies. Call after ReadDecoder (rotary_dims set).
Status ReadMropeSection(const ConfigReader& config, Rope* rope);

// What a conditional-generation checkpoint (text_config inside config.json) keeps at the top:
// tie_word_embeddings where `text` leaves it out, the eos and bos ids; and its text tensors'
// prefixes (model.language_model., language_model.model.).
Status ReadConditionalTop(const ConfigReader& config, const ConfigReader& text, Arch* arch);

// Fields that change what a model computes. A recipe lists those it implements in `read`; any
// other one present with a value other than its neutral one (absent, null, false, 0 or 1 as the
// field means) is refused, naming it, rather than ignored.
Status RefuseUnimplemented(const ConfigReader& config, std::span<const std::string_view> read);

// What a configuration class of Qwen's mixtures of experts gives to fields config.json leaves out
// (num_experts, num_experts_per_tok, moe_intermediate_size), and what its recipe fixes.
struct MoeDefaults {
  int64_t experts = 0, experts_per_token = 0, ffn = 0;
  bool always_normalizes = false;  // the router renormalizes the top k (no norm_topk_prob)
  bool transposed_stacks = false;  // MoeSpec::transposed_stacks
};

// Qwen3-MoE's feed-forwards: a layer l is a mixture of experts when l is not in mlp_only_layers,
// num_experts (or num_local_experts) > 0 and (l + 1) % decoder_sparse_step == 0; the others stay
// dense. Call after UniformLayers().
Status ReadSparseFeedForwards(const ConfigReader& config, const MoeDefaults& defaults, Arch* arch);

// Names of Hugging Face's Llama-style checkpoints ("model.layers.N.self_attn.q_proj.weight",
// `prefix` "model.").
std::string HfDecoderTensorName(const std::string& prefix, TensorRole role, int layer);

struct Family {
  std::string_view name;          // Arch::family
  std::string_view model_type;    // config.json "model_type"
  std::string_view architecture;  // config.json "architectures"[0]
  // Reads config.json into `arch` (family, architecture already set), arch->layer included.
  Status (*read)(const ConfigReader& config, Arch* arch);
  std::string (*tensor_name)(const std::string& prefix, TensorRole role, int layer);
};

const Family& LlamaFamily();
const Family& Qwen2Family();
const Family& Qwen3Family();
const Family& Gemma2Family();      // gemma2, Gemma2ForCausalLM
const Family& Gemma3TextFamily();  // gemma3_text, Gemma3ForCausalLM
const Family& Gemma3Family();      // gemma3, Gemma3ForConditionalGeneration: its text model
const Family& Qwen3MoeFamily();    // qwen3_moe, Qwen3MoeForCausalLM
// Hybrids of recurrent (gated delta net) and gated attention layers (families/qwen3_next.cc).
const Family& Qwen3NextFamily();       // qwen3_next, Qwen3NextForCausalLM
const Family& Qwen3_5TextFamily();     // qwen3_5_text, Qwen3_5ForCausalLM
const Family& Qwen3_5Family();         // qwen3_5, Qwen3_5ForConditionalGeneration: its text model
const Family& Qwen3_5MoeTextFamily();  // qwen3_5_moe_text, Qwen3_5MoeForCausalLM
const Family& Qwen3_5MoeFamily();      // qwen3_5_moe, Qwen3_5MoeForConditionalGeneration
const Family& Qwen3VlFamily();         // qwen3_vl, Qwen3VLForConditionalGeneration: its text model
const Family& Qwen3VlMoeFamily();      // qwen3_vl_moe, Qwen3VLMoeForConditionalGeneration

}  // namespace gizllm
