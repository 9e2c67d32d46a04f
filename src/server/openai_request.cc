#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/json_nesting.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "template/output_parser.h"

namespace gizllm::server {
namespace {

using nlohmann::json;

std::string TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

ApiError WrongType(const std::string& param, const std::string& expected, const json& v) {
  return BadRequest("'" + param + "' must be " + expected + ", got " + TypeName(v), param,
                    "invalid_type");
}

ApiError OutOfRange(const std::string& param, const std::string& range) {
  return BadRequest("'" + param + "' must be " + range, param, "invalid_value");
}

// Reads optional fields of one JSON object, remembering the first error.
class Fields {
 public:
  explicit Fields(const json& object, std::string prefix = "")
      : object_(object), prefix_(std::move(prefix)) {}

  const std::optional<ApiError>& error() const { return error_; }
  void Fail(ApiError e) {
    if (!error_) error_ = std::move(e);
  }
  std::string Name(const std::string& key) const { return prefix_ + key; }

  // The field, or nullptr when it is absent or null.
  const json* Get(const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool Bool(const std::string& key, bool* out) {
    const json* v = Get(key);
    if (!v) return false;
    if (!v->is_boolean()) return Fail(WrongType(Name(key), "a boolean", *v)), false;
    *out = v->get<bool>();
    return true;
  }

  bool String(const std::string& key, std::string* out) {
    const json* v = Get(key);
    if (!v) return false;
    if (!v->is_string()) return Fail(WrongType(Name(key), "a string", *v)), false;
    *out = v->get<std::string>();
    return true;
  }

  // An integer in [lo, hi].
  bool Int(const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
    const json* v = Get(key);
    if (!v) return false;
    if (!v->is_number_integer()) return Fail(WrongType(Name(key), "an integer", *v)), false;
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Fail(OutOfRange(Name(key), RangeText(lo, hi))), false;
    }
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return Fail(OutOfRange(Name(key), RangeText(lo, hi))), false;
    *out = x;
    return true;
  }

  // A finite number in [lo, hi].
  bool Float(const std::string& key, double lo, double hi, float* out) {
    const json* v = Get(key);
    if (!v) return false;
    if (!v->is_number()) return Fail(WrongType(Name(key), "a number", *v)), false;
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
      return Fail(OutOfRange(Name(key), "a number in [" + Num(lo) + ", " + Num(hi) + "]")), false;
    }
    *out = static_cast<float>(x);
    return true;
  }

 private:
  static std::string Num(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  static std::string RangeText(int64_t lo, int64_t hi) {
    if (hi == std::numeric_limits<int64_t>::max()) return "an integer >= " + std::to_string(lo);
    return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }

  const json& object_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

// Names that templates write into the prompt as they are (tool and function names, a message's
// author): OpenAI's rule, ^[A-Za-z0-9_-]{1,64}$, so that no name can close a tag or a string
// of the prompt around it.
std::optional<ApiError> CheckName(const std::string& name, const std::string& param) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-');
  }
  if (ok) return std::nullopt;
  return BadRequest("'" + param +
                        "' must be 1 to 64 letters, digits, underscores or dashes "
                        "(^[a-zA-Z0-9_-]{1,64}$)",
                    param, "invalid_value");
}

std::optional<ApiError> CheckKnownKeys(const json& body, const std::set<std::string>& known) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!known.count(it.key())) {
      return BadRequest("Unrecognized request argument supplied: " + it.key(), it.key(),
                        "unknown_parameter");
    }
  }
  return std::nullopt;
}

