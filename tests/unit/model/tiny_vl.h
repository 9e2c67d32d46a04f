// A small random Qwen3-VL language model (head_dim 32, which the CUDA attention takes; or
// Qwen3-VL-MoE's, the same with mixtures of experts)
// (Qwen3VLForConditionalGeneration, float32 tensors: the text model and one tower tensor it leaves
// in the file, or with `tower` a whole small tower and its preprocessor_config.json: patch 2,
// merge 2, so a picture of 4 x 4 pixels per row of the language model) written to a folder, and
// picture inputs for a prompt with two pictures, for the model and engine tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "formats/safetensors.h"
#include "model/mrope.h"
#include "model/vision_arch.h"

namespace gizllm::tiny_vl {

constexpr int kVocab = 48, kDim = 32, kHeads = 2, kKvHeads = 1, kHeadDim = 32, kFfn = 40,
              kLayers = 3;
constexpr int32_t kImage = 40, kStart = 41, kVideo = 42, kEnd = 43;

// The tower's side as the language model sees it: merge 2 and the token ids above.
inline VisionArch Vision() {
  VisionArch a;
  a.merge = 2;
  a.image_token = kImage;
  a.video_token = kVideo;
  a.vision_start = kStart;
  return a;
}

// Qwen3-VL-MoE (qwen3_vl_moe): every layer's feed-forward a mixture of kExperts experts of width
// kFfn, kTopK a token. kIdentical: every expert is the dense model's MLP (the logits are then
// the dense folder's, up to rounding); the other layouts hold expert 0 as that MLP and the
// others random, stacked as released checkpoints store them (gate_up_proj [experts, dim,
// 2 * ffn], down_proj [experts, ffn, dim]), as transformers 5 holds them ([experts, 2 * ffn,
// dim], [experts, dim, ffn]) or one tensor per expert.
enum class Experts { kNone, kIdentical, kTransposed, kStacked, kPerExpert };
constexpr int kExperts = 4, kTopK = 2;

// Writes the folder; returns the embedding table [kVocab, kDim].
inline std::vector<float> Write(const std::string& dir, bool tower = false,
                                Experts experts = Experts::kNone) {
  std::mt19937 rng(11);
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale,
                 float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& f : v) f = d(rng);
    t[name] = {std::move(shape), std::move(v)};
  };
  const std::string p = "model.language_model.";
  add(p + "embed_tokens.weight", {kVocab, kDim}, 1.0f);
  add(p + "norm.weight", {kDim}, 0.2f, 1.0f);
  add("lm_head.weight", {kVocab, kDim}, 0.3f);
  for (int l = 0; l < kLayers; ++l) {
    const std::string x = p + "layers." + std::to_string(l) + ".";
    add(x + "input_layernorm.weight", {kDim}, 0.2f, 1.0f);
    add(x + "post_attention_layernorm.weight", {kDim}, 0.2f, 1.0f);
    add(x + "self_attn.q_proj.weight", {kHeads * kHeadDim, kDim}, 0.3f);
    add(x + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.3f);
    add(x + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.3f);
    add(x + "self_attn.o_proj.weight", {kDim, kHeads * kHeadDim}, 0.3f);
    add(x + "self_attn.q_norm.weight", {kHeadDim}, 0.2f, 1.0f);
    add(x + "self_attn.k_norm.weight", {kHeadDim}, 0.2f, 1.0f);
    add(x + "mlp.gate_proj.weight", {kFfn, kDim}, 0.3f);
    add(x + "mlp.up_proj.weight", {kFfn, kDim}, 0.3f);
    add(x + "mlp.down_proj.weight", {kDim, kFfn}, 0.3f);
  }
  // The tower: its tensors are left in the file by the language model.
  constexpr int kTowerDim = 16, kTowerFfn = 24, kMerged = kTowerDim * 4, kPatchFloats = 24;
  const std::string v = "model.visual.";
  if (!tower) {
    add(v + "pos_embed.weight", {4, 8}, 1.0f);
  } else {
    add(v + "patch_embed.proj.weight", {kTowerDim, 3, 2, 2, 2}, 0.3f);
    add(v + "patch_embed.proj.bias", {kTowerDim}, 0.2f);
    add(v + "pos_embed.weight", {9, kTowerDim}, 0.5f);
    const std::string b = v + "blocks.0.";
    for (const char* n : {"norm1", "norm2"}) {
      add(b + n + ".weight", {kTowerDim}, 0.2f, 1.0f);
      add(b + n + ".bias", {kTowerDim}, 0.2f);
    }
    add(b + "attn.qkv.weight", {3 * kTowerDim, kTowerDim}, 0.4f);
    add(b + "attn.qkv.bias", {3 * kTowerDim}, 0.2f);
    add(b + "attn.proj.weight", {kTowerDim, kTowerDim}, 0.3f);
    add(b + "attn.proj.bias", {kTowerDim}, 0.2f);
    add(b + "mlp.linear_fc1.weight", {kTowerFfn, kTowerDim}, 0.3f);
    add(b + "mlp.linear_fc1.bias", {kTowerFfn}, 0.2f);
    add(b + "mlp.linear_fc2.weight", {kTowerDim, kTowerFfn}, 0.3f);
    add(b + "mlp.linear_fc2.bias", {kTowerDim}, 0.2f);
    for (const std::string& m : {v + "merger.", v + "deepstack_merger_list.0."}) {
      const int64_t norm = m == v + "merger." ? kTowerDim : kMerged;
      add(m + "norm.weight", {norm}, 0.2f, 1.0f);
      add(m + "norm.bias", {norm}, 0.2f);
      add(m + "linear_fc1.weight", {kMerged, kMerged}, 0.2f);
      add(m + "linear_fc1.bias", {kMerged}, 0.2f);
      add(m + "linear_fc2.weight", {kDim, kMerged}, 0.2f);
      add(m + "linear_fc2.bias", {kDim}, 0.2f);
    }
    static_assert(kPatchFloats == 3 * 2 * 2 * 2);
  }
  if (experts != Experts::kNone) {
    std::mt19937 expert_rng(13);
    std::normal_distribution<float> d(0.0f, 0.3f);
    for (int l = 0; l < kLayers; ++l) {
      const std::string x = p + "layers." + std::to_string(l) + ".mlp.";
      std::vector<float> dense[3];  // gate, up [kFfn, kDim]; down [kDim, kFfn]
      const char* parts[] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
      for (int i = 0; i < 3; ++i) {
        dense[i] = t[x + parts[i]].second;
        t.erase(x + parts[i]);
      }
      add(x + "gate.weight", {kExperts, kDim}, 1.0f);
      // Expert e's gate, up and down as the dense ones are laid out.
      std::vector<std::vector<float>> each[3];
      for (int e = 0; e < kExperts; ++e) {
        for (int i = 0; i < 3; ++i) {
          std::vector<float> w = dense[i];
          if (e > 0 && experts != Experts::kIdentical)
            for (float& v : w) v = d(expert_rng);
          each[i].push_back(std::move(w));
        }
      }
      if (experts == Experts::kPerExpert) {
        for (int e = 0; e < kExperts; ++e) {
          const std::string n = x + "experts." + std::to_string(e) + ".";
          t[n + parts[0]] = {{kFfn, kDim}, each[0][e]};
          t[n + parts[1]] = {{kFfn, kDim}, each[1][e]};
          t[n + parts[2]] = {{kDim, kFfn}, each[2][e]};
        }
        continue;
      }
      const bool transposed = experts != Experts::kStacked;
      std::vector<float> gate_up(kExperts * 2 * kFfn * kDim), down(kExperts * kDim * kFfn);
      for (int e = 0; e < kExperts; ++e) {
        for (int r = 0; r < kFfn; ++r) {
          for (int c = 0; c < kDim; ++c) {
            for (int half = 0; half < 2; ++half) {
              const float v = each[half][e][r * kDim + c];
              const int64_t at = transposed ? (e * kDim + c) * 2 * kFfn + half * kFfn + r
                                            : (e * 2 * kFfn + half * kFfn + r) * kDim + c;
              gate_up[at] = v;
            }
            const float v = each[2][e][c * kFfn + r];
            down[transposed ? (e * kFfn + r) * kDim + c : (e * kDim + c) * kFfn + r] = v;
          }
        }
      }
      t[x + "experts.gate_up_proj"] = {transposed ? std::vector<int64_t>{kExperts, kDim, 2 * kFfn}
                                                  : std::vector<int64_t>{kExperts, 2 * kFfn, kDim},
                                       gate_up};
      t[x + "experts.down_proj"] = {transposed ? std::vector<int64_t>{kExperts, kFfn, kDim}
                                               : std::vector<int64_t>{kExperts, kDim, kFfn},
                                    down};
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> out;
  for (const auto& [n, v] : t)
    out.push_back({n, DType::kF32, v.first, v.second.data(), v.second.size() * sizeof(float)});
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", out, {}).ok());
  nlohmann::json config = {{"architectures", {"Qwen3VLForConditionalGeneration"}},
                           {"model_type", "qwen3_vl"},
                           {"image_token_id", kImage},
                           {"video_token_id", kVideo},
                           {"vision_start_token_id", kStart},
                           {"vision_end_token_id", kEnd},
                           {"tie_word_embeddings", false},
                           {"text_config",
                            {{"vocab_size", kVocab},
                             {"hidden_size", kDim},
                             {"intermediate_size", kFfn},
                             {"num_hidden_layers", kLayers},
                             {"num_attention_heads", kHeads},
                             {"num_key_value_heads", kKvHeads},
                             {"head_dim", kHeadDim},
                             {"rms_norm_eps", 1e-6},
                             {"max_position_embeddings", 256},
                             {"rope_parameters",
                              {{"rope_type", "default"},
                               {"rope_theta", 10000.0},
                               {"mrope_section", {4, 6, 6}},
                               {"mrope_interleaved", true}}}}},
                           {"vision_config",
                            {{"depth", 1},
                             {"hidden_size", 8},
                             {"num_heads", 2},
                             {"out_hidden_size", kDim},
                             {"num_position_embeddings", 4},
                             {"deepstack_visual_indexes", {0}}}}};
  if (tower) {
    config["vision_config"] = {{"depth", 1},
                               {"hidden_size", kTowerDim},
                               {"intermediate_size", kTowerFfn},
                               {"num_heads", 2},
                               {"in_channels", 3},
                               {"patch_size", 2},
                               {"temporal_patch_size", 2},
                               {"spatial_merge_size", 2},
                               {"out_hidden_size", kDim},
                               {"num_position_embeddings", 9},
                               {"deepstack_visual_indexes", {0}}};
    nlohmann::json processor = {{"patch_size", 2},
                                {"merge_size", 2},
                                {"temporal_patch_size", 2},
                                {"size", {{"shortest_edge", 16}, {"longest_edge", 4096}}},
                                {"image_mean", {0.5, 0.5, 0.5}},
                                {"image_std", {0.5, 0.5, 0.5}}};
    std::ofstream(dir + "/preprocessor_config.json") << processor.dump();
    // Videos: Qwen3-VL's sampling (2 frames a second, at least 4), the pixels of all sampled
    // frames together within the size.
    nlohmann::json video = processor;
    video["size"] = {{"shortest_edge", 64}, {"longest_edge", 16384}};
    video["fps"] = 2;
    video["min_frames"] = 4;
    video["max_frames"] = 16;
    std::ofstream(dir + "/video_preprocessor_config.json") << video.dump();
  }
  if (experts != Experts::kNone) {
    config["architectures"] = {"Qwen3VLMoeForConditionalGeneration"};
    config["model_type"] = "qwen3_vl_moe";
    config["text_config"]["num_experts"] = kExperts;
    config["text_config"]["num_experts_per_tok"] = kTopK;
    config["text_config"]["moe_intermediate_size"] = kFfn;
  }
  std::ofstream(dir + "/config.json") << config.dump();
  return t[p + "embed_tokens.weight"].second;
}

// The prompt: text, two pictures (grids [1, 4, 6] and [1, 2, 4]: 6 and 2 rows), text.
inline std::vector<int32_t> Prompt() {
  std::vector<int32_t> ids = {1, 2, kStart};
  ids.insert(ids.end(), 6, kImage);
  ids.insert(ids.end(), {kEnd, 7, kStart});
  ids.insert(ids.end(), 2, kImage);
  ids.insert(ids.end(), {kEnd, 9, 10});
  return ids;
}
inline std::vector<VisionGrid> Grids() { return {{1, 4, 6}, {1, 2, 4}}; }

// The prompt's pictures: random rows (seeded) and deepstack features of `layers` layers.
inline PromptPictures Pictures(int layers, float deepstack_scale = 0.5f, uint32_t seed = 5) {
  PromptPictures p;
  auto pos = ComputeMropePositions(Vision(), Prompt(), Grids());
  EXPECT_TRUE(pos.ok()) << pos.status().message();
  p.positions = *pos;
  const std::vector<int32_t> ids = Prompt();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == kImage) p.rows.push_back(static_cast<int32_t>(i));
  const int64_t count = static_cast<int64_t>(p.rows.size());
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  p.embeddings.resize(count * kDim);
  for (float& v : p.embeddings) v = d(rng);
  p.layers = layers;
  p.deepstack.resize(layers * count * kDim);
  for (float& v : p.deepstack) v = deepstack_scale * d(rng);
  return p;
}

