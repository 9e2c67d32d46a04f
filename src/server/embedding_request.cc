#include "server/embedding_request.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <numeric>
#include <set>

namespace gizllm::server {

using nlohmann::json;

std::string TaskName(Task t) {
  switch (t) {
    case Task::kGenerate:
      return "generate";
    case Task::kEmbed:
      return "embed";
    case Task::kRerank:
      return "rerank";
  }
  return "";
}

Expected<Task> ParseTask(std::string_view text) {
  if (text == "generate") return Task::kGenerate;
  if (text == "embed") return Task::kEmbed;
  if (text == "rerank") return Task::kRerank;
  return InvalidArgument("--task: \"" + std::string(text) +
                         "\" is not a task (expected generate, embed or rerank)");
}

namespace {

// Fields outside `known` are refused, naming the first.
std::optional<ApiError> Unknown(const json& body, const std::set<std::string>& known) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!known.count(it.key())) {
      return BadRequest("unknown field '" + it.key() + "'", it.key(), "unknown_field");
    }
  }
  return std::nullopt;
}

// The checks every route shares: a JSON object, known fields, "model" (a string) that names the
// served model where given.
std::optional<ApiError> Common(EncoderModel& model, const json& body,
                               const std::set<std::string>& known) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  if (auto e = Unknown(body, known)) return e;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return BadRequest("'model' must be a string", "model", "invalid_type");
    if (it->get<std::string>() != model.Name()) {
      return ApiError{404, "The model '" + it->get<std::string>() + "' does not exist.",
                      "invalid_request_error", "model", "model_not_found"};
    }
  }
  return std::nullopt;
}

json Usage(int64_t tokens) { return {{"prompt_tokens", tokens}, {"total_tokens", tokens}}; }

std::string Base64(std::span<const float> v) {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) n |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) n |= static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kChars[(n >> 18) & 63]);
    out.push_back(kChars[(n >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kChars[(n >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kChars[n & 63] : '=');
  }
  return out;
}

// Reads a list of texts: a string or an array of strings (not empty, at most kMaxEncoderInputs).
std::optional<ApiError> Texts(const json& body, const std::string& field,
                              std::vector<std::string>* out, bool* single = nullptr) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return BadRequest("'" + field + "' is required", field, "missing_field");
  }
  if (single) *single = it->is_string();
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (!it->is_array()) {
    return BadRequest("'" + field + "' must be a string or an array of strings", field,
                      "invalid_type");
  }
  if (it->empty()) return BadRequest("'" + field + "' must not be empty", field);
  if (it->size() > kMaxEncoderInputs) {
    return BadRequest(
        "'" + field + "' holds more than " + std::to_string(kMaxEncoderInputs) + " texts", field);
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (e.is_string()) {
      out->push_back(e.get<std::string>());
    } else if (e.is_object() && e.contains("text") && e["text"].is_string()) {
      out->push_back(e["text"].get<std::string>());  // Cohere's and Jina's documents
    } else {
      return BadRequest("'" + at + "' must be a string", at, "invalid_type");
    }
  }
  return std::nullopt;
}

PreparedEncoderRequest Refuse(ApiError e) { return {EncoderJob{}, std::move(e)}; }
PreparedEncoderRequest Refuse(const std::string& message, const std::string& param) {
  return Refuse(BadRequest(message, param, "invalid_value"));
}

// Cuts a vector to its first `dimensions` floats, normalized again where the model normalizes
// (sentence-transformers' truncate_dim with normalize_embeddings, vLLM's dimensions).
void Cut(int64_t dimensions, bool normalize, std::vector<float>* v) {
  if (dimensions <= 0 || dimensions >= static_cast<int64_t>(v->size())) return;
  v->resize(dimensions);
  if (!normalize) return;
  double ss = 0.0;
  for (float x : *v) ss += static_cast<double>(x) * x;
  const double norm = std::max(std::sqrt(ss), 1e-12);
  for (float& x : *v) x = static_cast<float>(x / norm);
}

}  // namespace