// The grammar a request's structured-output fields ask for: response_format (chat), and the
// fields other servers take: llama.cpp's `grammar` and `json_schema`, vLLM's `guided_grammar`,
// `guided_json`, `guided_regex` and `guided_choice`, and vLLM's newer `structured_outputs`
// object (one of json, regex, grammar, choice, json_object). At most one; a schema, grammar or
// regex (grammar/regex.h: the whole answer one match) that does not compile is a 400 naming the
// field and the place in it, except a response_format json_schema without "strict": true, whose
// refusal goes to `warnings` and leaves the answer unconstrained (OpenAI's rule). The body's objects keep their keys in sorted order (nlohmann::json),
// so a schema's properties come in the order of their names here, not as the client wrote them.
std::optional<ApiError> ParseStructuredOutput(const json& body, SamplingOptions* s,
                                              std::vector<std::string>* warnings) {
  std::vector<std::string> given;
  for (const char* k : {"response_format", "grammar", "guided_grammar", "json_schema",
                        "guided_json", "guided_regex", "guided_choice", "structured_outputs"}) {
    auto it = body.find(k);
    if (it == body.end() || it->is_null()) continue;
    if (std::string(k) == "response_format" && it->is_object() && it->contains("type") &&
        (*it)["type"] == "text") {
      continue;
    }
    given.push_back(k);
  }
  if (given.empty()) return std::nullopt;
  if (given.size() > 1) {
    return BadRequest(
        "'" + given[0] + "' and '" + given[1] + "' both constrain the answer; give one", given[1],
        "invalid_value");
  }
  const std::string field = given[0];
  const json& v = body[field];
  auto compile_schema = [&](const json& schema,
                            const std::string& param) -> std::optional<ApiError> {
    if (!schema.is_object() && !schema.is_boolean())
      return WrongType(param, "a JSON Schema", schema);
    Expected<Grammar> g = JsonSchemaGrammar(schema.dump());
    if (!g.ok()) {
      return BadRequest("'" + param + "': " + g.status().message(), param, "unsupported_schema");
    }
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  };
  auto compile_grammar = [&](const json& text,
                             const std::string& param) -> std::optional<ApiError> {
    if (!text.is_string()) return WrongType(param, "a GBNF grammar (a string)", text);
    Expected<Grammar> g = ParseGbnf(text.get<std::string>(), param);
    if (!g.ok()) return BadRequest(g.status().message(), param, "invalid_grammar");
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  };
  auto compile_json = [&](const json& schema, const std::string& param) {
    if (schema.is_string()) {
      json parsed = json::parse(schema.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded())
        return std::optional(BadRequest("'" + param + "' is not valid JSON", param));
      return compile_schema(parsed, param);
    }
    return compile_schema(schema, param);
  };
  auto compile_regex = [&](const json& regex, const std::string& param) -> std::optional<ApiError> {
    if (!regex.is_string()) return WrongType(param, "a regular expression (a string)", regex);
    Expected<Grammar> g = RegexGrammar(regex.get<std::string>());
    if (!g.ok()) {
      return BadRequest("'" + param + "': " + g.status().message(), param, "invalid_regex");
    }
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  };
  // One of the strings exactly.
  auto compile_choice = [&](const json& choice,
                            const std::string& param) -> std::optional<ApiError> {
    if (!choice.is_array() || choice.empty()) {
      return WrongType(param, "a non-empty array of strings", choice);
    }
    std::string gbnf = "root ::= ";
    for (size_t i = 0; i < choice.size(); ++i) {
      if (!choice[i].is_string()) {
        return WrongType(param + "[" + std::to_string(i) + "]", "a string", choice[i]);
      }
      gbnf += (i ? " | " : "") + GbnfLiteral(choice[i].get<std::string>());
    }
    Expected<Grammar> g = ParseGbnf(gbnf + "\n", param);
    if (!g.ok()) return BadRequest(g.status().message(), param, "invalid_value");
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  };
  if (field == "grammar" || field == "guided_grammar") return compile_grammar(v, field);
  if (field == "json_schema" || field == "guided_json") return compile_json(v, field);
  if (field == "guided_regex") return compile_regex(v, field);
  if (field == "guided_choice") return compile_choice(v, field);
  if (field == "structured_outputs") {
    if (!v.is_object()) return WrongType(field, "an object", v);
    // vLLM's switches that change nothing here: the grammars already write no optional
    // whitespace and no properties a schema does not list, and nothing falls back.
    static const std::set<std::string> kIgnored = {"disable_fallback", "disable_any_whitespace",
                                                   "disable_additional_properties"};
    static const std::set<std::string> kKinds = {"json", "regex", "grammar", "choice",
                                                 "json_object"};
    std::vector<std::string> kinds;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string param = field + "." + it.key();
      if (kIgnored.count(it.key())) {
        if (!it->is_boolean()) return WrongType(param, "a boolean", *it);
        continue;
      }
      if (!kKinds.count(it.key())) {
        return BadRequest("'" + param + "' is not supported; json, regex, grammar, choice and " +
                              "json_object are",
                          param, "unsupported_value");
      }
      if (!it->is_null()) kinds.push_back(it.key());
    }
    if (kinds.empty()) {
      return BadRequest(
          "'structured_outputs' must hold one of json, regex, grammar, choice and "
          "json_object",
          field, "invalid_value");
    }
    if (kinds.size() > 1) {
      return BadRequest("'" + field + "." + kinds[0] + "' and '" + field + "." + kinds[1] +
                            "' both constrain the answer; give one",
                        field + "." + kinds[1], "invalid_value");
    }
    const std::string param = field + "." + kinds[0];
    const json& spec = v[kinds[0]];
    if (kinds[0] == "json") return compile_json(spec, param);
    if (kinds[0] == "regex") return compile_regex(spec, param);
    if (kinds[0] == "grammar") return compile_grammar(spec, param);
    if (kinds[0] == "choice") return compile_choice(spec, param);
    // json_object
    if (spec != true) return BadRequest("'" + param + "' must be true", param, "invalid_value");
    Expected<Grammar> g = ParseGbnf(JsonObjectGbnf(), "json_object");
    if (!g.ok()) return BadRequest(g.status().message(), param);
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  }
  // response_format
  if (!v.is_object()) return WrongType("response_format", "an object", v);
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return BadRequest("'response_format.type' must be a string", "response_format.type");
  }
  if (*type == "json_object") {
    Expected<Grammar> g = ParseGbnf(JsonObjectGbnf(), "json_object");
    if (!g.ok()) return BadRequest(g.status().message(), "response_format");
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  }
  if (*type == "json_schema") {
    auto spec = v.find("json_schema");
    if (spec == v.end() || !spec->is_object()) {
      return BadRequest("'response_format.json_schema' must be an object with a 'schema'",
                        "response_format.json_schema");
    }
    auto schema = spec->find("schema");
    if (schema == spec->end()) {
      return BadRequest("'response_format.json_schema.schema' is required",
                        "response_format.json_schema.schema");
    }
    const std::string param = "response_format.json_schema.schema";
    bool strict = false;
    auto given = spec->find("strict");
    if (given != spec->end() && !given->is_null()) {
      if (!given->is_boolean()) {
        return WrongType("response_format.json_schema.strict", "a boolean", *given);
      }
      strict = given->get<bool>();
    }
    if (strict || (!schema->is_object() && !schema->is_boolean())) {
      return compile_schema(*schema, param);
    }
    // Without strict, a schema the compiler refuses is not followed: the answer runs
    // unconstrained and the response says why.
    Expected<Grammar> g = JsonSchemaGrammar(schema->dump());
    if (!g.ok()) {
      warnings->push_back("'" + param + "': " + g.status().message() +
                          "; the answer is not constrained (with 'strict': true such a schema "
                          "is refused)");
      return std::nullopt;
    }
    s->grammar = std::make_shared<const Grammar>(std::move(*g));
    return std::nullopt;
  }
  return BadRequest("'response_format' of type '" + type->get<std::string>() +
                        "' is not supported; 'text', 'json_object' and 'json_schema' are",
                    "response_format.type", "unsupported_value");
}

