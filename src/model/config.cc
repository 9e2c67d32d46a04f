#include "model/config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "model/bitgpu_manifest.h"
#include "model/encoder_arch.h"
#include "model/families/family.h"
#include "model/gguf_model.h"

namespace gizllm {

using nlohmann::json;

namespace {

// Every supported family; a new one adds its recipe here.
std::span<const Family* const> Families() {
  static const Family* const kFamilies[] = {
      &LlamaFamily(),       &Qwen2Family(),     &Qwen3Family(),          &Gemma2Family(),
      &Gemma3TextFamily(),  &Gemma3Family(),    &Qwen3MoeFamily(),       &Qwen3NextFamily(),
      &Qwen3_5TextFamily(), &Qwen3_5Family(),   &Qwen3_5MoeTextFamily(), &Qwen3_5MoeFamily(),
      &Qwen3VlFamily(),     &Qwen3VlMoeFamily()};
  return kFamilies;
}

// The family's class, or its base model's ("Qwen3Model" for Qwen3ForCausalLM: an embedder saved
// without its head, tensors named "layers.0...").
bool NamesFamily(const std::string& architecture, const Family& f) {
  if (architecture.empty()) return false;
  if (architecture == f.architecture) return true;
  constexpr std::string_view kCausal = "ForCausalLM";
  const std::string_view a = f.architecture;
  return a.ends_with(kCausal) &&
         architecture == std::string(a.substr(0, a.size() - kCausal.size())) + "Model";
}

std::string FamilyList(std::string_view Family::*what) {
  std::string s;
  for (const Family* f : Families()) {
    if (!s.empty()) s += ", ";
    s += f->*what;
  }
  return s;
}

const Family* FindFamily(std::string_view name) {
  for (const Family* f : Families()) {
    if (f->name == name) return f;
  }
  return nullptr;
}

// Whether object `j` holds the string `text` at `key`. Reads the member in place: a copy (what
// json::value() returns) recurses as deep as the member nests, and a hostile file nests deep.
bool HasString(const json& j, const char* key, const std::string& text) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() && it->get_ref<const std::string&>() == text;
}

Expected<json> ReadJson(const std::string& path) {
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return DataLoss(path + ": not valid JSON: " + e.what());
  }
}

// Token text -> id for the special tokens a tokenizer_config.json names: its
// added_tokens_decoder first, then tokenizer.json (added_tokens, then the model's vocab),
// read only when needed.
class TokenLookup {
 public:
  TokenLookup(const json& tokenizer_config, std::string dir)
      : config_(tokenizer_config), dir_(std::move(dir)) {}

  Expected<std::optional<int32_t>> Find(const std::string& content) {
    if (const json* decoder = Member(config_, "added_tokens_decoder")) {
      for (auto it = decoder->begin(); it != decoder->end(); ++it) {
        if (it->is_object() && HasString(*it, "content", content)) {
          return ParseId(it.key());
        }
      }
    }
    if (!tokenizer_loaded_) {
      tokenizer_loaded_ = true;
      const std::string path = (std::filesystem::path(dir_) / "tokenizer.json").string();
      if (FileExists(path)) {
        GZ_ASSIGN_OR_RETURN(tokenizer_, ReadJson(path));
      }
    }
    if (const json* added = Member(tokenizer_, "added_tokens"); added && added->is_array()) {
      for (const json& t : *added) {
        if (t.is_object() && HasString(t, "content", content)) {
          auto id = t.find("id");
          if (id != t.end() && id->is_number_integer()) {
            return std::optional<int32_t>(id->get<int32_t>());
          }
        }
      }
    }
    if (const json* model = Member(tokenizer_, "model")) {
      if (const json* vocab = Member(*model, "vocab")) {
        if (vocab->is_object()) {  // BPE, WordPiece: {"token": id}
          auto it = vocab->find(content);
          if (it != vocab->end() && it->is_number_integer()) {
            return std::optional<int32_t>(it->get<int32_t>());
          }
        } else if (vocab->is_array()) {  // Unigram: [[piece, score], ...], id = position
          for (size_t i = 0; i < vocab->size(); ++i) {
            const json& e = (*vocab)[i];
            if (e.is_array() && !e.empty() && e[0] == content) {
              return std::optional<int32_t>(static_cast<int32_t>(i));
            }
          }
        }
      }
    }
    return std::optional<int32_t>();
  }