PreparedEncoderRequest PrepareEmbeddings(EncoderModel& model, const json& body) {
  if (auto e = Common(model, body,
                      {"model", "input", "encoding_format", "dimensions", "user",
                       "truncate_prompt_tokens", "prompt_name"})) {
    return Refuse(*e);
  }
  bool base64 = false;
  if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "float" && *it != "base64")) {
      return Refuse("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    }
    base64 = *it == "base64";
  }
  int64_t dimensions = 0;  // 0: the model's
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Refuse("'dimensions' must be an integer", "dimensions");
    if (Status s = model.CheckDimensions(it->get<int64_t>()); !s.ok()) {
      return Refuse("'dimensions' " + s.message(), "dimensions");
    }
    dimensions = it->get<int64_t>();
  }
  std::optional<std::string> prompt_name;
  if (auto it = body.find("prompt_name"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return Refuse("'prompt_name' must be a string", "prompt_name");
    prompt_name = it->get<std::string>();
  }
  Expected<std::string> prompt = model.Prompt(prompt_name);
  if (!prompt.ok()) return Refuse("'prompt_name': " + prompt.status().message(), "prompt_name");
  int64_t limit = 0;  // 0: refuse texts longer than the model's positions
  if (auto it = body.find("truncate_prompt_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() == 0 || it->get<int64_t>() < -1) {
      return Refuse("'truncate_prompt_tokens' must be -1 (the model's positions) or positive",
                    "truncate_prompt_tokens");
    }
    limit = std::min<int64_t>(it->get<int64_t>() == -1 ? model.MaxTokens() : it->get<int64_t>(),
                              model.MaxTokens());
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) {
    return Refuse(BadRequest("'input' is required", "input", "missing_field"));
  }
  std::vector<Encoding> sequences;
  auto tokens = [&](const json& a, const std::string& at) -> std::optional<ApiError> {
    if (a.empty()) return BadRequest("'" + at + "' must not be empty", at);
    Encoding e;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() || a[i].get<int64_t>() < 0 ||
          a[i].get<int64_t>() >= model.Vocab()) {
        const std::string where = at + "[" + std::to_string(i) + "]";
        return BadRequest(
            "'" + where + "' must be a token id in [0, " + std::to_string(model.Vocab()) + ")",
            where);
      }
      e.ids.push_back(a[i].get<int32_t>());
    }
    if (limit > 0 && static_cast<int64_t>(e.ids.size()) > limit) e.ids.resize(limit);
    if (static_cast<int64_t>(e.ids.size()) > model.MaxTokens()) {
      return BadRequest("'" + at + "' holds " + std::to_string(e.ids.size()) +
                            " tokens, more than the model's " + std::to_string(model.MaxTokens()) +
                            " (truncate_prompt_tokens cuts)",
                        at, "context_length_exceeded");
    }
    e.types.assign(e.ids.size(), 0);
    sequences.push_back(std::move(e));
    return std::nullopt;
  };
  auto text = [&](const std::string& s, const std::string& at) -> std::optional<ApiError> {
    if (s.empty()) return BadRequest("'" + at + "' must not be empty", at);
    Expected<Encoding> e = model.Tokenize(*prompt + s, limit > 0 ? limit : model.MaxTokens() + 1);
    if (!e.ok()) return FromStatus(e.status(), at);
    if (static_cast<int64_t>(e->ids.size()) > model.MaxTokens()) {
      return BadRequest("'" + at + "' is longer than the model's " +
                            std::to_string(model.MaxTokens()) +
                            " tokens (truncate_prompt_tokens cuts)",
                        at, "context_length_exceeded");
    }
    sequences.push_back(std::move(e).value());
    return std::nullopt;
  };
  std::optional<ApiError> error;
  if (input->is_string()) {
    error = text(input->get<std::string>(), "input");
  } else if (input->is_array() && !input->empty() && (*input)[0].is_number()) {
    error = tokens(*input, "input");
  } else if (input->is_array()) {
    if (input->empty()) return Refuse("'input' must not be empty", "input");
    if (input->size() > kMaxEncoderInputs) {
      return Refuse("'input' holds more than " + std::to_string(kMaxEncoderInputs) + " inputs",
                    "input");
    }
    for (size_t i = 0; i < input->size() && !error; ++i) {
      const json& e = (*input)[i];
      const std::string at = "input[" + std::to_string(i) + "]";
      if (e.is_string()) {
        error = text(e.get<std::string>(), at);
      } else if (e.is_array()) {
        error = tokens(e, at);
      } else {
        error = BadRequest("'" + at + "' must be a string or an array of token ids", at,
                           "invalid_type");
      }
    }
  } else {
    error = BadRequest("'input' must be a string, an array of strings or token ids", "input",
                       "invalid_type");
  }
  if (error) return Refuse(*error);
  int64_t used = 0;
  for (const Encoding& e : sequences) used += static_cast<int64_t>(e.ids.size());
  PreparedEncoderRequest prepared;
  prepared.job.sequences = std::move(sequences);
  prepared.job.answer = [name = model.Name(), normalize = model.Normalizes(), base64, dimensions,
                         used](EncoderResults results) -> EncoderAnswer {
    json data = json::array();
    for (size_t i = 0; i < results.vectors.size(); ++i) {
      Cut(dimensions, normalize, &results.vectors[i]);
      json item = {{"object", "embedding"}, {"index", i}};
      if (base64) {
        item["embedding"] = Base64(results.vectors[i]);
      } else {
        item["embedding"] = results.vectors[i];
      }
      data.push_back(std::move(item));
    }
    return {
        json{
            {"object", "list"}, {"data", std::move(data)}, {"model", name}, {"usage", Usage(used)}},
        std::nullopt};
  };
  return prepared;
}