// Fields chat and completion requests share. `completion`: the legacy completions API, where
// logprobs is an integer.
std::optional<ApiError> ParseGenerationParams(const json& body, bool completion,
                                              GenerationParams* out) {
  Fields f(body);
  f.String("model", &out->model);
  int64_t n = 0;
  if (f.Int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &n)) out->max_tokens = n;
  if (!completion && f.Int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &n)) {
    out->max_tokens = n;
  }
  SamplingOptions& s = out->sampling;
  if (auto e = ParseStructuredOutput(body, &s, &out->warnings)) return e;
  f.Float("temperature", 0, 2, &s.temperature);
  f.Float("top_p", 0, 1, &s.top_p);
  if (f.Get("top_p") && s.top_p <= 0) f.Fail(OutOfRange("top_p", "a number in (0, 1]"));
  if (f.Int("top_k", -1, std::numeric_limits<int32_t>::max(), &n)) {
    s.top_k = n < 0 ? 0 : static_cast<int32_t>(n);
  }
  f.Float("min_p", 0, 1, &s.min_p);
  f.Float("presence_penalty", -2, 2, &s.presence);
  f.Float("frequency_penalty", -2, 2, &s.frequency);
  f.Float("repetition_penalty", 0, 2, &s.repetition);
  if (f.Get("repetition_penalty") && s.repetition <= 0) {
    f.Fail(OutOfRange("repetition_penalty", "a number in (0, 2]"));
  }
  if (const json* seed = f.Get("seed")) {
    // Any 64-bit seed, as the sampler's counter-based draws take; a float past 2^64 is out of
    // range, not of the wrong type.
    const std::string range = "an integer in [0, 18446744073709551615]";
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer() ||
               (seed->is_number_float() && std::floor(seed->get<double>()) == seed->get<double>() &&
                std::fabs(seed->get<double>()) >= 0x1p64)) {
      f.Fail(OutOfRange("seed", range));
    } else {
      f.Fail(WrongType("seed", "an integer", *seed));
    }
  }
  if (f.Int("n", 1, 1, &n)) {
  }
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      out->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) f.Fail(BadRequest("'stop' may hold at most 4 strings", "stop"));
      for (const json& x : *stop) {
        if (!x.is_string()) {
          f.Fail(WrongType("stop", "a string or an array of strings", x));
          break;
        }
        out->stop.push_back(x.get<std::string>());
      }
    } else {
      f.Fail(WrongType("stop", "a string or an array of strings", *stop));
    }
    for (const std::string& x : out->stop) {
      if (x.empty()) f.Fail(BadRequest("'stop' strings must not be empty", "stop"));
    }
  }
  f.Bool("stream", &out->stream);
  if (const json* options = f.Get("stream_options")) {
    if (!out->stream) {
      f.Fail(BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options",
                        "invalid_value"));
    } else if (!options->is_object()) {
      f.Fail(WrongType("stream_options", "an object", *options));
    } else {
      Fields o(*options, "stream_options.");
      o.Bool("include_usage", &out->include_usage);
      if (o.error()) f.Fail(*o.error());
    }
  }
  if (completion) {
    if (f.Int("logprobs", 0, 5, &n)) {
      out->logprobs = true;
      out->top_logprobs = static_cast<int32_t>(n);
    }
  } else {
    f.Bool("logprobs", &out->logprobs);
    if (f.Int("top_logprobs", 0, 20, &n)) {
      out->top_logprobs = static_cast<int32_t>(n);
      if (!out->logprobs && !f.error()) {
        f.Fail(BadRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs"));
      }
    }
  }
  s.logprobs = out->logprobs ? out->top_logprobs : -1;
  if (const json* bias = f.Get("logit_bias")) {
    if (!bias->is_object()) {
      f.Fail(WrongType("logit_bias", "an object", *bias));
    } else if (!bias->empty()) {
      f.Fail(BadRequest("'logit_bias' is not supported", "logit_bias", "unsupported_parameter"));
    }
  }
  f.Bool("ignore_eos", &out->ignore_eos);
  std::string ignored;
  f.String("user", &ignored);
  return f.error();
}

