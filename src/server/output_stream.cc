#include "server/output_stream.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace gizllm::server {

void OutputDelta::Append(OutputDelta other) {
  reasoning += other.reasoning;
  content += other.content;
  for (ToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
}

bool EndsInsideCharacter(std::string_view text) {
  if (text.empty()) return false;
  if (text.size() >= 3 && text.substr(text.size() - 3) == "\xEF\xBF\xBD") return true;
  size_t start = text.size() - 1;
  int continuation = 0;
  while (start > 0 && continuation < 3 &&
         (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    --start;
    ++continuation;
  }
  unsigned char lead = static_cast<unsigned char>(text[start]);
  size_t needed = lead < 0x80           ? 1
                  : (lead >> 5) == 0x6  ? 2
                  : (lead >> 4) == 0xE  ? 3
                  : (lead >> 3) == 0x1E ? 4
                                        : 1;  // not a lead byte: nothing to wait for
  return text.size() - start < needed;
}

Expected<std::string> TokenDecoder::Push(std::span<const int32_t> tokens, bool final) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (read_offset_ == tokens_.size()) return std::string();
  std::span<const int32_t> all(tokens_);
  GZ_ASSIGN_OR_RETURN(std::string before,
                      text_.Detokenize(all.subspan(prefix_offset_, read_offset_ - prefix_offset_)));
  GZ_ASSIGN_OR_RETURN(std::string after, text_.Detokenize(all.subspan(prefix_offset_)));
  if (!final && (after.size() <= before.size() || EndsInsideCharacter(after))) {
    return std::string();
  }
  std::string piece;
  if (after.size() > before.size() && after.compare(0, before.size(), before) == 0) {
    piece = after.substr(before.size());
  } else if (after.size() > before.size()) {
    piece = after.substr(before.size());
  }
  prefix_offset_ = read_offset_;
  read_offset_ = tokens_.size();
  return piece;
}

OutputParserOptions ChatParserOptions(const nlohmann::json& tools, const ChatPrompt& prompt) {
  OutputParserOptions options;
  options.starts_in_reasoning = PromptOpensReasoning(prompt.text);
  options.tool_calls = tools.is_array() && !tools.empty();
  if (options.tool_calls) options.tools = nlohmann::ordered_json::parse(tools.dump());
  return options;
}

OutputDelta ToDelta(std::vector<OutputEvent> events) {
  OutputDelta out;
  for (OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::kReasoning:
        out.reasoning += e.text;
        break;
      case OutputEvent::Kind::kContent:
        out.content += e.text;
        break;
      case OutputEvent::Kind::kToolCall:
        out.tool_calls.push_back({std::move(e.name), std::move(e.arguments)});
        break;
    }
  }
  return out;
}

OutputStream::OutputStream(const TextModel& text, std::vector<std::string> stop,
                           std::optional<OutputParserOptions> parser)
    : decoder_(text), stop_(std::move(stop)) {
  if (parser) parser_.emplace(std::move(*parser));
}

void OutputStream::Assume(std::string_view start) {
  if (parser_) parser_->Feed(start);
}

OutputDelta OutputStream::Parse(std::string_view text) {
  text_ += text;
  if (!parser_) {
    OutputDelta out;
    out.content = std::string(text);
    return out;
  }
  return Limit(parser_->Feed(text));
}

OutputDelta OutputStream::Limit(std::vector<OutputEvent> events) {
  if (max_calls_ < 0) return ToDelta(std::move(events));
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == OutputEvent::Kind::kToolCall && ++calls_ >= max_calls_) {
      // The last call allowed: nothing after it.
      events.resize(i + 1);
      stopped_ = true;
      break;
    }
  }
  return ToDelta(std::move(events));
}

Expected<OutputDelta> OutputStream::Push(std::span<const int32_t> tokens) {
  if (stopped_) return OutputDelta{};
  GZ_ASSIGN_OR_RETURN(std::string piece, decoder_.Push(tokens));
  held_ += piece;
  // The earliest stop string ends the answer.
  size_t first = std::string::npos;
  for (const std::string& stop : stop_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string ready = held_.substr(0, first);
    held_.clear();
    OutputDelta out = Parse(ready);
    if (parser_ && !CallLimitReached()) out.Append(Limit(parser_->Finish()));
    return out;
  }
  size_t keep = 0;
  for (const std::string& stop : stop_) {
    for (size_t n = std::min(held_.size(), stop.size() - 1); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string ready = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  OutputDelta out = Parse(ready);
  if (stopped_) held_.clear();  // the call limit: nothing after the last call
  return out;
}

Expected<OutputDelta> OutputStream::Finish() {
  if (stopped_) return OutputDelta{};
  GZ_ASSIGN_OR_RETURN(std::string piece, decoder_.Push({}, /*final=*/true));
  held_ += piece;
  size_t first = std::string::npos;
  for (const std::string& stop : stop_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    held_.resize(first);
  }
  OutputDelta out = Parse(held_);
  held_.clear();
  if (parser_ && !CallLimitReached()) out.Append(Limit(parser_->Finish()));
  return out;
}

}  // namespace gizllm::server