 private:
  static const json* Member(const json& j, const char* key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() || (!it->is_object() && !it->is_array()) ? nullptr : &*it;
  }
  static std::optional<int32_t> ParseId(const std::string& s) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    return static_cast<int32_t>(std::stol(s));
  }

  const json& config_;
  std::string dir_;
  bool tokenizer_loaded_ = false;
  json tokenizer_;
};

// The id of tokenizer_config.json's `field` ("eos_token": a string, {"content": ...} or null).
Expected<std::optional<int32_t>> ReadSpecialToken(const ConfigReader& config,
                                                  std::string_view field, TokenLookup* lookup) {
  const json* j = config.Get(field);
  if (j == nullptr) return std::optional<int32_t>();
  std::string content;
  if (j->is_string()) {
    content = j->get<std::string>();
  } else if (j->is_object() && j->contains("content") && (*j)["content"].is_string()) {
    content = (*j)["content"].get<std::string>();
  } else {
    return config.Error(StatusCode::kInvalidArgument, field,
                        "expected a token string or {\"content\": ...}");
  }
  GZ_ASSIGN_OR_RETURN(std::optional<int32_t> id, lookup->Find(content));
  if (!id) {
    return config.Error(
        StatusCode::kInvalidArgument, field,
        "token \"" + content + "\" is in neither added_tokens_decoder nor tokenizer.json");
  }
  return id;
}

Status CheckIds(const std::vector<int32_t>& ids, int32_t bos, int64_t vocab,
                const std::string& file) {
  for (int32_t id : ids) {
    if (id >= vocab) {
      return InvalidArgument(file + ": eos token id " + std::to_string(id) +
                             " is not below vocab_size " + std::to_string(vocab));
    }
  }
  if (bos >= vocab) {
    return InvalidArgument(file + ": bos token id " + std::to_string(bos) +
                           " is not below vocab_size " + std::to_string(vocab));
  }
  return Status::Ok();
}

}  // namespace

Expected<Arch> ParseArch(const json& config, const std::string& file_for_errors) {
  const std::string& file = file_for_errors;
  if (!config.is_object()) return InvalidArgument(file + ": expected a JSON object");
  ConfigReader reader(config, file);
  GZ_ASSIGN_OR_RETURN(std::string model_type, reader.String("model_type", ""));
  std::string architecture;
  if (const json* a = reader.Get("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return reader.Error(StatusCode::kInvalidArgument, "architectures",
                          "expected a list of class names");
    }
    architecture = (*a)[0].get<std::string>();
  }
  const Family* family = nullptr;
  for (const Family* f : Families()) {
    if (model_type.empty() ? NamesFamily(architecture, *f) : f->model_type == model_type) {
      family = f;
    }
  }
  if (family == nullptr && IsEncoderModelType(model_type)) {
    return reader.Error(StatusCode::kUnimplemented, "model_type",
                        "\"" + model_type + "\" is an encoder: it embeds or scores texts " +
                            "(gizllm embed, gizllm rerank, serve --task embed|rerank) and does " +
                            "not generate (its throughput: gizllm embed --bench)");
  }
  if (family == nullptr) {
    if (model_type.empty() && architecture.empty()) {
      return reader.Error(StatusCode::kInvalidArgument, "model_type",
                          "missing (expected one of " + FamilyList(&Family::model_type) + ")");
    }
    if (model_type.empty()) {
      return reader.Error(StatusCode::kUnimplemented, "architectures",
                          "\"" + architecture + "\" is not supported (expected one of " +
                              FamilyList(&Family::architecture) + ")");
    }
    return reader.Error(StatusCode::kUnimplemented, "model_type",
                        "\"" + model_type + "\" is not supported (expected one of " +
                            FamilyList(&Family::model_type) + ")");
  }
  if (!architecture.empty() && !NamesFamily(architecture, *family)) {
    return reader.Error(StatusCode::kUnimplemented, "architectures",
                        "\"" + architecture + "\" is not supported (expected " +
                            std::string(family->architecture) + ")");
  }
  if (const json* q = reader.Get("quantization_config")) {
    // Not json::value(), which throws when the member is not a string.
    auto m = q->is_object() ? q->find("quant_method") : q->end();
    const std::string method =
        m != q->end() && m->is_string() ? m->get<std::string>() : std::string("?");
    return reader.Error(StatusCode::kUnimplemented, "quantization_config",
                        "checkpoints quantized by " + method +
                            " are not supported (expected bf16, f16 or f32 weights)");
  }
  Arch arch;
  arch.family = family->name;
  arch.architecture = family->architecture;
  GZ_RETURN_IF_ERROR(family->read(reader, &arch));
  GZ_RETURN_IF_ERROR(CheckIds(arch.eos, arch.bos, arch.vocab, file));
  return arch;
}

