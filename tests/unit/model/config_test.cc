#include "model/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/safetensors.h"
#include "model/bitgpu_manifest.h"
#include "model/vision_arch.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("gizllm_config_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void Write(const std::string& name, const json& j) const {
    std::ofstream(path_ / name) << j.dump(2);
  }

 private:
  fs::path path_;
};

// Llama-3.1-8B's config.json.
json Llama31Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5-0.5B-Instruct's config.json: top-level rope_theta, sliding window fields present but off.
json Qwen25Config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

// Expects an error of `code` whose message names each of `parts`.
void ExpectError(const Expected<Arch>& arch, StatusCode code, std::vector<std::string> parts) {
  ASSERT_FALSE(arch.ok());
  EXPECT_EQ(arch.status().code(), code) << arch.status().message();
  for (const std::string& p : parts) {
    EXPECT_NE(arch.status().message().find(p), std::string::npos)
        << "\"" << arch.status().message() << "\" does not name " << p;
  }
  EXPECT_EQ(arch.status().message().find('\n'), std::string::npos);
}

TEST(ConfigTest, TinyChat) {
  auto arch = ReadArch("models/tiny-chat");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3");
  EXPECT_EQ(arch->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(arch->vocab, 8192);
  EXPECT_EQ(arch->dim, 384);
  EXPECT_EQ(arch->ffn, 1152);
  EXPECT_EQ(arch->layers, 8);
  ASSERT_EQ(arch->layer.size(), 8u);
  for (const LayerSpec& l : arch->layer) EXPECT_EQ(l.kind, LayerKind::kAttention);
  EXPECT_EQ(arch->heads, 6);
  EXPECT_EQ(arch->kv_heads, 2);
  EXPECT_EQ(arch->head_dim, 64);
  EXPECT_EQ(arch->rope.type, "default");
  EXPECT_EQ(arch->rope.theta, 10000.0);
  EXPECT_EQ(arch->rope.rotary_dims, 64);
  EXPECT_EQ(arch->norm_eps, 1e-6);
  EXPECT_TRUE(arch->qk_norm);
  EXPECT_FALSE(arch->qkv_bias);
  EXPECT_FALSE(arch->output_bias);
  EXPECT_FALSE(arch->mlp_bias);
  EXPECT_TRUE(arch->tied_head);
  EXPECT_EQ(arch->context, 2048);
  EXPECT_EQ(arch->eos, std::vector<int32_t>{2});
  EXPECT_EQ(arch->bos, -1);
  EXPECT_EQ(arch->torch_dtype, "bfloat16");
}

// Name -> shape of every tensor the Arch says its checkpoint holds.
std::map<std::string, std::vector<int64_t>> ExpectedTensors(const Arch& a) {
  std::map<std::string, std::vector<int64_t>> t;
  const int64_t qd = a.QDim(), kvd = a.KvDim();
  t[TensorName(a, TensorRole::kEmbed, -1)] = {a.vocab, a.dim};
  t[TensorName(a, TensorRole::kFinalNorm, -1)] = {a.dim};
  if (!a.tied_head) t[TensorName(a, TensorRole::kHead, -1)] = {a.vocab, a.dim};
  for (int l = 0; l < a.layers; ++l) {
    t[TensorName(a, TensorRole::kAttnNorm, l)] = {a.dim};
    t[TensorName(a, TensorRole::kQ, l)] = {qd, a.dim};
    t[TensorName(a, TensorRole::kK, l)] = {kvd, a.dim};
    t[TensorName(a, TensorRole::kV, l)] = {kvd, a.dim};
    t[TensorName(a, TensorRole::kO, l)] = {a.dim, qd};
    if (a.qkv_bias) {
      t[TensorName(a, TensorRole::kQBias, l)] = {qd};
      t[TensorName(a, TensorRole::kKBias, l)] = {kvd};
      t[TensorName(a, TensorRole::kVBias, l)] = {kvd};
    }
    if (a.output_bias) t[TensorName(a, TensorRole::kOBias, l)] = {a.dim};
    if (a.qk_norm) {
      t[TensorName(a, TensorRole::kQNorm, l)] = {a.head_dim};
      t[TensorName(a, TensorRole::kKNorm, l)] = {a.head_dim};
    }
    t[TensorName(a, TensorRole::kFfnNorm, l)] = {a.dim};
    t[TensorName(a, TensorRole::kGate, l)] = {a.ffn, a.dim};
    t[TensorName(a, TensorRole::kUp, l)] = {a.ffn, a.dim};
    t[TensorName(a, TensorRole::kDown, l)] = {a.dim, a.ffn};
    if (a.mlp_bias) {
      t[TensorName(a, TensorRole::kGateBias, l)] = {a.ffn};
      t[TensorName(a, TensorRole::kUpBias, l)] = {a.ffn};
      t[TensorName(a, TensorRole::kDownBias, l)] = {a.dim};
    }
  }
  return t;
}

// The tensors transformers saved for each family are exactly those the Arch names, with the
// shapes it implies: the families' flags (biases, q/k norms, tied head) match transformers'.
TEST(ConfigTest, TensorNamesMatchCheckpoints) {
  for (const char* dir : {"models/tiny-chat", "tests/golden/models/llama",
                          "tests/golden/models/qwen2", "tests/golden/models/qwen3"}) {
    SCOPED_TRACE(dir);
    auto arch = ReadArch(dir);
    ASSERT_TRUE(arch.ok()) << arch.status().message();
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    std::map<std::string, std::vector<int64_t>> present;
    for (const TensorInfo* t : ckpt->All()) present[t->name] = t->shape;
    EXPECT_EQ(present, ExpectedTensors(*arch));
  }
}

TEST(ConfigTest, GoldenFamilies) {
  auto llama = ReadArch("tests/golden/models/llama");
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  EXPECT_EQ(llama->family, "llama");
  EXPECT_EQ(llama->rope.type, "llama3");
  EXPECT_EQ(llama->rope.original_context, 16);
  EXPECT_FALSE(llama->tied_head);
  auto qwen2 = ReadArch("tests/golden/models/qwen2");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status().message();
  EXPECT_EQ(qwen2->family, "qwen2");
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_TRUE(qwen2->tied_head);
  EXPECT_EQ(qwen2->rope.theta, 10000.0);
  auto qwen3 = ReadArch("tests/golden/models/qwen3");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status().message();
  EXPECT_EQ(qwen3->family, "qwen3");
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->rope.theta, 1e6);
}