// An image_url or video_url content part (`p` names it) as a MediaPart.
std::optional<ApiError> ParseMediaPart(const json& part, const std::string& p, bool video,
                                       MediaPart* out) {
  const std::string key = video ? "video_url" : "image_url";
  const std::string param = p + "." + key;
  out->kind = video ? MediaKind::kVideo : MediaKind::kPicture;
  out->param = param;
  auto object = part.find(key);
  if (object == part.end() || !object->is_object()) {
    return BadRequest(
        "'" + param + "' must be an object with a 'url'" + (video ? " or 'frames'" : ""), param,
        "invalid_type");
  }
  Fields f(*object, param + ".");
  std::string detail;
  f.String("detail", &detail);  // OpenAI's hint of the resolution: the processor decides here
  const bool has_url = f.String("url", &out->url);
  if (f.error()) return f.error();
  if (video) {
    if (const json* frames = f.Get("frames")) {
      if (!frames->is_array() || frames->empty()) {
        return WrongType(param + ".frames", "a non-empty array of picture URLs", *frames);
      }
      for (const json& frame : *frames) {
        if (!frame.is_string()) {
          return WrongType(param + ".frames", "a non-empty array of picture URLs", frame);
        }
        out->frames.push_back(frame.get<std::string>());
      }
      if (has_url) {
        return BadRequest("'" + param + "' holds both 'url' and 'frames'; give one", param,
                          "invalid_value");
      }
    }
    float fps = 0;
    if (f.Float("fps", 0, 1000, &fps)) {
      if (fps <= 0) return OutOfRange(param + ".fps", "a number in (0, 1000]");
      out->fps = fps;
    }
    if (f.error()) return f.error();
    if (!has_url && out->frames.empty()) {
      return BadRequest("'" + param + "' must hold a 'url' (a folder of frames) or 'frames'",
                        param + ".url", "missing_required_parameter");
    }
    return std::nullopt;
  }
  if (!has_url) {
    return BadRequest("'" + param + ".url' must be a string", param + ".url",
                      "missing_required_parameter");
  }
  return std::nullopt;
}

// A message's content: a string, or parts. Text parts alone are joined into a string; with
// pictures or videos (`media` not null) the parts stay a list for the chat template, each
// picture {"type": "image"} and each video {"type": "video"}, and the media go to `media` in
// order. `no_media`: why this content may hold none (when `media` is null).
std::optional<ApiError> ParseContent(const json& content, const std::string& param,
                                     std::vector<MediaPart>* media, const std::string& no_media,
                                     json* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return WrongType(param, "a string or an array of content parts", content);
  std::string text;
  json parts = json::array();
  bool has_media = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return WrongType(p, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return BadRequest("'" + p + ".type' must be a string", p + ".type");
    }
    if (*type == "image_url" || *type == "video_url") {
      if (!media) {
        return BadRequest("'" + p + "': " + no_media, p + ".type", "unsupported_value");
      }
      const bool video = *type == "video_url";
      MediaPart m;
      if (auto e = ParseMediaPart(part, p, video, &m)) return e;
      media->push_back(std::move(m));
      parts.push_back({{"type", video ? "video" : "image"}});
      has_media = true;
      continue;
    }
    if (*type != "text") {
      return BadRequest("content parts of type '" + type->get<std::string>() +
                            "' are not supported; 'text', 'image_url' and 'video_url' are",
                        p + ".type", "unsupported_value");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      return BadRequest("'" + p + ".text' must be a string", p + ".text");
    }
    text += t->get<std::string>();
    parts.push_back({{"type", "text"}, {"text", t->get<std::string>()}});
  }
  if (has_media) {
    *out = std::move(parts);
  } else {
    *out = std::move(text);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseToolCalls(const json& calls, const std::string& param, json* out) {
  if (!calls.is_array()) return WrongType(param, "an array", calls);
  *out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!call.is_object()) return WrongType(p, "an object", call);
    auto function = call.find("function");
    if (function == call.end() || !function->is_object()) {
      return BadRequest("'" + p + ".function' must be an object", p + ".function");
    }
    auto name = function->find("name");
    if (name == function->end() || !name->is_string()) {
      return BadRequest("'" + p + ".function.name' must be a string", p + ".function.name");
    }
    if (auto e = CheckName(name->get<std::string>(), p + ".function.name")) return e;
    json arguments = json::object();
    auto args = function->find("arguments");
    if (args != function->end() && !args->is_null()) {
      if (args->is_string()) {
        if (JsonTooDeep(args->get<std::string>())) {
          return BadRequest("'" + p + ".function.arguments' nests arrays and objects more than " +
                                std::to_string(kMaxJsonNesting) + " levels deep",
                            p + ".function.arguments", "nested_too_deeply");
        }
        // Templates read the arguments as a mapping; text that is not JSON stays text.
        json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        arguments = parsed.is_discarded() ? *args : parsed;
      } else if (args->is_object()) {
        arguments = *args;
      } else {
        return WrongType(p + ".function.arguments", "a string", *args);
      }
    }
    json normalized = {{"type", "function"},
                       {"function", {{"name", *name}, {"arguments", arguments}}}};
    auto id = call.find("id");
    if (id != call.end() && id->is_string()) normalized["id"] = *id;
    out->push_back(std::move(normalized));
  }
  return std::nullopt;
}

