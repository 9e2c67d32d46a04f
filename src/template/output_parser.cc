#include "template/output_parser.h"

#include <algorithm>

#include "core/json_nesting.h"

namespace gizllm {

namespace {

using nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest end of `text` that is a proper start of `tag`: text that must wait
// for the next piece.
size_t PartialTagAtEnd(std::string_view text, std::string_view tag) {
  size_t n = std::min(text.size(), tag.size() - 1);
  for (; n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// The length of an unfinished UTF-8 sequence at the end of `text`: events carry whole
// characters only.
size_t PartialUtf8AtEnd(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && n < 4) {
    unsigned char c = static_cast<unsigned char>(text[text.size() - 1 - n]);
    ++n;
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return want > n ? n : 0;
  }
  return 0;
}

size_t HoldBack(std::string_view text, std::string_view tag) {
  return std::max(PartialTagAtEnd(text, tag), PartialUtf8AtEnd(text));
}

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

const ordered_json* FindParameters(const ordered_json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const ordered_json& fn = tool.contains("function") ? tool["function"] : tool;
    if (!fn.is_object() || fn.value("name", "") != name) continue;
    auto params = fn.find("parameters");
    if (params == fn.end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    return props != params->end() && props->is_object() ? &*props : nullptr;
  }
  return nullptr;
}

// Whether a parameter's schema allows a string ("type": "string" or a list holding it), and
// whether it names a type at all.
void SchemaTypes(const ordered_json& schema, bool& has_type, bool& allows_string) {
  has_type = false;
  allows_string = false;
  if (!schema.is_object()) return;
  auto type = schema.find("type");
  if (type == schema.end()) {
    if (schema.contains("enum") && schema["enum"].is_array()) {
      has_type = true;
      for (const auto& e : schema["enum"]) allows_string = allows_string || e.is_string();
    }
    return;
  }
  if (type->is_string()) {
    has_type = true;
    allows_string = *type == "string";
  } else if (type->is_array()) {
    for (const auto& t : *type) {
      if (!t.is_string()) continue;
      has_type = true;
      allows_string = allows_string || t == "string";
    }
  }
}

// Whether a schema's "type" (a name or a list) names `type`.
bool AllowsType(const ordered_json& schema, std::string_view type) {
  if (!schema.is_object() || !schema.contains("type")) return false;
  const ordered_json& t = schema["type"];
  if (t.is_string()) return t.get<std::string>() == type;
  if (!t.is_array()) return false;
  return std::any_of(t.begin(), t.end(), [&](const ordered_json& e) {
    return e.is_string() && e.get<std::string>() == type;
  });
}

// The XML form: <function=NAME><parameter=KEY>VALUE</parameter>...</function>. Values are text;
// one newline after the opening tag and one before the closing tag belong to the tags.
bool ParseXmlCall(std::string_view body, std::string& name, ordered_json& arguments) {
  constexpr std::string_view kFunction = "<function=";
  if (body.substr(0, kFunction.size()) != kFunction) return false;
  size_t close = body.find('>');
  if (close == std::string_view::npos) return false;
  // A name or key holds no tag and no line break: a '>' missing from its tag is no call.
  auto bad_name = [](std::string_view n) {
    return n.empty() || n.find_first_of("<\n") != std::string_view::npos;
  };
  name = std::string(Trim(body.substr(kFunction.size(), close - kFunction.size())));
  if (bad_name(name)) return false;
  arguments = ordered_json::object();
  std::string_view rest = body.substr(close + 1);
  constexpr std::string_view kParam = "<parameter=";
  constexpr std::string_view kParamEnd = "</parameter>";
  while (true) {
    rest = Trim(rest);
    if (rest.substr(0, kParam.size()) != kParam) break;
    size_t key_end = rest.find('>');
    if (key_end == std::string_view::npos) return false;
    std::string key(Trim(rest.substr(kParam.size(), key_end - kParam.size())));
    if (bad_name(key)) return false;
    rest = rest.substr(key_end + 1);
    size_t value_end = rest.find(kParamEnd);
    if (value_end == std::string_view::npos) return false;
    std::string_view value = rest.substr(0, value_end);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    arguments[key] = std::string(value);
    rest = rest.substr(value_end + kParamEnd.size());
  }
  rest = Trim(rest);
  return rest.empty() || rest == "</function>";
}

// Types the XML form's text values by the tool's schema: text stays text (ArgumentIsText),
// anything else is read as JSON (True and False as booleans); false when such a value does not
// parse.
bool TypeXmlArguments(const ordered_json& tools, const std::string& name, ordered_json& arguments) {
  const ordered_json* props = FindParameters(tools, name);
  if (props == nullptr) return true;
  for (auto& [key, value] : arguments.items()) {
    auto schema = props->find(key);
    if (schema == props->end() || ArgumentIsText(*schema)) continue;
    const std::string& text = value.get_ref<const std::string&>();
    if (JsonTooDeep(text)) return false;
    ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    // Python's spelling of a boolean, which Qwen3-Coder's template writes for one (`| string`).
    if (parsed.is_discarded() && (text == "True" || text == "False") &&
        AllowsType(*schema, "boolean")) {
      parsed = text == "True";
    }
    if (parsed.is_discarded()) return false;
    value = std::move(parsed);
  }
  return true;
}

bool ParseJsonCall(std::string_view body, std::string& name, ordered_json& arguments) {
  // A model's text nested deeper than requests may be is not read as a call.
  if (JsonTooDeep(body)) return false;
  ordered_json call = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (call.is_discarded() || !call.is_object()) return false;
  auto n = call.find("name");
  if (n == call.end() || !n->is_string()) return false;
  name = n->get<std::string>();
  auto args = call.find("arguments");
  if (args == call.end()) args = call.find("parameters");
  if (args == call.end() || args->is_null()) {
    arguments = ordered_json::object();
  } else if (args->is_string()) {
    if (JsonTooDeep(args->get<std::string>())) return false;
    arguments = ordered_json::parse(args->get<std::string>(), nullptr, false);
    if (arguments.is_discarded() || !arguments.is_object()) return false;
  } else if (args->is_object()) {
    arguments = *args;
  } else {
    return false;
  }
  return true;
}

}  // namespace

ToolCallSyntax ToolCallSyntaxOf(std::string_view chat_template) {
  bool xml = chat_template.find("<function=") != std::string_view::npos ||
             chat_template.find("<parameter=") != std::string_view::npos;
  return xml ? ToolCallSyntax::kXml : ToolCallSyntax::kJson;
}

bool ArgumentIsText(const ordered_json& schema) {
  bool has_type, allows_string;
  SchemaTypes(schema, has_type, allows_string);
  return !has_type || allows_string;
}

bool PromptOpensReasoning(std::string_view prompt) {
  size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  size_t close = prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

ordered_json TypeArguments(const ordered_json& tools, const std::string& name,
                           ordered_json arguments) {
  const ordered_json* props = FindParameters(tools, name);
  if (props == nullptr || !arguments.is_object()) return arguments;
  for (auto& [key, value] : arguments.items()) {
    auto schema = props->find(key);
    if (schema == props->end()) continue;
    bool has_type, allows_string;
    SchemaTypes(*schema, has_type, allows_string);
    if (!has_type) continue;
    if (allows_string) {
      if (!value.is_string() && !value.is_null()) value = value.dump();
    } else if (value.is_string() && !JsonTooDeep(value.get<std::string>())) {
      ordered_json parsed = ordered_json::parse(value.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) value = std::move(parsed);
    }
  }
  return arguments;
}

OutputParser::OutputParser(OutputParserOptions options)
    : options_(std::move(options)),
      state_(options_.starts_in_reasoning ? State::kReasoning : State::kStart),
      strip_newlines_(options_.starts_in_reasoning) {}

void OutputParser::Emit(OutputEvent::Kind kind, std::string_view text,
                        std::vector<OutputEvent>& out) {
  if (strip_newlines_) {
    size_t skip = 0;
    while (skip < text.size() && text[skip] == '\n') ++skip;
    text.remove_prefix(skip);
    if (text.empty()) return;
    strip_newlines_ = false;
  }
  if (text.empty()) return;
  // Newlines at the end wait: a closing tag right after them drops them.
  std::string emit = held_newlines_;
  emit += text;
  size_t keep = emit.size();
  while (keep > 0 && emit[keep - 1] == '\n') --keep;
  held_newlines_ = emit.substr(keep);
  emit.resize(keep);
  if (emit.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += emit;
  } else {
    out.push_back(OutputEvent{kind, std::move(emit), "", "", ""});
  }
}

bool OutputParser::ReadCall(std::string& name, ordered_json& arguments) const {
  std::string_view body = Trim(call_body_);
  if (ParseXmlCall(body, name, arguments)) {
    return TypeXmlArguments(options_.tools, name, arguments);
  }
  if (!ParseJsonCall(body, name, arguments)) return false;
  arguments = TypeArguments(options_.tools, name, std::move(arguments));
  return true;
}

void OutputParser::CloseToolCall(std::vector<OutputEvent>& out) {
  std::string name;
  ordered_json arguments;
  if (!ReadCall(name, arguments)) {
    // Not a call the parser can read: the text goes on as content, as it was written.
    Emit(OutputEvent::Kind::kContent, std::string(kCallOpen) + call_body_ + std::string(kCallClose),
         out);
    call_body_.clear();
    return;
  }
  OutputEvent e{OutputEvent::Kind::kToolCall, "", name, arguments.dump(),
                options_.id_prefix + std::to_string(calls_)};
  ++calls_;
  out.push_back(std::move(e));
  call_body_.clear();
}

void OutputParser::Process(bool final, std::vector<OutputEvent>& out) {
  while (true) {
    switch (state_) {
      case State::kStart: {
        if (!options_.reasoning) {
          state_ = State::kContent;
          break;
        }
        if (buffer_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
          buffer_.erase(0, kThinkOpen.size());
          state_ = State::kReasoning;
          strip_newlines_ = true;
          break;
        }
        if (!final && kThinkOpen.substr(0, buffer_.size()) == buffer_) return;
        state_ = State::kContent;
        break;
      }
      case State::kReasoning: {
        size_t at = buffer_.find(kThinkClose);
        if (at != std::string::npos) {
          Emit(OutputEvent::Kind::kReasoning, std::string_view(buffer_).substr(0, at), out);
          held_newlines_.clear();
          buffer_.erase(0, at + kThinkClose.size());
          state_ = State::kContent;
          strip_newlines_ = true;
          break;
        }
        size_t keep = final ? 0 : HoldBack(buffer_, kThinkClose);
        Emit(OutputEvent::Kind::kReasoning,
             std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
      case State::kContent: {
        size_t at = options_.tool_calls ? buffer_.find(kCallOpen) : std::string::npos;
        if (at != std::string::npos) {
          Emit(OutputEvent::Kind::kContent, std::string_view(buffer_).substr(0, at), out);
          held_newlines_.clear();
          strip_newlines_ = false;
          buffer_.erase(0, at + kCallOpen.size());
          state_ = State::kToolCall;
          break;
        }
        size_t keep = final                 ? 0
                      : options_.tool_calls ? HoldBack(buffer_, kCallOpen)
                                            : PartialUtf8AtEnd(buffer_);
        Emit(OutputEvent::Kind::kContent,
             std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
      case State::kToolCall: {
        size_t at = buffer_.find(kCallClose);
        if (at != std::string::npos) {
          call_body_ += buffer_.substr(0, at);
          buffer_.erase(0, at + kCallClose.size());
          CloseToolCall(out);
          state_ = State::kContent;
          strip_newlines_ = true;
          break;
        }
        size_t keep = final ? 0 : PartialTagAtEnd(buffer_, kCallClose);
        call_body_ += buffer_.substr(0, buffer_.size() - keep);
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
    }
  }
}

std::vector<OutputEvent> OutputParser::Feed(std::string_view piece) {
  std::vector<OutputEvent> out;
  buffer_ += piece;
  Process(/*final=*/false, out);
  return out;
}

std::vector<OutputEvent> OutputParser::Finish() {
  std::vector<OutputEvent> out;
  Process(/*final=*/true, out);
  if (state_ == State::kToolCall) {
    // The answer stopped inside a call (some models end on the stop token without the closing
    // tag): a complete body is still a call; anything else is content.
    std::string name;
    ordered_json arguments;
    if (ReadCall(name, arguments)) {
      CloseToolCall(out);
    } else {
      Emit(OutputEvent::Kind::kContent, std::string(kCallOpen) + call_body_, out);
      call_body_.clear();
    }
    state_ = State::kContent;
  }
  if (!held_newlines_.empty()) {
    OutputEvent::Kind kind =
        state_ == State::kReasoning ? OutputEvent::Kind::kReasoning : OutputEvent::Kind::kContent;
    std::string held = std::move(held_newlines_);
    held_newlines_.clear();
    if (!out.empty() && out.back().kind == kind) {
      out.back().text += held;
    } else {
      out.push_back(OutputEvent{kind, std::move(held), "", "", ""});
    }
  }
  return out;
}

}  // namespace gizllm