namespace {

// The (first[i or 0], second[i]) pairs tokenized, and the tokens they read.
std::optional<ApiError> Pairs(EncoderModel& model, const std::vector<std::string>& first,
                              const std::vector<std::string>& second,
                              const std::string& second_field, std::vector<Encoding>* pairs,
                              int64_t* used) {
  for (size_t i = 0; i < second.size(); ++i) {
    Expected<Encoding> e = model.TokenizePair(first[first.size() == 1 ? 0 : i], second[i]);
    const std::string at = second_field + "[" + std::to_string(i) + "]";
    if (!e.ok()) return FromStatus(e.status().Annotate(at), at);
    *used += static_cast<int64_t>(e->ids.size());
    pairs->push_back(std::move(e).value());
  }
  return std::nullopt;
}

}  // namespace

PreparedEncoderRequest PrepareRerank(EncoderModel& model, const json& body) {
  if (auto e = Common(model, body,
                      {"model", "query", "documents", "top_n", "return_documents", "user"})) {
    return Refuse(*e);
  }
  auto query = body.find("query");
  if (query == body.end() || !query->is_string()) {
    return Refuse(BadRequest("'query' must be a string", "query",
                             query == body.end() ? "missing_field" : "invalid_type"));
  }
  std::vector<std::string> documents;
  if (auto e = Texts(body, "documents", &documents)) return Refuse(*e);
  size_t top_n = documents.size();
  if (auto it = body.find("top_n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Refuse("'top_n' must be a non-negative integer", "top_n");
    }
    if (it->get<int64_t>() > 0) top_n = std::min<size_t>(top_n, it->get<uint64_t>());
  }
  bool return_documents = true;
  if (auto it = body.find("return_documents"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Refuse("'return_documents' must be a boolean", "return_documents");
    }
    return_documents = it->get<bool>();
  }
  int64_t used = 0;
  PreparedEncoderRequest prepared;
  const std::vector<std::string> queries = {query->get<std::string>()};
  if (auto e = Pairs(model, queries, documents, "documents", &prepared.job.sequences, &used)) {
    return Refuse(*e);
  }
  prepared.job.answer = [name = model.Name(), documents = std::move(documents), top_n,
                         return_documents, used](EncoderResults results) -> EncoderAnswer {
    const std::vector<float>& scores = results.scores;
    std::vector<size_t> order(scores.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    order.resize(std::min(top_n, order.size()));
    json out = json::array();
    for (size_t i : order) {
      json r = {{"index", i}, {"relevance_score", scores[i]}};
      if (return_documents) r["document"] = {{"text", documents[i]}};
      out.push_back(std::move(r));
    }
    return {json{{"id", "rerank-" + std::to_string(std::time(nullptr))},
                 {"model", name},
                 {"results", std::move(out)},
                 {"usage", Usage(used)}},
            std::nullopt};
  };
  return prepared;
}

PreparedEncoderRequest PrepareScore(EncoderModel& model, const json& body) {
  if (auto e = Common(model, body, {"model", "text_1", "text_2", "user"})) return Refuse(*e);
  std::vector<std::string> first, second;
  bool first_single = false;
  if (auto e = Texts(body, "text_1", &first, &first_single)) return Refuse(*e);
  if (auto e = Texts(body, "text_2", &second)) return Refuse(*e);
  if (!first_single && first.size() != second.size()) {
    return Refuse("'text_1' holds " + std::to_string(first.size()) + " texts and 'text_2' " +
                      std::to_string(second.size()) + ": one text_1, or as many as text_2",
                  "text_2");
  }
  if (first.size() > 1 && first_single) first.resize(1);
  int64_t used = 0;
  PreparedEncoderRequest prepared;
  if (auto e = Pairs(model, first, second, "text_2", &prepared.job.sequences, &used)) {
    return Refuse(*e);
  }
  prepared.job.answer = [name = model.Name(), used](EncoderResults results) -> EncoderAnswer {
    json data = json::array();
    for (size_t i = 0; i < results.scores.size(); ++i) {
      data.push_back({{"index", i}, {"object", "score"}, {"score", results.scores[i]}});
    }
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    return {json{{"id", "score-" + std::to_string(now)},
                 {"object", "list"},
                 {"created", now},
                 {"model", name},
                 {"data", std::move(data)},
                 {"usage", Usage(used)}},
            std::nullopt};
  };
  return prepared;
}

Expected<EncoderResults> RunEncoder(EncoderModel& model, std::span<const Encoding> sequences) {
  EncoderResults results;
  if (model.task() == Task::kRerank) {
    GZ_ASSIGN_OR_RETURN(results.scores, model.Score(sequences));
  } else {
    GZ_ASSIGN_OR_RETURN(results.vectors, model.Embed(sequences));
  }
  return results;
}

}  // namespace gizllm::server