// `media`: where a chat's pictures and videos go; null where none may be given (/tokenize).
std::optional<ApiError> ParseMessages(const json& body, json* out, std::vector<MediaPart>* media) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) {
    return BadRequest("'messages' is a required property", "messages",
                      "missing_required_parameter");
  }
  const json& messages = *it;
  if (!messages.is_array()) return WrongType("messages", "an array", messages);
  if (messages.empty()) {
    return BadRequest("'messages' must hold at least one message", "messages", "empty_array");
  }
  if (messages.size() > kMaxMessages) {
    return BadRequest("'messages' may hold at most " + std::to_string(kMaxMessages) +
                          " messages; got " + std::to_string(messages.size()),
                      "messages", "array_above_max_length");
  }
  *out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(p, "an object", m);
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return BadRequest("'" + p + ".role' must be a string", p + ".role");
    }
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return BadRequest("'" + p +
                            ".role' must be one of 'system', 'developer', 'user', "
                            "'assistant', 'tool'; got '" +
                            role_it->get<std::string>() + "'",
                        p + ".role", "invalid_value");
    }
    json message = {{"role", role}};
    auto content = m.find("content");
    bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (content == m.end() || content->is_null()) {
      if (role != "assistant") {
        return BadRequest("'" + p + ".content' is required for role '" + role + "'", p + ".content",
                          "missing_required_parameter");
      }
      // Templates add the content to text: an absent one is empty.
      message["content"] = "";
    } else {
      const bool user = role == "user";
      const std::string no_media = !media
                                       ? "pictures and videos are read by /v1/chat/completions only"
                                       : "pictures and videos go in user messages";
      json parsed;
      if (auto e =
              ParseContent(*content, p + ".content", user ? media : nullptr, no_media, &parsed)) {
        return e;
      }
      message["content"] = std::move(parsed);
    }
    if (has_calls) {
      if (role != "assistant") {
        return BadRequest("only assistant messages may hold tool_calls", p + ".tool_calls");
      }
      json calls;
      if (auto e = ParseToolCalls(m["tool_calls"], p + ".tool_calls", &calls)) return e;
      message["tool_calls"] = std::move(calls);
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      auto v = m.find(key);
      if (v == m.end() || v->is_null()) continue;
      if (!v->is_string()) return WrongType(p + "." + key, "a string", *v);
      if (std::string_view(key) == "name") {
        if (auto e = CheckName(v->get<std::string>(), p + ".name")) return e;
      }
      message[key] = *v;
    }
    if (role == "tool" && !message.contains("tool_call_id")) {
      return BadRequest("'" + p + ".tool_call_id' is required for role 'tool'", p + ".tool_call_id",
                        "missing_required_parameter");
    }
    out->push_back(std::move(message));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTools(const json& body, json* out) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) {
    *out = nullptr;
    return std::nullopt;
  }
  if (!it->is_array()) return WrongType("tools", "an array", *it);
  if (it->size() > kMaxTools) {
    return BadRequest("'tools' may hold at most " + std::to_string(kMaxTools) + " tools; got " +
                          std::to_string(it->size()),
                      "tools", "array_above_max_length");
  }
  *out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& tool = (*it)[i];
    std::string p = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) return WrongType(p, "an object", tool);
    auto type = tool.find("type");
    if (type == tool.end() || *type != "function") {
      return BadRequest("'" + p + ".type' must be 'function'", p + ".type");
    }
    auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) {
      return BadRequest("'" + p + ".function' must be an object", p + ".function");
    }
    auto name = function->find("name");
    if (name == function->end() || !name->is_string()) {
      return BadRequest("'" + p + ".function.name' must be a string", p + ".function.name");
    }
    if (auto e = CheckName(name->get<std::string>(), p + ".function.name")) return e;
    auto description = function->find("description");
    if (description != function->end() && !description->is_null() && !description->is_string()) {
      return WrongType(p + ".function.description", "a string", *description);
    }
    auto parameters = function->find("parameters");
    if (parameters != function->end() && !parameters->is_null() && !parameters->is_object()) {
      return WrongType(p + ".function.parameters", "an object", *parameters);
    }
    out->push_back(tool);
  }
  return std::nullopt;
}

}  // namespace