TEST(ConfigTest, TensorNames) {
  Arch arch;
  arch.family = "llama";
  EXPECT_EQ(TensorName(arch, TensorRole::kQ, 3), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(TensorName(arch, TensorRole::kOBias, 0), "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(TensorName(arch, TensorRole::kFfnNorm, 11),
            "model.layers.11.post_attention_layernorm.weight");
  EXPECT_EQ(TensorName(arch, TensorRole::kDownBias, 2), "model.layers.2.mlp.down_proj.bias");
  EXPECT_EQ(TensorName(arch, TensorRole::kHead, -1), "lm_head.weight");
  EXPECT_EQ(TensorName(arch, TensorRole::kEmbed, -1), "model.embed_tokens.weight");
  EXPECT_EQ(TensorName(arch, TensorRole::kFinalNorm, -1), "model.norm.weight");
  arch.family = "qwen3";
  EXPECT_EQ(TensorName(arch, TensorRole::kKNorm, 5), "model.layers.5.self_attn.k_norm.weight");
}

TEST(ConfigTest, Llama31) {
  auto arch = ParseArch(Llama31Config(), "x/config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "llama");
  EXPECT_EQ(arch->vocab, 128256);
  EXPECT_EQ(arch->dim, 4096);
  EXPECT_EQ(arch->ffn, 14336);
  EXPECT_EQ(arch->layers, 32);
  EXPECT_EQ(arch->heads, 32);
  EXPECT_EQ(arch->kv_heads, 8);
  EXPECT_EQ(arch->head_dim, 128);  // hidden / heads
  EXPECT_EQ(arch->rope.type, "llama3");
  EXPECT_EQ(arch->rope.theta, 500000.0);
  EXPECT_EQ(arch->rope.factor, 8.0);
  EXPECT_EQ(arch->rope.low_freq_factor, 1.0);
  EXPECT_EQ(arch->rope.high_freq_factor, 4.0);
  EXPECT_EQ(arch->rope.original_context, 8192);
  EXPECT_EQ(arch->rope.rotary_dims, 128);
  EXPECT_EQ(arch->norm_eps, 1e-5);
  EXPECT_EQ(arch->context, 131072);
  EXPECT_FALSE(arch->tied_head);
  EXPECT_FALSE(arch->qk_norm);
  EXPECT_FALSE(arch->qkv_bias);
  EXPECT_FALSE(arch->output_bias);
  EXPECT_FALSE(arch->mlp_bias);
  EXPECT_EQ(arch->eos, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(arch->bos, 128000);

  // transformers' llama3 inverse frequencies (its formula evaluated in double precision):
  // high-frequency dims unchanged, low ones divided by the factor, the band between smoothed.
  std::vector<float> inv = arch->rope.InvFreq();
  ASSERT_EQ(inv.size(), 64u);
  const std::pair<int, double> kExpected[] = {{0, 1.0},
                                              {20, 0.0165604401},
                                              {28, 0.00321144599},
                                              {29, 0.00216657076},
                                              {31, 0.000856751413},
                                              {34, 0.000178507813},
                                              {35, 9.55621235e-05},
                                              {48, 6.64786987e-06},
                                              {63, 3.06892599e-07}};
  for (auto [i, want] : kExpected) {
    EXPECT_NEAR(inv[i], want, 2e-6 * want) << "inv_freq[" << i << "]";
  }
}

// transformers 5 writes the same scaling as rope_parameters, rope_theta inside.
TEST(ConfigTest, Llama31RopeParameters) {
  json c = Llama31Config();
  json params = c["rope_scaling"];
  params["rope_theta"] = c["rope_theta"];
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c["rope_parameters"] = params;
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  auto old = ParseArch(Llama31Config(), "config.json");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(arch->rope.type, "llama3");
  EXPECT_EQ(arch->rope.theta, 500000.0);
  EXPECT_EQ(arch->rope.InvFreq(), old->rope.InvFreq());
  c["rope_parameters"].erase("original_max_position_embeddings");
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"rope_parameters.original_max_position_embeddings", "missing"});
}

TEST(ConfigTest, LlamaBiasesAndDefaults) {
  json c = Llama31Config();
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c.erase("max_position_embeddings");
  c.erase("rms_norm_eps");
  c.erase("tie_word_embeddings");
  c.erase("num_key_value_heads");
  c["head_dim"] = 64;
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_TRUE(arch->qkv_bias);
  EXPECT_TRUE(arch->output_bias);
  EXPECT_TRUE(arch->mlp_bias);
  EXPECT_EQ(arch->head_dim, 64);
  EXPECT_EQ(arch->rope.rotary_dims, 64);
  EXPECT_EQ(arch->rope.type, "default");
  EXPECT_EQ(arch->rope.theta, 10000.0);  // LlamaConfig's defaults
  EXPECT_EQ(arch->context, 2048);
  EXPECT_EQ(arch->norm_eps, 1e-6);
  EXPECT_FALSE(arch->tied_head);
  EXPECT_EQ(arch->kv_heads, 32);  // as many as the query heads
}

TEST(ConfigTest, Qwen2TopLevelRopeTheta) {
  auto arch = ParseArch(Qwen25Config(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen2");
  EXPECT_EQ(arch->head_dim, 64);
  EXPECT_EQ(arch->rope.theta, 1000000.0);
  EXPECT_EQ(arch->rope.type, "default");
  EXPECT_TRUE(arch->qkv_bias);
  EXPECT_FALSE(arch->output_bias);
  EXPECT_FALSE(arch->qk_norm);
  EXPECT_TRUE(arch->tied_head);
  EXPECT_EQ(arch->eos, std::vector<int32_t>{151645});
  EXPECT_EQ(arch->bos, 151643);
  ASSERT_EQ(arch->layer.size(), 24u);
  for (const LayerSpec& l : arch->layer) EXPECT_EQ(l.kind, LayerKind::kAttention);

  // Older configs spell the scaling type "type"; linear scaling needs its factor.
  json c = Qwen25Config();
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->rope.type, "linear");
  EXPECT_EQ(arch->rope.factor, 4.0);
  c["rope_scaling"] = {{"rope_type", "linear"}};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"config.json", "rope_scaling.factor"});
}

