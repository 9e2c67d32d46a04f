// Qwen3-VL (Qwen3VLForConditionalGeneration, model_type qwen3_vl): a Qwen3 text model
// (text_config: per-head q and k norms, attention_bias) whose rotary positions are interleaved
// M-RoPE (rope_parameters.mrope_section, [24, 20, 20] by default: time, height, width), with
// a vision tower (vision_config, model.visual.*: model/vision_tower.h) whose rows replace the
// image placeholders and whose deepstack features join the picture rows after the first
// layers. Tensors: model.language_model.*, lm_head.*.
//
// Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration, qwen3_vl_moe; text_config qwen3_vl_moe_text):
// the same tower and M-RoPE, its text model's feed-forwards mixtures of experts as Qwen3-MoE's
// (mlp.gate, the router; no shared expert), the top k always renormalized, the experts stacked
// as mlp.experts.gate_up_proj and mlp.experts.down_proj, stored [experts, dim, 2 * ffn] and
// [experts, ffn, dim] in released checkpoints (transformers transposes them at load) or in
// transformers 5's own layout.
//
// Also the towers of Qwen3.5 and Qwen3.5-MoE (qwen3_5, qwen3_5_moe), the same module without
// deepstack mergers.
#include <cmath>

#include "core/json_excerpt.h"
#include "core/mapped_file.h"
#include "model/families/family.h"
#include "model/vision_arch.h"

