#include "server/openai_response.h"

#include <random>

namespace gizllm::server {

using nlohmann::json;

std::string NewId(std::string_view prefix) {
  thread_local std::mt19937_64 random(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  uint64_t a = random(), b = random();
  for (int i = 0; i < 12; ++i) id += kHex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 12; ++i) id += kHex[(b >> (4 * i)) & 15];
  return id;
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Usage::ToJson() const {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json ToolCallsJson(const std::vector<ToolCall>& calls, int first_index, bool streamed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", NewId("call_")},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (streamed) call["index"] = first_index + static_cast<int>(i);
    out.push_back(std::move(call));
  }
  return out;
}

namespace {

// The token's text, and its bytes as integers (the text may cut a character).
std::pair<std::string, json> TokenText(const TextModel& text, int32_t token) {
  Expected<std::string> s = text.Detokenize(std::span<const int32_t>(&token, 1));
  std::string t = s.ok() ? *s : std::string();
  json bytes = json::array();
  for (unsigned char c : t) bytes.push_back(static_cast<int>(c));
  return {t, bytes};
}

double Finite(float logprob) {
  // JSON has no -Infinity: a token of probability 0 reads as the most negative float.
  return std::isfinite(logprob) ? logprob : -9999.0;
}

}  // namespace

json ChatLogprobs(const TextModel& text, std::span<const TokenLogprob> logprobs) {
  json content = json::array();
  for (const TokenLogprob& lp : logprobs) {
    auto [token, bytes] = TokenText(text, lp.token);
    json top = json::array();
    for (const auto& [id, value] : lp.top) {
      auto [t, b] = TokenText(text, id);
      top.push_back({{"token", t}, {"logprob", Finite(value)}, {"bytes", b}});
    }
    content.push_back({{"token", token},
                       {"logprob", Finite(lp.logprob)},
                       {"bytes", bytes},
                       {"top_logprobs", top}});
  }
  return content;
}

json CompletionLogprobs(const TextModel& text, std::span<const TokenLogprob> logprobs,
                        int64_t text_offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : logprobs) {
    auto [token, bytes] = TokenText(text, lp.token);
    tokens.push_back(token);
    values.push_back(Finite(lp.logprob));
    json top = json::object();
    for (const auto& [id, value] : lp.top) top[TokenText(text, id).first] = Finite(value);
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(token.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace gizllm::server