TEST(ConfigTest, Qwen3Variants) {
  json c = Qwen25Config();
  c["model_type"] = "qwen3";
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["head_dim"] = 128;
  c["attention_bias"] = true;
  c["partial_rotary_factor"] = 0.5;
  c.erase("tie_word_embeddings");
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_TRUE(arch->qk_norm);
  EXPECT_TRUE(arch->qkv_bias);
  EXPECT_TRUE(arch->output_bias);
  EXPECT_EQ(arch->head_dim, 128);
  EXPECT_EQ(arch->rope.rotary_dims, 64);
  EXPECT_FALSE(arch->tied_head);

  // rope_parameters (transformers 5), also keyed by layer type, wins over rope_theta.
  c["rope_parameters"] = {
      {"rope_theta", 5e6}, {"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->rope.theta, 5e6);
  EXPECT_EQ(arch->rope.rotary_dims, 32);
  c["rope_parameters"] = {{"full_attention", {{"rope_theta", 7e5}, {"rope_type", "default"}}}};
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->rope.theta, 7e5);
  EXPECT_EQ(arch->rope.rotary_dims, 64);  // the top-level partial_rotary_factor
}

TEST(ConfigTest, Unsupported) {
  json c = Qwen25Config();
  c["model_type"] = "mistral";
  ExpectError(ParseArch(c, "m/config.json"), StatusCode::kUnimplemented,
              {"m/config.json", "model_type", "mistral"});

  c = Qwen25Config();
  c["architectures"] = {"Qwen2ForSequenceClassification"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"architectures", "Qwen2ForSequenceClassification"});

  // A base model class (an embedder saved without its head) reads as its family; another
  // family's base class does not.
  c = Qwen25Config();
  c["architectures"] = {"Qwen2Model"};
  EXPECT_TRUE(ParseArch(c, "config.json").ok());
  c["architectures"] = {"Qwen3Model"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"architectures", "Qwen3Model"});
  c.erase("model_type");
  c["architectures"] = {"Qwen2Model"};
  auto base = ParseArch(c, "config.json");
  ASSERT_TRUE(base.ok()) << base.status().message();
  EXPECT_EQ(base->family, "qwen2");

  c = Llama31Config();
  c["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"config.json", "rope_scaling.rope_type", "yarn"});

  c = Qwen25Config();
  c["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e6}};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"rope_parameters.rope_type", "dynamic"});

  c = Qwen25Config();
  c["use_sliding_window"] = true;
  c["max_window_layers"] = 4;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"use_sliding_window"});
  c["max_window_layers"] = 24;  // no layer from 24 on: every layer is full attention
  EXPECT_TRUE(ParseArch(c, "config.json").ok());

  c = Qwen25Config();
  c["num_hidden_layers"] = 3;
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"layer_types[1]"});
  c["layer_types"] = {"full_attention", "full_attention"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"layer_types"});

  c = Llama31Config();
  c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"quantization_config", "gptq"});

  c = Llama31Config();
  c["hidden_act"] = "gelu";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"hidden_act", "gelu"});
}

// Fields that change what a model computes and that the family's recipe does not implement are
// refused, naming the field; their neutral values pass.
TEST(ConfigTest, UnimplementedComputationFieldsAreRefused) {
  for (const char* field : {"final_logit_softcapping", "attn_logit_softcapping",
                            "query_pre_attn_scalar", "num_local_experts", "logits_scaling"}) {
    json c = Llama31Config();
    c[field] = 7;
    ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"config.json", field});
  }
  json c = Qwen25Config();
  c["use_bidirectional_attention"] = true;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"use_bidirectional_attention"});
  c["use_bidirectional_attention"] = false;
  c["final_logit_softcapping"] = nullptr;
  c["logits_scaling"] = 1.0;
  c["num_experts"] = 0;
  EXPECT_TRUE(ParseArch(c, "config.json").ok());
  c = Llama31Config();
  c["mlp_bias"] = true;
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_TRUE(arch->layer[5].feed_forward.bias);
  EXPECT_FALSE(arch->layer[5].attention.qkv_bias);
}

// google/gemma-3-4b-it's config.json: a conditional-generation model whose text_config gives only
// what differs from Gemma3TextConfig's defaults, and the older rope spelling.
json Gemma3ItConfig() {
  return json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}})");
}

TEST(ConfigTest, Gemma3ConditionalGenerationDefaultsAndPattern) {
  auto arch = ParseArch(Gemma3ItConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "gemma3");
  EXPECT_EQ(arch->vocab, 262208);
  EXPECT_EQ(arch->dim, 2560);
  EXPECT_EQ(arch->heads, 8);
  EXPECT_EQ(arch->kv_heads, 4);
  EXPECT_EQ(arch->head_dim, 256);
  EXPECT_TRUE(arch->tied_head);
  EXPECT_EQ(arch->eos, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(arch->prefixes[0], "language_model.model.");
  EXPECT_FLOAT_EQ(arch->embed_scale, std::sqrt(2560.0f));
  EXPECT_EQ(arch->norm_offset, 1.0f);
  ASSERT_EQ(arch->ropes.size(), 2u);
  EXPECT_EQ(arch->ropes[0].type, "linear");  // global: rope_theta 1e6, scaled by 8
  EXPECT_EQ(arch->ropes[0].theta, 1e6);
  EXPECT_EQ(arch->ropes[0].factor, 8.0);
  EXPECT_EQ(arch->ropes[1].type, "default");  // local: rope_local_base_freq
  EXPECT_EQ(arch->ropes[1].theta, 1e4);
  ASSERT_EQ(arch->layer.size(), 34u);
  for (int l = 0; l < 34; ++l) {
    const AttentionSpec& a = arch->layer[l].attention;
    const bool global = (l + 1) % 6 == 0;  // sliding_window_pattern 6
    EXPECT_EQ(a.window, global ? 0 : 1024) << l;
    EXPECT_EQ(a.rope, global ? 0 : 1) << l;
    EXPECT_FLOAT_EQ(a.scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
    EXPECT_TRUE(a.qk_norm);
    EXPECT_TRUE(arch->layer[l].post_norms);
    EXPECT_EQ(arch->layer[l].feed_forward.act, Activation::kGeluTanh);
  }
}

TEST(ConfigTest, Gemma3TextRopeParametersAndRefusals) {
  json c = Gemma3ItConfig()["text_config"];
  c["architectures"] = {"Gemma3ForCausalLM"};
  c["num_hidden_layers"] = 3;
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  c.erase("rope_scaling");
  c["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 5e5}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 2e4}}}};
  c["final_logit_softcapping"] = 30.0;
  c["attn_logit_softcapping"] = 50.0;  // transformers' Gemma 3 does not apply it
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->prefixes[0], "model.");
  EXPECT_EQ(arch->ropes[0].theta, 5e5);
  EXPECT_EQ(arch->ropes[1].theta, 2e4);
  EXPECT_EQ(arch->layer[1].attention.window, 0);
  EXPECT_EQ(arch->layer[2].attention.window, 1024);
  EXPECT_EQ(arch->logit_softcap, 30.0f);
  EXPECT_EQ(arch->layer[0].attention.softcap, 0.0f);
  c["layer_types"][1] = "chunked_attention";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"layer_types[1]", "chunked_attention"});
  c["layer_types"][1] = "full_attention";
  c["hidden_activation"] = "relu";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"hidden_activation", "relu"});
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["use_bidirectional_attention"] = true;  // EmbeddingGemma
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"use_bidirectional_attention"});
  c["use_bidirectional_attention"] = false;
  c["sliding_window"] = 0;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"sliding_window"});
}

// Gemma 2: soft-capping by default (50 and 30) unless null; every other layer slides.
TEST(ConfigTest, Gemma2SoftCappingDefaults) {
  json c = json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
    "intermediate_size": 9216, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000, "sliding_window": 4096,
    "query_pre_attn_scalar": 256})");
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->logit_softcap, 30.0f);
  EXPECT_EQ(arch->layer[0].attention.softcap, 50.0f);
  EXPECT_EQ(arch->layer[0].attention.window, 4096);
  EXPECT_EQ(arch->layer[1].attention.window, 0);
  for (const Rope& rope : arch->ropes) EXPECT_EQ(rope.theta, 1e4);  // one table for every layer
  EXPECT_FALSE(arch->layer[0].attention.qk_norm);
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(arch->logit_softcap, 0.0f);
  EXPECT_EQ(arch->layer[0].attention.softcap, 0.0f);
}

