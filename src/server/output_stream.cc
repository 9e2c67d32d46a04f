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

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest end of `text` that is a proper start of one of `tags`.
size_t PartialTagLength(std::string_view text, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view tag : tags) {
    for (size_t n = std::min(text.size(), tag.size() - 1); n > best; --n) {
      if (text.substr(text.size() - n) == tag.substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

bool IsBlank(std::string_view text) {
  return text.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace

void TaggedOutputParser::Emit(std::string_view text, OutputDelta* out) {
  if (state_ == kReasoning) {
    out->reasoning += text;
  } else {
    if (after_reasoning_) {
      size_t start = text.find_first_not_of("\r\n");
      if (start == std::string_view::npos) return;
      text = text.substr(start);
      after_reasoning_ = false;
    }
    out->content += text;
  }
}

void TaggedOutputParser::Run(bool final, OutputDelta* out) {
  for (;;) {
    if (state_ == kToolCall) {
      size_t end = pending_.find(kCallClose);
      if (end == std::string::npos) {
        size_t keep = final ? 0 : PartialTagLength(pending_, {kCallClose});
        call_ += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        if (final) {
          // A call cut short stays text.
          out->content += std::string(kCallOpen) + call_;
          call_.clear();
        }
        return;
      }
      call_ += pending_.substr(0, end);
      pending_.erase(0, end + kCallClose.size());
      nlohmann::json call = nlohmann::json::parse(call_, nullptr, /*allow_exceptions=*/false);
      if (call.is_object() && call.contains("name") && call["name"].is_string()) {
        nlohmann::json arguments = call.value("arguments", nlohmann::json::object());
        if (call.contains("parameters") && !call.contains("arguments")) {
          arguments = call["parameters"];
        }
        out->tool_calls.push_back(
            {call["name"].get<std::string>(),
             arguments.is_string()
                 ? arguments.get<std::string>()
                 : arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
      } else {
        out->content += std::string(kCallOpen) + call_ + std::string(kCallClose);
      }
      call_.clear();
      state_ = kContent;
      after_call_ = true;
      continue;
    }
    std::string_view open = state_ == kReasoning ? kThinkClose : kCallOpen;
    size_t at = pending_.find(open);
    size_t think = state_ == kContent ? pending_.find(kThinkOpen) : std::string::npos;
    if (think != std::string::npos && (at == std::string::npos || think < at)) {
      Emit(std::string_view(pending_).substr(0, think), out);
      pending_.erase(0, think + kThinkOpen.size());
      state_ = kReasoning;
      continue;
    }
    if (at == std::string::npos) {
      size_t keep =
          final ? 0
                : (state_ == kReasoning ? PartialTagLength(pending_, {kThinkClose})
                                        : PartialTagLength(pending_, {kCallOpen, kThinkOpen}));
      std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - keep);
      // Blank text after a tool call waits: it is dropped if another call or the end follows.
      if (state_ == kContent && after_call_ && IsBlank(ready)) {
        if (final) pending_.clear();
        return;
      }
      after_call_ = false;
      Emit(ready, out);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    std::string_view before = std::string_view(pending_).substr(0, at);
    if (state_ == kReasoning) {
      Emit(before, out);
      pending_.erase(0, at + open.size());
      state_ = kContent;
      after_reasoning_ = true;
    } else {
      if (!IsBlank(before)) Emit(before, out);
      after_call_ = false;
      pending_.erase(0, at + open.size());
      state_ = kToolCall;
    }
  }
}

OutputDelta TaggedOutputParser::Feed(std::string_view text) {
  pending_ += text;
  OutputDelta out;
  Run(/*final=*/false, &out);
  return out;
}

OutputDelta TaggedOutputParser::Finish() {
  OutputDelta out;
  Run(/*final=*/true, &out);
  return out;
}

OutputStream::OutputStream(const TextModel& text, std::vector<std::string> stop,
                           std::unique_ptr<OutputParser> parser)
    : decoder_(text), stop_(std::move(stop)), parser_(std::move(parser)) {}

OutputDelta OutputStream::Parse(std::string_view text) {
  text_ += text;
  if (!parser_) {
    OutputDelta out;
    out.content = std::string(text);
    return out;
  }
  return parser_->Feed(text);
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
    if (parser_) out.Append(parser_->Finish());
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
  return Parse(ready);
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
  if (parser_) out.Append(parser_->Finish());
  return out;
}

}  // namespace gizllm::server
