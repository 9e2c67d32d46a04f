#include "model/pooling.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"

namespace gizllm {

using nlohmann::json;

namespace {

namespace fs = std::filesystem;

// The JSON of `path`, or null where the file is absent.
Expected<json> ReadOptionalJson(const std::string& path) {
  if (!FileExists(path)) return json();
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path + ": not valid JSON");
  return j;
}

Status Field(const std::string& file, const std::string& field, const std::string& what) {
  return InvalidArgument(file + ": field \"" + field + "\": " + what);
}

bool True(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

Status ReadPoolingModule(const std::string& path, EmbeddingConfig* config) {
  GZ_ASSIGN_OR_RETURN(json j, ReadOptionalJson(path));
  if (j.is_null()) return NotFound(path + ": missing (named by modules.json)");
  if (!j.is_object()) return InvalidArgument(path + ": expected an object");
  for (const char* refused : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                              "pooling_mode_weightedmean_tokens"}) {
    if (True(j, refused)) {
      return Unimplemented(path + ": field \"" + refused + "\": this pooling is not implemented " +
                           "(cls, mean and lasttoken are)");
    }
  }
  if (auto it = j.find("include_prompt"); it != j.end() && it->is_boolean() && !it->get<bool>()) {
    return Unimplemented(path + ": field \"include_prompt\": false is not implemented");
  }
  const bool cls = True(j, "pooling_mode_cls_token");
  const bool mean = True(j, "pooling_mode_mean_tokens");
  const bool last = True(j, "pooling_mode_lasttoken");
  if (cls + mean + last != 1) {
    return Field(path, "pooling_mode_*",
                 "expected exactly one of pooling_mode_cls_token, pooling_mode_mean_tokens, "
                 "pooling_mode_lasttoken");
  }
  config->pooling = cls ? Pooling::kCls : mean ? Pooling::kMean : Pooling::kLastToken;
  return Status::Ok();
}

Status ReadActivation(const std::string& dir, int labels, EmbeddingConfig* config) {
  config->activation = labels == 1 ? ScoreActivation::kSigmoid : ScoreActivation::kIdentity;
  const std::string path = (fs::path(dir) / "config.json").string();
  GZ_ASSIGN_OR_RETURN(json j, ReadOptionalJson(path));
  if (!j.is_object()) return Status::Ok();
  std::string field, name;
  if (auto st = j.find("sentence_transformers"); st != j.end() && st->is_object()) {
    if (auto a = st->find("activation_fn"); a != st->end() && a->is_string()) {
      field = "sentence_transformers.activation_fn";
      name = a->get<std::string>();
    }
  }
  if (auto a = j.find("sbert_ce_default_activation_function");
      field.empty() && a != j.end() && a->is_string()) {
    field = "sbert_ce_default_activation_function";
    name = a->get<std::string>();
  }
  if (field.empty()) return Status::Ok();
  if (name.ends_with(".Sigmoid")) {
    config->activation = ScoreActivation::kSigmoid;
  } else if (name.ends_with(".Identity")) {
    config->activation = ScoreActivation::kIdentity;
  } else {
    return Unimplemented(path + ": field \"" + field + "\": \"" + name +
                         "\" is not implemented (Sigmoid and Identity are)");
  }
  return Status::Ok();
}

// config.json's Matryoshka fields (is_matryoshka, matryoshka_dimensions) and a decoder
// reranker's tokens (classifier_from_token).
Status ReadMatryoshka(const std::string& dir, EmbeddingConfig* config) {
  const std::string path = (fs::path(dir) / "config.json").string();
  GZ_ASSIGN_OR_RETURN(json j, ReadOptionalJson(path));
  if (!j.is_object()) return Status::Ok();
  config->matryoshka = True(j, "is_matryoshka");
  if (auto it = j.find("matryoshka_dimensions"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty()) {
      return Field(path, "matryoshka_dimensions", "expected a list of positive integers");
    }
    for (const json& d : *it) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() == 0 || d.get<uint64_t>() > (1u << 20)) {
        return Field(path, "matryoshka_dimensions", "expected a list of positive integers");
      }
      config->matryoshka_dimensions.push_back(d.get<int64_t>());
    }
    config->matryoshka = true;
  }
  if (auto it = j.find("classifier_from_token"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_string() || !(*it)[1].is_string()) {
      return Field(path, "classifier_from_token",
                   "expected two token strings, the \"no\" and the \"yes\" answers");
    }
    config->score_tokens = it->get<std::vector<std::string>>();
  }
  return Status::Ok();
}

// config_sentence_transformers.json's prompts and default_prompt_name.
Status ReadPrompts(const std::string& dir, EmbeddingConfig* config) {
  const std::string path = (fs::path(dir) / "config_sentence_transformers.json").string();
  GZ_ASSIGN_OR_RETURN(json j, ReadOptionalJson(path));
  if (!j.is_object()) return Status::Ok();
  if (auto it = j.find("prompts"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Field(path, "prompts", "expected an object of strings");
    for (auto p = it->begin(); p != it->end(); ++p) {
      if (!p->is_string()) return Field(path, "prompts." + p.key(), "expected a string");
      config->prompts[p.key()] = p->get<std::string>();
    }
  }
  if (auto it = j.find("default_prompt_name"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || !config->prompts.count(it->get<std::string>())) {
      return Field(path, "default_prompt_name", "expected the name of one of its prompts");
    }
    config->default_prompt = it->get<std::string>();
  }
  return Status::Ok();
}

}  // namespace