TEST(ConfigTest, BadFields) {
  for (const char* field : {"hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads"}) {
    json c = Llama31Config();
    c.erase(field);
    ExpectError(ParseArch(c, "a/config.json"), StatusCode::kInvalidArgument,
                {"a/config.json", field, "missing"});
  }
  json c = Llama31Config();
  c["hidden_size"] = "big";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"hidden_size", "expected an integer", "big"});
  c = Llama31Config();
  c["num_key_value_heads"] = 5;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"num_key_value_heads"});
  c = Llama31Config();
  c["hidden_size"] = 4000;  // not a multiple of 32 heads, and no head_dim
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"head_dim"});
  c = Llama31Config();
  c["rope_scaling"].erase("low_freq_factor");
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"rope_scaling.low_freq_factor"});
  c = Llama31Config();
  c["eos_token_id"] = {128001, "x"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"eos_token_id"});
  c = Llama31Config();
  c["eos_token_id"] = 128256;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"128256", "vocab"});
  // max_position_embeddings: an integer in [1, 2^24], the largest accepted.
  for (json bad : {json(1e18), json(1000000000000000000), json(16777217), json(0), json(-5),
                   json(4096.5), json("long"), json(1e300)}) {
    c = Llama31Config();
    c["max_position_embeddings"] = bad;
    ExpectError(ParseArch(c, "a/config.json"), StatusCode::kInvalidArgument,
                {"a/config.json", "max_position_embeddings"});
  }
  c = Llama31Config();
  c["max_position_embeddings"] = 1e18;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"must be in [1, 16777216], got 1000000000000000000"});
  c["max_position_embeddings"] = 16777216;
  EXPECT_EQ(ParseArch(c, "config.json")->context, 16777216);
  c = Llama31Config();
  c["rope_scaling"]["original_max_position_embeddings"] = 1e18;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"rope_scaling.original_max_position_embeddings", "1000000000000000000"});
  c = Llama31Config();
  c.erase("model_type");  // architectures alone is enough
  EXPECT_TRUE(ParseArch(c, "config.json").ok());
  c.erase("architectures");
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"model_type"});
  ExpectError(ParseArch(json::array(), "config.json"), StatusCode::kInvalidArgument,
              {"config.json"});
}

TEST(ConfigTest, EosUnion) {
  TempDir dir;
  json c = Qwen25Config();
  c["eos_token_id"] = {151645, 151643};
  c["bos_token_id"] = nullptr;
  dir.Write("config.json", c);
  dir.Write("generation_config.json", {{"eos_token_id", {151643, 151650}}, {"bos_token_id", 9}});
  json added = {{"151644", {{"content", "<|im_start|>"}}},
                {"151660", {{"content", "<|eot|>"}, {"special", true}}}};
  dir.Write("tokenizer_config.json",
            {{"eos_token", {{"content", "<|eot|>"}, {"__type", "AddedToken"}}},
             {"bos_token", "<|im_start|>"},
             {"added_tokens_decoder", added}});
  auto arch = ReadArch(dir.path());
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->eos, (std::vector<int32_t>{151645, 151643, 151650, 151660}));
  EXPECT_EQ(arch->bos, 9);  // generation_config.json before tokenizer_config.json

  // Without generation_config.json, bos comes from tokenizer_config.json; an eos_token not in
  // added_tokens_decoder is looked up in tokenizer.json.
  fs::remove(fs::path(dir.path()) / "generation_config.json");
  dir.Write(
      "tokenizer_config.json",
      {{"eos_token", "<|end|>"}, {"bos_token", "<|im_start|>"}, {"added_tokens_decoder", added}});
  dir.Write("tokenizer.json", {{"added_tokens", {{{"id", 151670}, {"content", "<|end|>"}}}},
                               {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"<|x|>", 17}}}}}});
  arch = ReadArch(dir.path());
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->eos, (std::vector<int32_t>{151645, 151643, 151670}));
  EXPECT_EQ(arch->bos, 151644);

  dir.Write("tokenizer_config.json", {{"eos_token", "<|x|>"}});
  arch = ReadArch(dir.path());
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->eos, (std::vector<int32_t>{151645, 151643, 17}));

  dir.Write("tokenizer_config.json", {{"eos_token", "<|nowhere|>"}});
  ExpectError(ReadArch(dir.path()), StatusCode::kInvalidArgument,
              {"tokenizer_config.json", "eos_token", "<|nowhere|>"});
}

// `inner` inside `depth` arrays, as a hostile file nests it: "[[[...inner...]]]".
std::string Nested(size_t depth, const std::string& inner) {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(ConfigTest, HostileValues) {
  // A field nested a million deep is an error that shows its start (no recursion through it).
  json c = Llama31Config();
  c["hidden_act"] = json::parse(Nested(1000000, "1"));
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"hidden_act", "[[[[[[[[[...]]]]]]]]]"});
  EXPECT_LT(ParseArch(c, "config.json").status().message().size(), 200u);

  // A quant_method that is not a string is named by "?", not thrown.
  c = Llama31Config();
  c["quantization_config"] = {{"quant_method", 4}};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"quantization_config", "quantized by ?"});

  // Special tokens whose content or id nest a million deep are not found (and not copied).
  TempDir dir;
  dir.Write("config.json", Qwen25Config());
  std::ofstream(fs::path(dir.path()) / "tokenizer_config.json")
      << R"({"eos_token": "<|end|>", "added_tokens_decoder": {"151644": {"content": )"
      << Nested(1000000, "0") << "}}}";
  std::ofstream(fs::path(dir.path()) / "tokenizer.json")
      << R"({"added_tokens": [{"id": )" << Nested(1000000, "1")
      << R"(, "content": "<|end|>"}, {"id": 7, "content": )" << Nested(1000000, "2") << "}]}";
  ExpectError(ReadArch(dir.path()), StatusCode::kInvalidArgument,
              {"tokenizer_config.json", "eos_token", "<|end|>"});
}

TEST(ConfigTest, MissingOrBrokenFiles) {
  TempDir dir;
  ExpectError(ReadArch(dir.path()), StatusCode::kNotFound, {dir.path() + "/config.json"});
  std::ofstream(fs::path(dir.path()) / "config.json") << "{\"model_type\": ";
  ExpectError(ReadArch(dir.path()), StatusCode::kDataLoss, {"config.json", "JSON"});
  dir.Write("config.json", Qwen25Config());
  std::ofstream(fs::path(dir.path()) / "generation_config.json") << "[1,";
  ExpectError(ReadArch(dir.path()), StatusCode::kDataLoss, {"generation_config.json"});
}