Expected<Arch> ReadArch(const std::string& dir) {
  namespace fs = std::filesystem;
  if (IsGgufPath(dir)) {
    GZ_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(dir));
    return ReadGgufArch(file);
  }
  if (IsBitgpuFolder(dir)) return ReadBitgpuArch(dir);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!FileExists(config_path)) {
    return NotFound(config_path + ": missing (expected a Hugging Face model folder)");
  }
  GZ_ASSIGN_OR_RETURN(json config, ReadJson(config_path));
  GZ_ASSIGN_OR_RETURN(Arch arch, ParseArch(config, config_path));

  const std::string generation_path = (fs::path(dir) / "generation_config.json").string();
  if (FileExists(generation_path)) {
    GZ_ASSIGN_OR_RETURN(json generation, ReadJson(generation_path));
    if (!generation.is_object()) return InvalidArgument(generation_path + ": expected an object");
    ConfigReader reader(generation, generation_path);
    GZ_RETURN_IF_ERROR(ReadTokenIds(reader, "eos_token_id", &arch.eos));
    if (arch.bos < 0) {
      std::vector<int32_t> bos;
      GZ_RETURN_IF_ERROR(ReadTokenIds(reader, "bos_token_id", &bos));
      if (!bos.empty()) arch.bos = bos.front();
    }
    GZ_RETURN_IF_ERROR(CheckIds(arch.eos, arch.bos, arch.vocab, generation_path));
  }

  const std::string tokenizer_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (FileExists(tokenizer_path)) {
    GZ_ASSIGN_OR_RETURN(json tokenizer, ReadJson(tokenizer_path));
    if (!tokenizer.is_object()) return InvalidArgument(tokenizer_path + ": expected an object");
    ConfigReader reader(tokenizer, tokenizer_path);
    TokenLookup lookup(tokenizer, dir);
    GZ_ASSIGN_OR_RETURN(std::optional<int32_t> eos, ReadSpecialToken(reader, "eos_token", &lookup));
    if (eos && std::find(arch.eos.begin(), arch.eos.end(), *eos) == arch.eos.end()) {
      arch.eos.push_back(*eos);
    }
    if (arch.bos < 0) {
      GZ_ASSIGN_OR_RETURN(std::optional<int32_t> bos,
                          ReadSpecialToken(reader, "bos_token", &lookup));
      if (bos) arch.bos = *bos;
    }
    GZ_RETURN_IF_ERROR(CheckIds(arch.eos, arch.bos, arch.vocab, tokenizer_path));
  }
  return arch;
}