Expected<std::string> PromptText(const EmbeddingConfig& config,
                                 const std::optional<std::string>& name) {
  const std::string& wanted = name ? *name : config.default_prompt;
  if (wanted.empty() && !name) return std::string();
  auto it = config.prompts.find(wanted);
  if (it != config.prompts.end()) return it->second;
  std::string known;
  for (const auto& [n, text] : config.prompts) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("no prompt named \"" + wanted + "\" (" +
                         (known.empty() ? "the model has no prompts"
                                        : "config_sentence_transformers.json has " + known) +
                         ")");
}

Status CheckDimensions(const EmbeddingConfig& config, int64_t dim, int64_t dimensions) {
  if (dimensions == dim) return Status::Ok();
  if (!config.matryoshka) {
    return InvalidArgument("must be " + std::to_string(dim) +
                           ": this model's config.json does not say it was trained for shorter "
                           "(Matryoshka) embeddings (is_matryoshka, matryoshka_dimensions)");
  }
  const auto& allowed = config.matryoshka_dimensions;
  if (allowed.empty()) {
    if (dimensions >= 1 && dimensions < dim) return Status::Ok();
    return InvalidArgument("must be from 1 to " + std::to_string(dim));
  }
  if (std::find(allowed.begin(), allowed.end(), dimensions) != allowed.end() && dimensions <= dim) {
    return Status::Ok();
  }
  std::string list;
  for (int64_t d : allowed) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return InvalidArgument("must be one of the model's Matryoshka dimensions (" + list + ") or " +
                         std::to_string(dim));
}

std::string PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kCls:
      return "cls";
    case Pooling::kMean:
      return "mean";
    case Pooling::kLastToken:
      return "lasttoken";
  }
  return "";
}

Expected<EmbeddingConfig> ReadEmbeddingConfig(const std::string& dir, int labels) {
  EmbeddingConfig config;
  GZ_RETURN_IF_ERROR(ReadActivation(dir, labels, &config));
  GZ_RETURN_IF_ERROR(ReadMatryoshka(dir, &config));
  const std::string modules_path = (fs::path(dir) / "modules.json").string();
  GZ_ASSIGN_OR_RETURN(json modules, ReadOptionalJson(modules_path));
  if (modules.is_null()) return config;
  config.sentence_transformers = true;
  if (!modules.is_array()) return InvalidArgument(modules_path + ": expected a list of modules");
  bool pooled = false;
  for (size_t i = 0; i < modules.size(); ++i) {
    const json& m = modules[i];
    const std::string at = "[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) {
      return Field(modules_path, at + ".type", "expected a module class name");
    }
    const std::string type = m["type"].get<std::string>();
    const std::string path =
        m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : std::string();
    if (path.find("..") != std::string::npos || (!path.empty() && path[0] == '/')) {
      return Field(modules_path, at + ".path", "expected a folder inside the model's");
    }
    if (type.ends_with(".Transformer")) {
      if (i != 0) return Field(modules_path, at + ".type", "the Transformer must come first");
    } else if (type.ends_with(".Pooling")) {
      GZ_RETURN_IF_ERROR(
          ReadPoolingModule((fs::path(dir) / path / "config.json").string(), &config));
      pooled = true;
    } else if (type.ends_with(".Normalize")) {
      config.normalize = true;
    } else {
      return Unimplemented(modules_path + ": field \"" + at + ".type\": \"" + type +
                           "\" is not implemented (Transformer, Pooling and Normalize are)");
    }
  }
  if (!pooled) {
    return Unimplemented(modules_path + ": no Pooling module (token embeddings are not served)");
  }
  GZ_RETURN_IF_ERROR(ReadPrompts(dir, &config));
  const std::string bert_path = (fs::path(dir) / "sentence_bert_config.json").string();
  GZ_ASSIGN_OR_RETURN(json bert, ReadOptionalJson(bert_path));
  if (bert.is_object()) {
    if (auto it = bert.find("max_seq_length"); it != bert.end() && !it->is_null()) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
          it->get<uint64_t>() > (uint64_t{1} << 24)) {
        return Field(bert_path, "max_seq_length", "expected a positive integer");
      }
      config.max_tokens = it->get<int64_t>();
    }
  }
  return config;
}

void Pool(std::span<const float> hidden, int64_t dim, std::span<const int32_t> starts,
          Pooling pooling, bool normalize, float* out) {
  const size_t sequences = starts.size() - 1;
  for (size_t s = 0; s < sequences; ++s) {
    const int64_t first = starts[s], end = starts[s + 1];
    float* o = out + s * dim;
    if (pooling == Pooling::kMean) {
      // In double, then rounded: sentence-transformers sums in float32 and divides; the sums
      // differ in the last bits only.
      for (int64_t i = 0; i < dim; ++i) {
        double sum = 0.0;
        for (int64_t r = first; r < end; ++r) sum += hidden[r * dim + i];
        o[i] = static_cast<float>(sum / static_cast<double>(end - first));
      }
    } else {
      const int64_t r = pooling == Pooling::kCls ? first : end - 1;
      for (int64_t i = 0; i < dim; ++i) o[i] = hidden[r * dim + i];
    }
    if (normalize) Normalize(o, dim);
  }
}

void Normalize(float* v, int64_t dim) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(v[i]) * v[i];
  // torch.nn.functional.normalize: x / max(||x||, 1e-12).
  const double norm = std::max(std::sqrt(ss), 1e-12);
  for (int64_t i = 0; i < dim; ++i) v[i] = static_cast<float>(v[i] / norm);
}

float Activate(ScoreActivation activation, float logit) {
  if (activation == ScoreActivation::kSigmoid) {
    return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logit))));
  }
  return logit;
}

}  // namespace gizllm