TEST(RopeTest, DefaultAndLinear) {
  Rope rope;
  rope.theta = 10000.0;
  rope.rotary_dims = 64;
  std::vector<float> inv = rope.InvFreq();
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    EXPECT_NEAR(inv[i], want, 2e-6 * want) << i;
  }
  rope.type = "linear";
  rope.factor = 4.0;
  std::vector<float> linear = rope.InvFreq();
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(linear[i], inv[i] / 4.0f) << i;
}

}  // namespace
}  // namespace gizllm

namespace gizllm {
namespace {

// Qwen3-30B-A3B's config.json.
json Qwen3MoeConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(ConfigTest, Qwen3Moe30BA3B) {
  auto arch = ParseArch(Qwen3MoeConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_moe");
  EXPECT_EQ(arch->architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(arch->layers, 48);
  EXPECT_EQ(arch->dim, 2048);
  EXPECT_EQ(arch->heads, 32);
  EXPECT_EQ(arch->kv_heads, 4);
  EXPECT_EQ(arch->head_dim, 128);
  EXPECT_EQ(arch->vocab, 151936);
  EXPECT_EQ(arch->context, 40960);
  EXPECT_EQ(arch->rope.theta, 1e6);
  EXPECT_TRUE(arch->qk_norm);
  EXPECT_FALSE(arch->qkv_bias);
  EXPECT_FALSE(arch->tied_head);
  EXPECT_TRUE(HasMoe(*arch));
  ASSERT_EQ(arch->layer.size(), 48u);
  for (const LayerSpec& spec : arch->layer) {
    EXPECT_TRUE(spec.IsMoe());
    EXPECT_EQ(spec.moe.experts, 128);
    EXPECT_EQ(spec.moe.experts_per_token, 8);
    EXPECT_EQ(spec.moe.ffn, 768);
    EXPECT_TRUE(spec.moe.norm_topk_prob);
    EXPECT_TRUE(spec.attention.qk_norm);
  }
  EXPECT_EQ(TensorName(*arch, TensorRole::kRouter, 7), "model.layers.7.mlp.gate.weight");
  EXPECT_EQ(ExpertTensorName(*arch, TensorRole::kExpertGate, 7, 0),
            "model.layers.7.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(ExpertTensorName(*arch, TensorRole::kExpertDown, 47, 127),
            "model.layers.47.mlp.experts.127.down_proj.weight");
  EXPECT_EQ(TensorName(*arch, TensorRole::kExpertsGateUp, 3),
            "model.layers.3.mlp.experts.gate_up_proj");
  EXPECT_EQ(TensorName(*arch, TensorRole::kExpertsDown, 3), "model.layers.3.mlp.experts.down_proj");
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRouter, 0), (std::vector<int64_t>{128, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kExpertUp, 0), (std::vector<int64_t>{768, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kExpertDown, 0), (std::vector<int64_t>{2048, 768}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kExpertsGateUp, 0),
            (std::vector<int64_t>{128, 1536, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kExpertsDown, 0),
            (std::vector<int64_t>{128, 2048, 768}));
  const std::vector<TensorRole> roles = LayerRoles(*arch, 0);
  EXPECT_NE(std::find(roles.begin(), roles.end(), TensorRole::kRouter), roles.end());
  EXPECT_EQ(std::find(roles.begin(), roles.end(), TensorRole::kGate), roles.end());
}

// Dense layers: mlp_only_layers, decoder_sparse_step, num_experts 0; transformers 5's
// num_local_experts spelling.
TEST(ConfigTest, Qwen3MoeDenseLayers) {
  json c = Qwen3MoeConfig();
  c["num_hidden_layers"] = 4;
  c["mlp_only_layers"] = {1};
  auto arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_TRUE(arch->layer[0].IsMoe());
  EXPECT_FALSE(arch->layer[1].IsMoe());
  EXPECT_EQ(arch->layer[1].feed_forward.ffn, 6144);
  EXPECT_TRUE(arch->layer[2].IsMoe());
  EXPECT_TRUE(arch->layer[3].IsMoe());
  const std::vector<TensorRole> roles = LayerRoles(*arch, 1);
  EXPECT_NE(std::find(roles.begin(), roles.end(), TensorRole::kGate), roles.end());
  EXPECT_EQ(std::find(roles.begin(), roles.end(), TensorRole::kRouter), roles.end());

  c["mlp_only_layers"] = json::array();
  c["decoder_sparse_step"] = 2;  // layers 1 and 3: (l + 1) % 2 == 0
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_FALSE(arch->layer[0].IsMoe());
  EXPECT_TRUE(arch->layer[1].IsMoe());
  EXPECT_FALSE(arch->layer[2].IsMoe());
  EXPECT_TRUE(arch->layer[3].IsMoe());

  c["decoder_sparse_step"] = 1;
  c["num_experts"] = 0;
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_FALSE(HasMoe(*arch));

  c.erase("num_experts");
  c["num_local_experts"] = 16;
  c["num_experts_per_tok"] = 4;
  c["norm_topk_prob"] = false;
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->layer[2].moe.experts, 16);
  EXPECT_EQ(arch->layer[2].moe.experts_per_token, 4);
  EXPECT_FALSE(arch->layer[2].moe.norm_topk_prob);

  // Qwen3MoeConfig's defaults: 128 experts, 8 a token, 768 wide, no renormalization.
  c.erase("num_local_experts");
  c.erase("num_experts_per_tok");
  c.erase("moe_intermediate_size");
  c.erase("norm_topk_prob");
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->layer[0].moe.experts, 128);
  EXPECT_EQ(arch->layer[0].moe.experts_per_token, 8);
  EXPECT_EQ(arch->layer[0].moe.ffn, 768);
  EXPECT_FALSE(arch->layer[0].moe.norm_topk_prob);
}

TEST(ConfigTest, Qwen3MoeRefusals) {
  json c = Qwen3MoeConfig();
  c["num_experts_per_tok"] = 129;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"num_experts_per_tok"});
  c = Qwen3MoeConfig();
  c["decoder_sparse_step"] = 0;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"decoder_sparse_step"});
  c = Qwen3MoeConfig();
  c["mlp_only_layers"] = "all";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"mlp_only_layers"});
  c = Qwen3MoeConfig();
  c["shared_expert_intermediate_size"] = 5632;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented,
              {"shared_expert_intermediate_size"});
  c = Qwen3MoeConfig();
  c["use_sliding_window"] = true;
  c["sliding_window"] = 4096;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"use_sliding_window"});
  c = Qwen3MoeConfig();
  c["moe_intermediate_size"] = 0;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"moe_intermediate_size"});
  // Other families still refuse experts.
  c = Qwen25Config();
  c["num_experts"] = 8;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"num_experts"});
}

}  // namespace
}  // namespace gizllm