// A character tokenizer for the folder (ids 0..39 the characters of kChars, enough for the
// prompts and for timestamps such as "<2.5 seconds>"; 40.. Qwen's special
// tokens at the ids above) and the Qwen2-VL chat template (image parts as
// <|vision_start|><|image_pad|><|vision_end|>, video parts with <|video_pad|>).
inline const std::string kChars = "abcdefghijklmnopqrstuvwxyz \n.,<?:>012345";  // ids 0..39
constexpr int32_t kImStart = 44, kImEnd = 45;

inline const char* kTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// `merges` ("a b", BPE's form) add the merged tokens at ids 48 on (beyond the model's vocab: for
// tests that only tokenize).
inline void WriteTokenizer(const std::string& dir, const std::vector<std::string>& merges = {}) {
  static_assert(tiny_vl::kImage == 40 && tiny_vl::kStart == 41 && tiny_vl::kVideo == 42 &&
                tiny_vl::kEnd == 43);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < kChars.size(); ++i) vocab[std::string(1, kChars[i])] = i;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const char* specials[] = {"<|image_pad|>", "<|vision_start|>", "<|video_pad|>", "<|vision_end|>",
                            "<|im_start|>",  "<|im_end|>",       "<|endoftext|>", "<|box_start|>"};
  for (int i = 0; i < 8; ++i) {
    vocab[specials[i]] = 40 + i;
    added.push_back({{"id", 40 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string merged = merges[i];
    merged.erase(merged.find(' '), 1);
    vocab[merged] = 48 + i;
  }
  nlohmann::ordered_json tokenizer = {{"version", "1.0"},
                                      {"truncation", nullptr},
                                      {"padding", nullptr},
                                      {"added_tokens", added},
                                      {"normalizer", nullptr},
                                      {"pre_tokenizer", nullptr},
                                      {"post_processor", nullptr},
                                      {"decoder", {{"type", "Fuse"}}},
                                      {"model",
                                       {{"type", "BPE"},
                                        {"dropout", nullptr},
                                        {"unk_token", nullptr},
                                        {"continuing_subword_prefix", nullptr},
                                        {"end_of_word_suffix", nullptr},
                                        {"fuse_unk", false},
                                        {"byte_fallback", false},
                                        {"vocab", vocab},
                                        {"merges", merges}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  nlohmann::ordered_json config = {{"chat_template", kTemplate}, {"eos_token", "<|im_end|>"}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
}

inline void Append(std::vector<int32_t>* ids, const std::string& text) {
  for (char c : text) {
    const size_t id = kChars.find(c);
    CHECK(id != std::string::npos);
    ids->push_back(static_cast<int32_t>(id));
  }
}

}  // namespace gizllm::tiny_vl