namespace gizllm {
namespace {

// The text model of text_config: Qwen3VLTextConfig's defaults, or Qwen3VLMoeTextConfig's
// with its mixtures of experts.
Status ReadQwen3VlText(const ConfigReader& config, bool moe, Arch* arch) {
  GZ_ASSIGN_OR_RETURN(ConfigReader text, config.Object("text_config"));
  FamilyDefaults defaults;  // Qwen3VLTextConfig, Qwen3VLMoeTextConfig
  defaults.context = 128000;
  defaults.rope_theta = 500000.0;
  defaults.vocab = 151936;
  defaults.dim = moe ? 2048 : 4096;
  defaults.ffn = moe ? 5632 : 22016;
  defaults.layers = moe ? 24 : 32;
  defaults.heads = moe ? 16 : 32;
  defaults.kv_heads = moe ? 16 : 32;
  defaults.head_dim = moe ? 0 : 128;  // Qwen3VLMoeTextConfig: hidden_size / heads
  GZ_RETURN_IF_ERROR(ReadDecoder(text, defaults, arch));
  GZ_ASSIGN_OR_RETURN(bool attention_bias, text.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  arch->mlp_bias = false;
  arch->qk_norm = true;
  // Qwen3VLTextRotaryEmbedding's default when the config gives no section.
  arch->rope.mrope_section = {24, 20, 20};
  GZ_RETURN_IF_ERROR(ReadMropeSection(text, &arch->rope));
  arch->UniformLayers();
  if (moe) {
    // Qwen3VLMoeTextSparseMoeBlock: no shared expert; its router always renormalizes the top k
    // (a norm_topk_prob in the config changes nothing); released checkpoints store the stacked
    // experts transposed.
    MoeDefaults experts;
    experts.experts = 60;
    experts.experts_per_token = 4;
    experts.ffn = 1408;
    experts.always_normalizes = true;
    experts.transposed_stacks = true;
    GZ_RETURN_IF_ERROR(ReadSparseFeedForwards(text, experts, arch));
  }
  GZ_RETURN_IF_ERROR(ReadConditionalTop(config, text, arch));
  arch->skipped_prefixes = {"model.visual."};
  static constexpr std::string_view kMoeRead[] = {"num_experts", "num_local_experts",
                                                  "moe_intermediate_size"};
  return RefuseUnimplemented(text, moe ? std::span<const std::string_view>(kMoeRead)
                                       : std::span<const std::string_view>());
}

Status ReadQwen3Vl(const ConfigReader& config, Arch* arch) {
  return ReadQwen3VlText(config, /*moe=*/false, arch);
}
Status ReadQwen3VlMoe(const ConfigReader& config, Arch* arch) {
  return ReadQwen3VlText(config, /*moe=*/true, arch);
}

// An int field of vision_config in [lo, hi].
Expected<int64_t> Ranged(const ConfigReader& config, std::string_view field, int64_t fallback,
                         int64_t lo, int64_t hi) {
  GZ_ASSIGN_OR_RETURN(int64_t v, config.Int(field, fallback));
  if (v < lo || v > hi) {
    return config.Error(StatusCode::kInvalidArgument, field,
                        "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(v));
  }
  return v;
}

}  // namespace

const Family& Qwen3VlFamily() {
  static constexpr Family kFamily{"qwen3_vl", "qwen3_vl", "Qwen3VLForConditionalGeneration",
                                  &ReadQwen3Vl, &HfDecoderTensorName};
  return kFamily;
}

const Family& Qwen3VlMoeFamily() {
  static constexpr Family kFamily{"qwen3_vl_moe", "qwen3_vl_moe",
                                  "Qwen3VLMoeForConditionalGeneration", &ReadQwen3VlMoe,
                                  &HfDecoderTensorName};
  return kFamily;
}

Expected<VisionArch> ParseVisionArch(const nlohmann::json& config, const std::string& file) {
  if (!config.is_object()) return InvalidArgument(file + ": expected a JSON object");
  ConfigReader top(config, file);
  GZ_ASSIGN_OR_RETURN(std::string model_type, top.String("model_type", ""));
  VisionArch v;
  v.family = model_type;
  const bool qwen3_5 = model_type == "qwen3_5" || model_type == "qwen3_5_moe";
  if (model_type != "qwen3_vl" && model_type != "qwen3_vl_moe" && !qwen3_5) {
    return top.Error(StatusCode::kUnimplemented, "model_type",
                     "\"" + model_type +
                         "\" has no vision tower gizllm runs (expected qwen3_vl, qwen3_vl_moe, "
                         "qwen3_5 or qwen3_5_moe)");
  }
  if (!top.Has("vision_config")) {
    return top.Error(StatusCode::kNotFound, "vision_config",
                     "missing: the model has no vision tower");
  }
  GZ_ASSIGN_OR_RETURN(ConfigReader c, top.Object("vision_config"));
  // Qwen3VLVisionConfig's defaults (Qwen3.5's tower is the same module without deepstack).
  constexpr int64_t kBig = int64_t{1} << 20;
  GZ_ASSIGN_OR_RETURN(int64_t depth, Ranged(c, "depth", 27, 1, 1024));
  GZ_ASSIGN_OR_RETURN(v.dim, Ranged(c, "hidden_size", 1152, 1, kBig));
  GZ_ASSIGN_OR_RETURN(v.ffn, Ranged(c, "intermediate_size", 4304, 1, kBig));
  GZ_ASSIGN_OR_RETURN(int64_t heads, Ranged(c, "num_heads", 16, 1, 4096));
  GZ_ASSIGN_OR_RETURN(int64_t channels, Ranged(c, "in_channels", 3, 1, 64));
  GZ_ASSIGN_OR_RETURN(int64_t patch, Ranged(c, "patch_size", 16, 1, 1024));
  GZ_ASSIGN_OR_RETURN(int64_t merge, Ranged(c, "spatial_merge_size", 2, 1, 64));
  GZ_ASSIGN_OR_RETURN(int64_t temporal, Ranged(c, "temporal_patch_size", 2, 1, 64));
  GZ_ASSIGN_OR_RETURN(v.out_dim, Ranged(c, "out_hidden_size", 3584, 1, kBig));
  GZ_ASSIGN_OR_RETURN(v.positions, Ranged(c, "num_position_embeddings", 2304, 1, kBig));
  v.depth = static_cast<int>(depth);
  v.heads = static_cast<int>(heads);
  v.channels = static_cast<int>(channels);
  v.patch = static_cast<int>(patch);
  v.merge = static_cast<int>(merge);
  v.temporal_patch = static_cast<int>(temporal);
  if (v.dim % v.heads != 0) {
    return c.Error(
        StatusCode::kInvalidArgument, "num_heads",
        std::to_string(v.heads) + " does not divide hidden_size " + std::to_string(v.dim));
  }
  v.head_dim = static_cast<int>(v.dim / v.heads);
  // The 2-D rotation gives each of height and width a quarter of a head's dims in pairs.
  if (v.head_dim % 4 != 0) {
    return c.Error(StatusCode::kInvalidArgument, "num_heads",
                   "gives head_dim " + std::to_string(v.head_dim) +
                       ", expected a multiple of 4 (the height and width rotations)");
  }
  v.grid_side = static_cast<int>(std::llround(std::sqrt(static_cast<double>(v.positions))));
  if (static_cast<int64_t>(v.grid_side) * v.grid_side != v.positions) {
    return c.Error(StatusCode::kInvalidArgument, "num_position_embeddings",
                   std::to_string(v.positions) + " is not a square (the table is side x side)");
  }
  GZ_ASSIGN_OR_RETURN(std::string act, c.String("hidden_act", "gelu_pytorch_tanh"));
  if (act == "gelu_pytorch_tanh") {
    v.act = VisionAct::kGeluTanh;
  } else if (act == "gelu") {
    v.act = VisionAct::kGelu;
  } else {
    return c.Error(StatusCode::kUnimplemented, "hidden_act",
                   "\"" + act + "\" is not supported (expected gelu_pytorch_tanh or gelu)");
  }
  // transformers 5 writes the 2-D rotation as rope_parameters {rope_type: axial, rope_theta}.
  if (c.Has("rope_parameters")) {
    GZ_ASSIGN_OR_RETURN(ConfigReader rope, c.Object("rope_parameters"));
    GZ_ASSIGN_OR_RETURN(std::string type, rope.String("rope_type", "axial"));
    if (type != "axial" && type != "default") {
      return rope.Error(StatusCode::kUnimplemented, "rope_type",
                        "\"" + type + "\" is not supported (expected axial)");
    }
    GZ_ASSIGN_OR_RETURN(v.rope_theta, rope.Double("rope_theta", 10000.0));
    if (!(v.rope_theta > 0) || !std::isfinite(v.rope_theta)) {
      return rope.Error(StatusCode::kInvalidArgument, "rope_theta", "must be a positive number");
    }
  }
  if (!qwen3_5) {
    v.deepstack = {8, 16, 24};
    if (const nlohmann::json* list = c.Get("deepstack_visual_indexes")) {
      v.deepstack.clear();
      bool ok = list->is_array();
      for (size_t i = 0; ok && i < list->size(); ++i) {
        const nlohmann::json& e = (*list)[i];
        ok = e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < v.depth &&
             (v.deepstack.empty() || e.get<int64_t>() > v.deepstack.back());
        if (ok) v.deepstack.push_back(static_cast<int>(e.get<int64_t>()));
      }
      if (!ok) {
        return c.Error(StatusCode::kInvalidArgument, "deepstack_visual_indexes",
                       "expected increasing block indices in [0, " + std::to_string(v.depth) +
                           "), got " + JsonExcerpt(*list, 60));
      }
    }
  }
  // Qwen3VLConfig's and Qwen3_5Config's token ids.
  auto token = [&](std::string_view field, int64_t fallback, int32_t* out) -> Status {
    GZ_ASSIGN_OR_RETURN(int64_t id, top.Int(field, fallback));
    if (id < 0 || id > INT32_MAX) {
      return top.Error(StatusCode::kInvalidArgument, field,
                       "must be a token id, got " + std::to_string(id));
    }
    *out = static_cast<int32_t>(id);
    return Status::Ok();
  };
  GZ_RETURN_IF_ERROR(token("image_token_id", qwen3_5 ? 248056 : 151655, &v.image_token));
  GZ_RETURN_IF_ERROR(token("video_token_id", qwen3_5 ? 248057 : 151656, &v.video_token));
  GZ_RETURN_IF_ERROR(token("vision_start_token_id", qwen3_5 ? 248053 : 151652, &v.vision_start));
  GZ_RETURN_IF_ERROR(token("vision_end_token_id", qwen3_5 ? 248054 : 151653, &v.vision_end));
  return v;
}

Expected<VisionArch> ReadVisionArch(const std::string& dir) {
  const std::string path = dir + "/config.json";
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(path + ": not valid JSON: " + e.what());
  }
  return ParseVisionArch(config, path);
}

Status CheckVisionGrid(const VisionArch& arch, const VisionGrid& grid, int index) {
  constexpr int64_t kMaxSide = int64_t{1} << 14;
  const std::string which = "picture " + std::to_string(index) + ": grid [" +
                            std::to_string(grid.t) + ", " + std::to_string(grid.h) + ", " +
                            std::to_string(grid.w) + "]";
  if (grid.t < 1 || grid.h < 1 || grid.w < 1 || grid.t > kMaxSide || grid.h > kMaxSide ||
      grid.w > kMaxSide) {
    return InvalidArgument(which + ": each of t, h, w must be in [1, " + std::to_string(kMaxSide) +
                           "]");
  }
  if (grid.h % arch.merge != 0 || grid.w % arch.merge != 0) {
    return InvalidArgument(which + ": h and w must be multiples of the merge size " +
                           std::to_string(arch.merge));
  }
  return Status::Ok();
}

}  // namespace gizllm