namespace gizllm {
namespace {

// Qwen3-Next-80B-A3B-Instruct's config.json.
json Qwen3NextConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
    "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": true,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": false,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(ConfigTest, Qwen3Next80BA3B) {
  auto arch = ParseArch(Qwen3NextConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_next");
  EXPECT_EQ(arch->layers, 48);
  EXPECT_EQ(arch->rope.theta, 1e7);
  EXPECT_EQ(arch->rope.rotary_dims, 64);  // 256 * 0.25
  EXPECT_EQ(arch->norm_offset, 1.0f);
  EXPECT_EQ(arch->mtp_prefix, "mtp.");
  EXPECT_TRUE(HasRecurrent(*arch));
  for (int l = 0; l < 48; ++l) {
    const LayerSpec& spec = arch->layer[l];
    EXPECT_EQ(spec.IsRecurrent(), (l + 1) % 4 != 0) << l;
    EXPECT_TRUE(spec.IsMoe());
    EXPECT_EQ(spec.moe.experts, 512);
    EXPECT_EQ(spec.moe.experts_per_token, 10);
    EXPECT_EQ(spec.moe.shared_ffn, 512);
    EXPECT_TRUE(spec.moe.shared_gate);
    EXPECT_TRUE(spec.moe.norm_topk_prob);
  }
  const LayerSpec& attention = arch->layer[3];
  EXPECT_TRUE(attention.attention.output_gate);
  EXPECT_TRUE(attention.attention.qk_norm);
  EXPECT_EQ(TensorShape(*arch, TensorRole::kQ, 3), (std::vector<int64_t>{2 * 16 * 256, 2048}));
  const RecurrentSpec& r = arch->layer[0].recurrent;
  EXPECT_TRUE(r.fused_projections);
  EXPECT_EQ(r.k_heads, 16);
  EXPECT_EQ(r.v_heads, 32);
  EXPECT_EQ(r.k_dim, 128);
  EXPECT_EQ(r.v_dim, 128);
  EXPECT_EQ(r.kernel, 4);
  EXPECT_EQ(r.ConvDim(), 2 * 2048 + 4096);
  EXPECT_EQ(TensorName(*arch, TensorRole::kRecurrentQkvz, 0),
            "model.layers.0.linear_attn.in_proj_qkvz.weight");
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentQkvz, 0),
            (std::vector<int64_t>{2 * 2048 + 2 * 4096, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentBa, 0), (std::vector<int64_t>{64, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentConv, 0), (std::vector<int64_t>{8192, 1, 4}));
  EXPECT_EQ(TensorName(*arch, TensorRole::kRecurrentALog, 0), "model.layers.0.linear_attn.A_log");
  EXPECT_EQ(TensorName(*arch, TensorRole::kSharedExpertGate, 5),
            "model.layers.5.mlp.shared_expert_gate.weight");
  EXPECT_EQ(TensorShape(*arch, TensorRole::kSharedDown, 5), (std::vector<int64_t>{2048, 512}));
  const std::vector<TensorRole> roles = LayerRoles(*arch, 0);
  EXPECT_NE(std::find(roles.begin(), roles.end(), TensorRole::kRecurrentQkvz), roles.end());
  EXPECT_EQ(std::find(roles.begin(), roles.end(), TensorRole::kQ), roles.end());
  EXPECT_NE(std::find(roles.begin(), roles.end(), TensorRole::kSharedExpertGate), roles.end());

  // layer_types instead of the interval; partial_rotary_factor's class default.
  json c = Qwen3NextConfig();
  c["num_hidden_layers"] = 3;
  c["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  c.erase("partial_rotary_factor");
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_FALSE(arch->layer[0].IsRecurrent());
  EXPECT_TRUE(arch->layer[1].IsRecurrent());
  EXPECT_FALSE(arch->layer[2].IsRecurrent());
  EXPECT_EQ(arch->rope.rotary_dims, 64);
}

TEST(ConfigTest, Qwen3NextRefusals) {
  json c = Qwen3NextConfig();
  c["linear_num_value_heads"] = 24;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"linear_num_value_heads", "24"});
  c = Qwen3NextConfig();
  c["linear_conv_kernel_dim"] = 1;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"linear_conv_kernel_dim"});
  c = Qwen3NextConfig();
  c["num_hidden_layers"] = 2;
  c["layer_types"] = {"linear_attention", "sliding_attention"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"layer_types[1]"});
  c = Qwen3NextConfig();
  c["layer_types"] = {"linear_attention"};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"layer_types"});
  c = Qwen3NextConfig();
  c["hidden_act"] = "gelu";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"hidden_act"});
}

// Qwen3.5-35B-A3B's config.json (Qwen3_5MoeForConditionalGeneration), its vision_config cut.
json Qwen3_5MoeConfig() {
  json text = json::parse(R"({
    "model_type": "qwen3_5_moe_text", "attention_bias": false, "attn_output_gate": true,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1,
    "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                        "rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25},
    "shared_expert_intermediate_size": 512, "vocab_size": 248320, "eos_token_id": 248044})");
  json c = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
            {"model_type", "qwen3_5_moe"},
            {"text_config", text},
            {"vision_config", {{"depth", 27}, {"hidden_size", 1152}}},
            {"tie_word_embeddings", false},
            {"image_token_id", 248056}};
  return c;
}