namespace {

// `gbnf` with every rule name passed through `rename` (literals, classes and comments copied
// as they are).
template <typename Rename>
std::string MapGbnfNames(std::string_view gbnf, Rename rename) {
  std::string out;
  out.reserve(gbnf.size());
  auto ident = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  };
  size_t i = 0;
  while (i < gbnf.size()) {
    const char c = gbnf[i];
    if (c == '"' || c == '[' || c == '{') {  // a literal, a class or a count, copied as it is
      const char end = c == '"' ? '"' : c == '[' ? ']' : '}';
      size_t j = i + 1;
      while (j < gbnf.size() && gbnf[j] != end) j += gbnf[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, gbnf.size());
      out.append(gbnf.substr(i, j - i));
      i = j;
    } else if (c == '#') {  // a comment, to the end of the line
      size_t j = gbnf.find('\n', i);
      if (j == std::string_view::npos) j = gbnf.size();
      out.append(gbnf.substr(i, j - i));
      i = j;
    } else if (ident(c)) {
      size_t j = i;
      while (j < gbnf.size() && ident(gbnf[j])) ++j;
      out.append(rename(gbnf.substr(i, j - i)));
      i = j;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

// The root of a forced call's grammar after the first "<tool_call>\n": one call (`call`, the
// rule of its text) and its closing tag, then with `parallel` more calls, each in its own tags as
// Qwen's templates write them.
std::string ToolCallsRoot(const std::string& call, bool parallel) {
  std::string root = "root ::= " + call + " \"\\n</tool_call>\"";
  if (parallel) root += " (\"\\n<tool_call>\\n\" " + call + " \"\\n</tool_call>\")*";
  return root + "\n";
}

// Text without "</parameter>" (an XML-form string value). A '<' starts a piece that holds no
// other '<' and does not go on with "/parameter>": at each character of the tag the piece either
// ends, leaves the tag with another character, or follows it one character further.
std::string XmlTextGbnf() {
  constexpr std::string_view kTag = "/parameter>";
  std::string piece;
  for (size_t i = kTag.size(); i-- > 0;) {
    const std::string leave = std::string("[^") + kTag[i] + "<] [^<]*";
    piece = i + 1 == kTag.size()
                ? "(" + leave + ")?"
                : "(" + leave + " | " + GbnfLiteral(kTag.substr(i, 1)) + " " + piece + ")?";
  }
  return "xml-text ::= [^<]* (\"<\" " + piece + ")*\n";
}

}  // namespace

std::string RenameGbnfRule(std::string_view gbnf, std::string_view from, std::string_view to) {
  return MapGbnfNames(gbnf, [&](std::string_view word) { return word == from ? to : word; });
}

std::string PrefixGbnfRules(std::string_view gbnf, std::string_view prefix) {
  return MapGbnfNames(gbnf, [&](std::string_view word) { return std::string(prefix) += word; });
}

Expected<std::string> ToolCallXmlGbnf(const json& tools, const std::string& forced,
                                      bool parallel) {
  std::string rules;  // the rules of the calls and their values
  std::vector<std::string> calls;
  bool uses_text = false;
  for (const json& tool : tools) {
    const json& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (!forced.empty() && name != forced) continue;
    const std::string call = "call" + std::to_string(calls.size());
    calls.push_back(call);
    auto found = function.find("parameters");
    const json parameters = found == function.end() || found->is_null() ? json::object() : *found;
    // The whole schema compiles, as in the JSON form: what the compiler refuses is refused here.
    Expected<std::string> whole = JsonSchemaToGbnf(parameters.dump());
    if (!whole.ok()) return whole.status();
    std::string body = GbnfLiteral("<function=" + name + ">\n");
    auto properties = parameters.find("properties");
    const bool listed =
        properties != parameters.end() && properties->is_object() && !properties->empty();
    if (!listed) {
      // No parameters listed: any names with text values, unless the schema allows none.
      auto additional = parameters.find("additionalProperties");
      if (additional == parameters.end() || *additional != false) {
        body += " (\"<parameter=\" [^<>\\n]+ \">\\n\" xml-text \"\\n</parameter>\\n\")*";
        uses_text = true;
      }
    } else {
      std::set<std::string> required;
      auto r = parameters.find("required");
      if (r != parameters.end() && r->is_array()) {
        for (const json& key : *r) {
          if (key.is_string()) required.insert(key.get<std::string>());
        }
      }
      int index = 0;
      // Parameters in the order of the request's properties (sorted by name, as the JSON
      // form's and the prompt's), each at most once, the required ones always: a fixed order
      // keeps the grammar linear in the parameters where any order would be exponential.
      for (const auto& [key, schema] : properties->items()) {
        if (key.empty() || key.find_first_of("<>\n") != std::string::npos) {
          return InvalidArgument("parameter '" + key + "' of '" + name +
                                 "' cannot be written in the XML tool-call form");
        }
        const std::string value = call + "-p" + std::to_string(index++);
        const nlohmann::ordered_json typed = nlohmann::ordered_json::parse(schema.dump());
        if (ArgumentIsText(typed)) {
          std::vector<std::string> words;  // a string enum or const: only its words
          if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array()) {
            for (const json& e : schema["enum"])
              words.push_back(e.is_string() ? e.get<std::string>() : "");
            if (std::any_of(schema["enum"].begin(), schema["enum"].end(),
                            [](const json& e) { return !e.is_string(); })) {
              words.clear();
            }
          } else if (schema.is_object() && schema.contains("const") &&
                     schema["const"].is_string()) {
            words.push_back(schema["const"].get<std::string>());
          }
          if (words.empty()) {
            rules += value + " ::= xml-text\n";
            uses_text = true;
          } else {
            rules += value + " ::= ";
            for (size_t i = 0; i < words.size(); ++i)
              rules += (i ? " | " : "") + GbnfLiteral(words[i]);
            rules += "\n";
          }
        } else {
          // A JSON value: the property's schema compiled alone, the parameters' $defs beside it.
          json alone = schema;
          for (const char* defs : {"$defs", "definitions"}) {
            if (parameters.contains(defs) && alone.is_object() && !alone.contains(defs)) {
              alone[defs] = parameters[defs];
            }
          }
          Expected<std::string> json_value = JsonSchemaToGbnf(alone.dump());
          if (!json_value.ok()) return json_value.status();
          rules += PrefixGbnfRules(*json_value, value + "-");
          rules += value + " ::= " + value + "-root\n";
        }
        std::string part = "(" + GbnfLiteral("<parameter=" + key + ">\n") + " " + value + " " +
                           GbnfLiteral("\n</parameter>\n") + ")";
        body += " " + part + (required.count(key) ? "" : "?");
      }
    }
    rules += call + " ::= " + body + " \"</function>\"\n";
  }
  if (calls.empty()) return InvalidArgument("no tool named '" + forced + "'");
  std::string any = "call-any ::= ";
  for (size_t i = 0; i < calls.size(); ++i) any += (i ? " | " : "") + calls[i];
  return ToolCallsRoot("call-any", parallel) + any + "\n" + rules +
         (uses_text ? XmlTextGbnf() : "");
}

Expected<std::string> ToolCallGbnf(const json& tools, const std::string& forced, bool parallel) {
  // The call object as Qwen's templates write it: "name" first, then "arguments" (built as text:
  // a json object would sort its keys).
  std::vector<std::string> branches;
  for (const json& tool : tools) {
    const json& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (!forced.empty() && name != forced) continue;
    auto parameters = function.find("parameters");
    const std::string arguments = parameters == function.end() || parameters->is_null()
                                      ? std::string(R"({"type":"object"})")
                                      : parameters->dump();
    branches.push_back(R"({"type":"object","properties":{"name":{"const":)" + json(name).dump() +
                       R"(},"arguments":)" + arguments +
                       R"(},"required":["name","arguments"],"additionalProperties":false})");
  }
  if (branches.empty()) return InvalidArgument("no tool named '" + forced + "'");
  std::string schema;
  if (branches.size() == 1) {
    schema = branches[0];
  } else {
    schema = R"({"anyOf":[)";
    for (size_t i = 0; i < branches.size(); ++i) schema += (i ? "," : "") + branches[i];
    schema += "]}";
  }
  Expected<std::string> call = JsonSchemaToGbnf(schema);
  if (!call.ok()) return call.status();
  return ToolCallsRoot("c-root", parallel) + PrefixGbnfRules(*call, "c-");
}

std::optional<ApiError> ParseBody(std::string_view text, json* out) {
  if (JsonTooDeep(text)) {
    return BadRequest("The request body nests arrays and objects more than " +
                          std::to_string(kMaxJsonNesting) + " levels deep.",
                      "", "nested_too_deeply");
  }
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    return BadRequest("The request body is not valid JSON (or not valid UTF-8).", "",
                      "invalid_json");
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChatRequest(const json& body, int32_t vocab, ChatRequest* out,
                                         ToolCallSyntax syntax) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  static const std::set<std::string> kKnown = {"model",
                                               "messages",
                                               "tools",
                                               "tool_choice",
                                               "stream",
                                               "stream_options",
                                               "max_tokens",
                                               "max_completion_tokens",
                                               "temperature",
                                               "top_p",
                                               "top_k",
                                               "min_p",
                                               "presence_penalty",
                                               "frequency_penalty",
                                               "repetition_penalty",
                                               "seed",
                                               "stop",
                                               "logprobs",
                                               "top_logprobs",
                                               "reasoning_effort",
                                               "response_format",
                                               "n",
                                               "user",
                                               "metadata",
                                               "store",
                                               "parallel_tool_calls",
                                               "service_tier",
                                               "logit_bias",
                                               "ignore_eos",
                                               "chat_template_kwargs",
                                               "grammar",
                                               "guided_grammar",
                                               "json_schema",
                                               "guided_json",
                                               "guided_regex",
                                               "guided_choice",
                                               "structured_outputs"};
  if (auto e = CheckKnownKeys(body, kKnown)) return e;
  if (auto e = ParseGenerationParams(body, /*completion=*/false, &out->params)) return e;
  if (auto e = ParseMessages(body, &out->input.messages, &out->media)) return e;
  if (auto e = ParseTools(body, &out->tools)) return e;

  Fields f(body);
  f.Bool("parallel_tool_calls", &out->parallel_tool_calls);
  if (const json* choice = f.Get("tool_choice")) {
    if (choice->is_string()) {
      out->tool_choice = choice->get<std::string>();
      if (out->tool_choice != "none" && out->tool_choice != "auto" &&
          out->tool_choice != "required") {
        return BadRequest("'tool_choice' must be 'none', 'auto', 'required' or a function",
                          "tool_choice", "invalid_value");
      }
    } else if (choice->is_object()) {
      const json* name = nullptr;
      auto function = choice->find("function");
      if (function != choice->end() && function->is_object()) {
        auto n = function->find("name");
        if (n != function->end() && n->is_string()) name = &*n;
      }
      if (!name) {
        return BadRequest("'tool_choice.function.name' must be a string",
                          "tool_choice.function.name");
      }
      out->tool_choice = "function";
      out->forced_tool = name->get<std::string>();
    } else {
      return WrongType("tool_choice", "a string or an object", *choice);
    }
    bool have_tools = out->tools.is_array() && !out->tools.empty();
    if (out->tool_choice != "none" && out->tool_choice != "auto" && !have_tools) {
      return BadRequest("'tool_choice' needs 'tools'", "tool_choice");
    }
    if (out->tool_choice == "function") {
      bool found = false;
      for (const json& tool : out->tools) found |= tool["function"]["name"] == out->forced_tool;
      if (!found) {
        return BadRequest(
            "'tool_choice' names the function '" + out->forced_tool + "', which is not in 'tools'",
            "tool_choice.function.name", "invalid_value");
      }
    }
  }
  if (out->tool_choice == "required" && out->tools.is_array() && out->tools.size() == 1) {
    // One tool to choose from: the same as naming it.
    out->tool_choice = "function";
    out->forced_tool = out->tools[0]["function"]["name"];
  }
  if (out->tool_choice == "required" || out->tool_choice == "function") {
    if (out->params.sampling.grammar) {
      return BadRequest(
          "'tool_choice' forces a tool call, which a structured-output field "
          "would constrain too; give one",
          "tool_choice", "invalid_value");
    }
    Expected<std::string> gbnf =
        syntax == ToolCallSyntax::kXml
            ? ToolCallXmlGbnf(out->tools, out->forced_tool, out->parallel_tool_calls)
            : ToolCallGbnf(out->tools, out->forced_tool, out->parallel_tool_calls);
    if (!gbnf.ok()) {
      return BadRequest("'tools': " + gbnf.status().message(), "tools", "unsupported_schema");
    }
    Expected<Grammar> g = ParseGbnf(*gbnf, "tool call");
    if (!g.ok()) return BadRequest(g.status().message(), "tools", "unsupported_schema");
    out->params.sampling.grammar = std::make_shared<const Grammar>(std::move(*g));
  }
  out->input.tools = out->tool_choice == "none" ? json(nullptr) : out->tools;

  std::string effort;
  if (f.String("reasoning_effort", &effort)) {
    if (effort == "none" || effort == "minimal") {
      out->input.enable_thinking = false;
    } else if (effort == "low" || effort == "medium" || effort == "high") {
      out->input.enable_thinking = true;
    } else {
      return BadRequest("'reasoning_effort' must be 'none', 'minimal', 'low', 'medium' or 'high'",
                        "reasoning_effort", "invalid_value");
    }
  }
  if (const json* kwargs = f.Get("chat_template_kwargs")) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    Fields k(*kwargs, "chat_template_kwargs.");
    bool thinking = false;
    if (k.Bool("enable_thinking", &thinking)) out->input.enable_thinking = thinking;
    if (k.error()) return k.error();
  }
  bool flag = false;
  f.Bool("store", &flag);
  if (f.error()) return f.error();
  (void)vocab;
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(const json& body, int32_t vocab,
                                               CompletionRequest* out) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  static const std::set<std::string> kKnown = {"model",
                                               "prompt",
                                               "stream",
                                               "stream_options",
                                               "max_tokens",
                                               "temperature",
                                               "top_p",
                                               "top_k",
                                               "min_p",
                                               "presence_penalty",
                                               "frequency_penalty",
                                               "repetition_penalty",
                                               "seed",
                                               "stop",
                                               "logprobs",
                                               "echo",
                                               "n",
                                               "best_of",
                                               "user",
                                               "logit_bias",
                                               "ignore_eos",
                                               "suffix",
                                               "grammar",
                                               "guided_grammar",
                                               "json_schema",
                                               "guided_json",
                                               "guided_regex",
                                               "guided_choice",
                                               "structured_outputs"};
  if (auto e = CheckKnownKeys(body, kKnown)) return e;
  if (auto e = ParseGenerationParams(body, /*completion=*/true, &out->params)) return e;
  if (!out->params.max_tokens) out->params.max_tokens = 16;  // the API's default
  Fields f(body);
  int64_t n = 0;
  f.Int("best_of", 1, 1, &n);
  f.Bool("echo", &out->echo);
  if (const json* suffix = f.Get("suffix")) {
    f.Fail(BadRequest("'suffix' is not supported", "suffix", "unsupported_parameter"));
    (void)suffix;
  }
  if (f.error()) return f.error();

  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) {
    return BadRequest("'prompt' is a required property", "prompt", "missing_required_parameter");
  }
  const json* p = &*prompt;
  // A batch of one prompt is the prompt.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  }
  if (p->is_string()) {
    out->prompt_text = p->get<std::string>();
    if (out->prompt_text.empty()) return BadRequest("'prompt' must not be empty", "prompt");
  } else if (p->is_array()) {
    if (p->empty()) return BadRequest("'prompt' must not be empty", "prompt");
    out->prompt_is_tokens = true;
    for (const json& t : *p) {
      if (!t.is_number_integer()) {
        return BadRequest("'prompt' must be a string, an array of token ids, or a batch of one",
                          "prompt", "invalid_type");
      }
      if (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(vocab)
                                 : (t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)) {
        return BadRequest("'prompt' holds a token id outside [0, " + std::to_string(vocab) + ")",
                          "prompt", "invalid_value");
      }
      out->prompt_tokens.push_back(t.get<int32_t>());
    }
  } else {
    return WrongType("prompt", "a string or an array of token ids", *p);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTokenizeRequest(const json& body, TokenizeRequest* out) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  static const std::set<std::string> kKnown = {"model",
                                               "prompt",
                                               "messages",
                                               "tools",
                                               "add_generation_prompt",
                                               "add_special_tokens",
                                               "chat_template_kwargs",
                                               "grammar",
                                               "guided_grammar",
                                               "json_schema",
                                               "guided_json",
                                               "guided_regex",
                                               "guided_choice",
                                               "structured_outputs"};
  if (auto e = CheckKnownKeys(body, kKnown)) return e;
  Fields f(body);
  f.String("model", &out->model);
  f.Bool("add_generation_prompt", &out->add_generation_prompt);
  bool ignored = false;
  f.Bool("add_special_tokens", &ignored);
  if (f.error()) return f.error();
  if (f.Get("messages")) {
    ChatInput chat;
    if (auto e = ParseMessages(body, &chat.messages, nullptr)) return e;
    if (auto e = ParseTools(body, &chat.tools)) return e;
    if (const json* kwargs = f.Get("chat_template_kwargs")) {
      if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
      Fields k(*kwargs, "chat_template_kwargs.");
      bool thinking = false;
      if (k.Bool("enable_thinking", &thinking)) chat.enable_thinking = thinking;
      if (k.error()) return k.error();
    }
    out->chat = std::move(chat);
    return std::nullopt;
  }
  const json* prompt = f.Get("prompt");
  if (!prompt) {
    return BadRequest("'prompt' or 'messages' is required", "prompt", "missing_required_parameter");
  }
  if (!prompt->is_string()) return WrongType("prompt", "a string", *prompt);
  out->prompt = prompt->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> ParseDetokenizeRequest(const json& body, int32_t vocab,
                                               DetokenizeRequest* out) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  if (auto e = CheckKnownKeys(body, {"model", "tokens"})) return e;
  Fields f(body);
  f.String("model", &out->model);
  if (f.error()) return f.error();
  const json* tokens = f.Get("tokens");
  if (!tokens) return BadRequest("'tokens' is required", "tokens", "missing_required_parameter");
  if (!tokens->is_array()) return WrongType("tokens", "an array of token ids", *tokens);
  for (const json& t : *tokens) {
    if (!t.is_number_integer()) return WrongType("tokens", "an array of token ids", *tokens);
    if (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(vocab)
                               : (t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)) {
      return BadRequest("'tokens' holds a token id outside [0, " + std::to_string(vocab) + ")",
                        "tokens", "invalid_value");
    }
    out->tokens.push_back(t.get<int32_t>());
  }
  return std::nullopt;
}

}  // namespace gizllm::server