std::string TensorName(const Arch& arch, TensorRole role, int layer) {
  const Family* family = FindFamily(arch.family);
  const std::string& prefix = arch.prefixes.empty() ? std::string("model.") : arch.prefixes[0];
  return family ? family->tensor_name(prefix, role, layer)
                : HfDecoderTensorName(prefix, role, layer);
}

std::string ExpertTensorName(const Arch& arch, TensorRole role, int layer, int expert) {
  // Expert 0's name with its index replaced: every family that has experts names them so.
  std::string name = TensorName(arch, role, layer);
  const std::string zero = ".experts.0.";
  const size_t at = name.find(zero);
  if (at == std::string::npos) return name;
  return name.substr(0, at) + ".experts." + std::to_string(expert) + "." +
         name.substr(at + zero.size());
}

bool HasMoe(const Arch& arch) {
  for (const LayerSpec& spec : arch.layer) {
    if (spec.IsMoe()) return true;
  }
  return false;
}

bool HasRecurrent(const Arch& arch) {
  for (const LayerSpec& spec : arch.layer) {
    if (spec.IsRecurrent()) return true;
  }
  return false;
}

std::vector<TensorRole> LayerRoles(const Arch& arch, int layer) {
  using R = TensorRole;
  if (layer < 0) {
    std::vector<R> roles = {R::kEmbed, R::kFinalNorm};
    if (!arch.tied_head) roles.push_back(R::kHead);
    return roles;
  }
  const LayerSpec& spec = arch.layer[layer];
  const AttentionSpec& a = spec.attention;
  std::vector<R> roles = {R::kAttnNorm, R::kFfnNorm};
  if (spec.IsRecurrent()) {
    if (spec.recurrent.fused_projections) {
      roles.insert(roles.end(), {R::kRecurrentQkvz, R::kRecurrentBa});
    } else {
      roles.insert(roles.end(), {R::kRecurrentQkv, R::kRecurrentZ, R::kRecurrentB, R::kRecurrentA});
    }
    roles.insert(roles.end(), {R::kRecurrentConv, R::kRecurrentALog, R::kRecurrentDtBias,
                               R::kRecurrentNorm, R::kRecurrentOut});
  } else {
    roles.insert(roles.end(), {R::kQ, R::kK, R::kV, R::kO});
  }
  if (spec.IsMoe()) {
    roles.insert(roles.end(), {R::kRouter, R::kExpertGate, R::kExpertUp, R::kExpertDown});
    if (spec.moe.shared_ffn > 0)
      roles.insert(roles.end(), {R::kSharedGate, R::kSharedUp, R::kSharedDown});
    if (spec.moe.shared_gate) roles.push_back(R::kSharedExpertGate);
  } else {
    roles.insert(roles.end(), {R::kGate, R::kUp, R::kDown});
  }
  if (!spec.IsRecurrent()) {
    if (a.qk_norm) roles.insert(roles.end(), {R::kQNorm, R::kKNorm});
    if (a.qkv_bias) roles.insert(roles.end(), {R::kQBias, R::kKBias, R::kVBias});
    if (a.output_bias) roles.push_back(R::kOBias);
  }
  if (!spec.IsMoe() && spec.feed_forward.bias)
    roles.insert(roles.end(), {R::kGateBias, R::kUpBias, R::kDownBias});
  if (spec.post_norms) roles.insert(roles.end(), {R::kAttnPostNorm, R::kFfnPostNorm});
  return roles;
}

Status ResolveTensorPrefix(Arch* arch, const std::function<bool(const std::string&)>& exists,
                           const std::string& where) {
  std::string tried;
  for (size_t i = 0; i < arch->prefixes.size(); ++i) {
    Arch probe = *arch;
    probe.prefixes = {arch->prefixes[i]};
    const std::string name = TensorName(probe, TensorRole::kEmbed, -1);
    if (exists(name)) {
      std::swap(arch->prefixes[0], arch->prefixes[i]);
      return Status::Ok();
    }
    tried += (tried.empty() ? "" : ", ") + name;
  }
  return NotFound(where + ": tensor " + tried + " is missing");
}