TEST(ConfigTest, Qwen3_5Moe35BA3B) {
  auto arch = ParseArch(Qwen3_5MoeConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_5_moe");
  EXPECT_EQ(arch->architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(arch->layers, 40);
  EXPECT_EQ(arch->vocab, 248320);
  EXPECT_EQ(arch->rope.rotary_dims, 64);
  EXPECT_EQ(arch->prefixes[0], "model.language_model.");
  EXPECT_EQ(arch->skipped_prefixes, std::vector<std::string>{"model.visual."});
  EXPECT_EQ(arch->eos, std::vector<int32_t>{248044});
  for (int l = 0; l < 40; ++l) {
    const LayerSpec& spec = arch->layer[l];
    EXPECT_EQ(spec.IsRecurrent(), (l + 1) % 4 != 0) << l;
    EXPECT_TRUE(spec.IsMoe());
    EXPECT_EQ(spec.moe.experts, 256);
    EXPECT_EQ(spec.moe.experts_per_token, 8);
    EXPECT_TRUE(spec.moe.norm_topk_prob);  // Qwen3.5-MoE's router always renormalizes
    EXPECT_EQ(spec.moe.shared_ffn, 512);
  }
  EXPECT_FALSE(arch->layer[0].recurrent.fused_projections);
  EXPECT_EQ(TensorName(*arch, TensorRole::kRecurrentQkv, 0),
            "model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentQkv, 0), (std::vector<int64_t>{8192, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentZ, 0), (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(TensorShape(*arch, TensorRole::kRecurrentOut, 0), (std::vector<int64_t>{2048, 4096}));
  // A 60 MB state a sequence: 30 recurrent layers of (3 x 8192 + 32 x 128 x 128) floats.
  EXPECT_EQ(arch->layer[0].recurrent.StateFloats(), 3 * 8192 + 32 * 128 * 128);

  // The dense Qwen3.5 text class; mrope_section must fit the rotary frequencies.
  json text = Qwen3_5MoeConfig()["text_config"];
  text["model_type"] = "qwen3_5_text";
  text.erase("num_experts");
  text.erase("num_experts_per_tok");
  text.erase("moe_intermediate_size");
  text.erase("shared_expert_intermediate_size");
  text["intermediate_size"] = 17408;
  text["architectures"] = {"Qwen3_5ForCausalLM"};
  arch = ParseArch(text, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_5");
  EXPECT_FALSE(HasMoe(*arch));
  EXPECT_EQ(arch->layer[0].feed_forward.ffn, 17408);
  EXPECT_EQ(arch->prefixes[0], "model.");
  text["rope_parameters"]["mrope_section"] = {11, 11, 11};
  ExpectError(ParseArch(text, "config.json"), StatusCode::kInvalidArgument, {"mrope_section"});
}

// Qwen3-VL-8B-Instruct's config.json (Qwen3VLForConditionalGeneration), as released: the
// text model's M-RoPE in rope_scaling.
json Qwen3VlConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": false,
    "text_config": {
      "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645,
      "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
      "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
      "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                       "rope_type": "default"},
      "rope_theta": 5000000, "vocab_size": 151936},
    "vision_config": {
      "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
      "hidden_size": 1152, "in_channels": 3, "initializer_range": 0.02,
      "intermediate_size": 4304, "model_type": "qwen3_vl", "num_heads": 16,
      "num_position_embeddings": 2304, "out_hidden_size": 4096, "patch_size": 16,
      "spatial_merge_size": 2, "temporal_patch_size": 2}})");
}

TEST(ConfigTest, Qwen3Vl8BTextModelWithInterleavedMrope) {
  auto arch = ParseArch(Qwen3VlConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_vl");
  EXPECT_EQ(arch->layers, 36);
  EXPECT_EQ(arch->dim, 4096);
  EXPECT_EQ(arch->kv_heads, 8);
  EXPECT_TRUE(arch->qk_norm);
  EXPECT_DOUBLE_EQ(arch->rope.theta, 5000000.0);
  EXPECT_EQ(arch->rope.mrope_section, (std::vector<int>{24, 20, 20}));
  EXPECT_EQ(arch->ropes[0].mrope_section, (std::vector<int>{24, 20, 20}));
  EXPECT_EQ(arch->prefixes[0], "model.language_model.");
  EXPECT_EQ(arch->skipped_prefixes, std::vector<std::string>{"model.visual."});
  EXPECT_EQ(arch->eos, std::vector<int32_t>{151645});
  EXPECT_EQ(TensorName(*arch, TensorRole::kQ, 0),
            "model.language_model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(TensorName(*arch, TensorRole::kHead, -1), "lm_head.weight");
  // Interleaved: height at i % 3 == 1 below 60, width at i % 3 == 2 below 60, else time.
  const Rope& rope = arch->rope;
  EXPECT_EQ(rope.MropeAxis(0), 0);
  EXPECT_EQ(rope.MropeAxis(1), 1);
  EXPECT_EQ(rope.MropeAxis(2), 2);
  EXPECT_EQ(rope.MropeAxis(3), 0);
  EXPECT_EQ(rope.MropeAxis(58), 1);
  EXPECT_EQ(rope.MropeAxis(59), 2);
  EXPECT_EQ(rope.MropeAxis(61), 0);
  EXPECT_EQ(rope.MropeAxis(62), 0);
  EXPECT_EQ(rope.MropeAxis(63), 0);
  const std::vector<float> all = rope.InvFreq(), h = rope.MropeInvFreq(1);
  ASSERT_EQ(h.size(), 64u);
  EXPECT_EQ(h[4], all[4]);
  EXPECT_EQ(h[5], 0.0f);
  EXPECT_EQ(h[63], 0.0f);

  // transformers 5's spelling (rope_parameters) and the default section.
  json c = Qwen3VlConfig();
  c["text_config"].erase("rope_scaling");
  c["text_config"]["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000}};
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->rope.mrope_section, (std::vector<int>{24, 20, 20}));
  c["text_config"]["rope_parameters"]["mrope_section"] = {24, 20, 21};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument,
              {"rope_parameters.mrope_section", "64"});
  c["text_config"]["rope_parameters"]["mrope_section"] = {32, 32};
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"mrope_section"});
  c = Qwen3VlConfig();
  c["text_config"]["hidden_act"] = "gelu";
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"hidden_act"});
}

TEST(ConfigTest, Qwen3VlVisionTower) {
  auto v = ParseVisionArch(Qwen3VlConfig(), "config.json");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->family, "qwen3_vl");
  EXPECT_EQ(v->depth, 27);
  EXPECT_EQ(v->dim, 1152);
  EXPECT_EQ(v->ffn, 4304);
  EXPECT_EQ(v->heads, 16);
  EXPECT_EQ(v->head_dim, 72);
  EXPECT_EQ(v->patch, 16);
  EXPECT_EQ(v->merge, 2);
  EXPECT_EQ(v->temporal_patch, 2);
  EXPECT_EQ(v->channels, 3);
  EXPECT_EQ(v->out_dim, 4096);
  EXPECT_EQ(v->grid_side, 48);
  EXPECT_EQ(v->act, VisionAct::kGeluTanh);
  EXPECT_EQ(v->deepstack, (std::vector<int>{8, 16, 24}));
  EXPECT_EQ(v->image_token, 151655);
  EXPECT_EQ(v->video_token, 151656);
  EXPECT_EQ(v->vision_start, 151652);
  EXPECT_EQ(v->vision_end, 151653);
  EXPECT_EQ(v->PatchFloats(), 1536);
  EXPECT_EQ(v->MergedDim(), 4608);

  auto expect_error = [](const json& c, StatusCode code, const std::string& part) {
    auto r = ParseVisionArch(c, "config.json");
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  };
  json c = Qwen3VlConfig();
  c["vision_config"]["hidden_act"] = "silu";
  expect_error(c, StatusCode::kUnimplemented, "vision_config.hidden_act");
  c = Qwen3VlConfig();
  c["vision_config"]["num_position_embeddings"] = 2300;
  expect_error(c, StatusCode::kInvalidArgument, "vision_config.num_position_embeddings");
  c = Qwen3VlConfig();
  c["vision_config"]["deepstack_visual_indexes"] = {8, 27};
  expect_error(c, StatusCode::kInvalidArgument, "vision_config.deepstack_visual_indexes");
  c = Qwen3VlConfig();
  c["vision_config"]["num_heads"] = 7;
  expect_error(c, StatusCode::kInvalidArgument, "vision_config.num_heads");
  c = Qwen3VlConfig();
  c["vision_config"]["num_heads"] = 64;  // head_dim 18: no quarter for each axis' pairs
  expect_error(c, StatusCode::kInvalidArgument, "vision_config.num_heads");
  c = Qwen3VlConfig();
  c["vision_config"]["patch_size"] = 0;
  expect_error(c, StatusCode::kInvalidArgument, "vision_config.patch_size");
  c = Qwen3VlConfig();
  c["vision_config"]["rope_parameters"] = {{"rope_type", "yarn"}};
  expect_error(c, StatusCode::kUnimplemented, "vision_config.rope_parameters.rope_type");
  c = Qwen3VlConfig();
  c.erase("vision_config");
  expect_error(c, StatusCode::kNotFound, "vision_config");
  c = Qwen3VlConfig();
  c["model_type"] = "qwen3";
  expect_error(c, StatusCode::kUnimplemented, "model_type");

  // Qwen3.5's tower: the same module without deepstack, its own token ids.
  v = ParseVisionArch(Qwen3_5MoeConfig(), "config.json");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->depth, 27);
  EXPECT_TRUE(v->deepstack.empty());
  EXPECT_EQ(v->image_token, 248056);
  EXPECT_EQ(v->vision_start, 248053);
  EXPECT_EQ(v->vision_end, 248054);  // Qwen3_5Config's default
}

