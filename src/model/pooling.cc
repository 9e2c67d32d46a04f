#include "model/pooling.h"

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

}  // namespace

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
    if (normalize) {
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(o[i]) * o[i];
      // torch.nn.functional.normalize: x / max(||x||, 1e-12).
      const double norm = std::max(std::sqrt(ss), 1e-12);
      for (int64_t i = 0; i < dim; ++i) o[i] = static_cast<float>(o[i] / norm);
    }
  }
}

float Activate(ScoreActivation activation, float logit) {
  if (activation == ScoreActivation::kSigmoid) {
    return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logit))));
  }
  return logit;
}

}  // namespace gizllm