std::vector<int64_t> TensorShape(const Arch& arch, TensorRole role, int layer) {
  const int64_t dim = arch.dim;
  if (role == TensorRole::kEmbed || role == TensorRole::kHead) return {arch.vocab, dim};
  if (role == TensorRole::kFinalNorm) return {dim};
  const LayerSpec& spec = arch.layer[layer < 0 ? 0 : layer];
  const int64_t qd = spec.attention.QDim(), kvd = spec.attention.KvDim();
  const int64_t ffn = spec.feed_forward.ffn;
  switch (role) {
    case TensorRole::kEmbed:
    case TensorRole::kHead:
    case TensorRole::kFinalNorm:
      break;
    case TensorRole::kAttnNorm:
    case TensorRole::kAttnPostNorm:
    case TensorRole::kFfnNorm:
    case TensorRole::kFfnPostNorm:
    case TensorRole::kOBias:
    case TensorRole::kDownBias:
      return {dim};
    case TensorRole::kQ:
      return {spec.attention.output_gate ? 2 * qd : qd, dim};
    case TensorRole::kK:
    case TensorRole::kV:
      return {kvd, dim};
    case TensorRole::kO:
      return {dim, qd};
    case TensorRole::kQBias:
      return {qd};
    case TensorRole::kKBias:
    case TensorRole::kVBias:
      return {kvd};
    case TensorRole::kQNorm:
    case TensorRole::kKNorm:
      return {spec.attention.head_dim};
    case TensorRole::kGate:
    case TensorRole::kUp:
      return {ffn, dim};
    case TensorRole::kDown:
      return {dim, ffn};
    case TensorRole::kGateBias:
    case TensorRole::kUpBias:
      return {ffn};
    case TensorRole::kRouter:
      return {spec.moe.experts, dim};
    case TensorRole::kExpertGate:
    case TensorRole::kExpertUp:
      return {spec.moe.ffn, dim};
    case TensorRole::kExpertDown:
      return {dim, spec.moe.ffn};
    case TensorRole::kExpertsGateUp:
      return {spec.moe.experts, 2 * spec.moe.ffn, dim};
    case TensorRole::kExpertsDown:
      return {spec.moe.experts, dim, spec.moe.ffn};
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp:
      return {spec.moe.shared_ffn, dim};
    case TensorRole::kSharedDown:
      return {dim, spec.moe.shared_ffn};
    case TensorRole::kSharedExpertGate:
      return {1, dim};
    default:
      break;
  }
  const RecurrentSpec& r = spec.recurrent;
  switch (role) {
    case TensorRole::kRecurrentQkv:
      return {r.ConvDim(), dim};
    case TensorRole::kRecurrentZ:
      return {r.ValueDim(), dim};
    case TensorRole::kRecurrentB:
    case TensorRole::kRecurrentA:
      return {r.v_heads, dim};
    case TensorRole::kRecurrentQkvz:
      return {2 * r.KeyDim() + 2 * r.ValueDim(), dim};
    case TensorRole::kRecurrentBa:
      return {2 * static_cast<int64_t>(r.v_heads), dim};
    case TensorRole::kRecurrentConv:
      return {r.ConvDim(), 1, r.kernel};
    case TensorRole::kRecurrentALog:
    case TensorRole::kRecurrentDtBias:
      return {r.v_heads};
    case TensorRole::kRecurrentNorm:
      return {r.v_dim};
    case TensorRole::kRecurrentOut:
      return {dim, r.ValueDim()};
    default:
      break;
  }
  return {};
}

Status CheckTensorShape(const std::string& file, const std::string& name,
                        std::span<const int64_t> shape, std::span<const int64_t> expected) {
  if (std::equal(shape.begin(), shape.end(), expected.begin(), expected.end())) {
    return Status::Ok();
  }
  return InvalidArgument(file + ": tensor " + name + " has shape " + ShapeString(shape) +
                         ", expected " + ShapeString(expected));
}

}  // namespace gizllm