// Qwen3-VL-30B-A3B-Instruct's config.json (the parts that matter): Qwen3-VL's tower and
// M-RoPE, a text model of mixtures of experts.
json Qwen3VlMoeConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": false,
    "text_config": {
      "model_type": "qwen3_vl_moe_text", "vocab_size": 151936, "hidden_size": 2048,
      "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
      "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6,
      "max_position_embeddings": 262144, "attention_bias": false, "bos_token_id": 151643,
      "eos_token_id": 151645, "num_experts": 128, "num_experts_per_tok": 8,
      "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "norm_topk_prob": true, "router_aux_loss_coef": 0.001, "rope_theta": 5000000,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                       "rope_type": "default"}
    },
    "vision_config": {
      "model_type": "qwen3_vl_moe", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
      "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
      "temporal_patch_size": 2, "out_hidden_size": 2048, "num_position_embeddings": 2304,
      "deepstack_visual_indexes": [8, 16, 24], "hidden_act": "gelu_pytorch_tanh"
    }
  })");
}

TEST(ConfigTest, Qwen3VlMoe30BA3B) {
  auto arch = ParseArch(Qwen3VlMoeConfig(), "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->family, "qwen3_vl_moe");
  EXPECT_EQ(arch->layers, 48);
  EXPECT_EQ(arch->dim, 2048);
  EXPECT_EQ(arch->kv_heads, 4);
  EXPECT_TRUE(arch->qk_norm);
  EXPECT_FALSE(arch->tied_head);
  EXPECT_EQ(arch->rope.mrope_section, (std::vector<int>{24, 20, 20}));
  EXPECT_EQ(arch->prefixes[0], "model.language_model.");
  EXPECT_EQ(arch->skipped_prefixes, std::vector<std::string>{"model.visual."});
  for (const LayerSpec& spec : arch->layer) {
    ASSERT_TRUE(spec.IsMoe());
    EXPECT_EQ(spec.moe.experts, 128);
    EXPECT_EQ(spec.moe.experts_per_token, 8);
    EXPECT_EQ(spec.moe.ffn, 768);
    EXPECT_TRUE(spec.moe.norm_topk_prob);
    EXPECT_TRUE(spec.moe.transposed_stacks);
    EXPECT_EQ(spec.moe.shared_ffn, 0);
  }
  EXPECT_EQ(TensorName(*arch, TensorRole::kRouter, 3),
            "model.language_model.layers.3.mlp.gate.weight");
  EXPECT_EQ(TensorName(*arch, TensorRole::kExpertsGateUp, 3),
            "model.language_model.layers.3.mlp.experts.gate_up_proj");
  EXPECT_EQ(TensorName(*arch, TensorRole::kExpertsDown, 3),
            "model.language_model.layers.3.mlp.experts.down_proj");
  auto v = ParseVisionArch(Qwen3VlMoeConfig(), "config.json");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->family, "qwen3_vl_moe");
  EXPECT_EQ(v->deepstack, (std::vector<int>{8, 16, 24}));
  EXPECT_EQ(v->out_dim, 2048);
  EXPECT_EQ(v->image_token, 151655);

  // The router renormalizes whatever norm_topk_prob says; mlp_only_layers and
  // decoder_sparse_step pick dense layers as in Qwen3-MoE.
  json c = Qwen3VlMoeConfig();
  c["text_config"]["norm_topk_prob"] = false;
  c["text_config"]["mlp_only_layers"] = {0};
  c["text_config"]["decoder_sparse_step"] = 2;
  arch = ParseArch(c, "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  EXPECT_FALSE(arch->layer[0].IsMoe());
  EXPECT_TRUE(arch->layer[1].IsMoe());
  EXPECT_FALSE(arch->layer[2].IsMoe());
  EXPECT_TRUE(arch->layer[1].moe.norm_topk_prob);
  c = Qwen3VlMoeConfig();
  c["text_config"]["num_experts_per_tok"] = 129;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kInvalidArgument, {"num_experts_per_tok"});
  // Qwen3-VL's text model has no experts: a dense qwen3_vl config that asks for them is refused.
  c = Qwen3VlConfig();
  c["text_config"]["num_experts"] = 8;
  ExpectError(ParseArch(c, "config.json"), StatusCode::kUnimplemented, {"num_experts"});
}

TEST(ConfigTest, VisionGridsMustFitTheMergeWindows) {
  auto v = ParseVisionArch(Qwen3VlConfig(), "config.json");
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(CheckVisionGrid(*v, {1, 4, 6}, 0).ok());
  EXPECT_TRUE(CheckVisionGrid(*v, {3, 2, 2}, 0).ok());
  for (VisionGrid g : {VisionGrid{1, 3, 4}, VisionGrid{1, 4, 5}, VisionGrid{0, 4, 4},
                       VisionGrid{1, 0, 2}, VisionGrid{1, -2, 2}, VisionGrid{1, 1 << 15, 2}}) {
    Status s = CheckVisionGrid(*v, g, 2);
    EXPECT_FALSE(s.ok()) << g.t << " " << g.h << " " << g.w;
    EXPECT_NE(s.message().find("picture 2"), std::string::npos) << s.message();
  }
}

}  // namespace
// manifest.json from its text (what Read does after reading the file, and what the fuzz harness
// feeds): the version, and refusals that name the file.
TEST(BitgpuManifestTest, ParseReadsTheVersionAndNamesTheFile) {
  auto m = BitgpuManifest::Parse(R"({"version": 2, "arch": {}})", "dir/manifest.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->version(), 2);
  EXPECT_EQ(m->path(), "dir/manifest.json");
  auto refused = [](std::string_view text, const std::string& part) {
    auto r = BitgpuManifest::Parse(text, "dir/manifest.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("dir/manifest.json"), std::string::npos);
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  };
  refused(R"({"version": 3})", "version");
  refused(R"({"version": "2"})", "version");
  refused("[2]", "not a JSON object");
  refused(std::string(100000, '[') + std::string(100000, ']'), "nested too deeply");
  auto config = BitgpuConfigOf(*m);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("arch."), std::string::npos);
}

}  // namespace gizllm
