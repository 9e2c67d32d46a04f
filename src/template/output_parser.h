// Reads a Qwen3-style answer as it streams: reasoning (<think>...</think>), content, and tool
// calls (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, or the XML form
// <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gizllm {

struct OutputEvent {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind;
  std::string text;       // kReasoning, kContent: the new text
  std::string name;       // kToolCall: the function name
  std::string arguments;  // kToolCall: the arguments, a JSON object as text
  std::string id;         // kToolCall: id_prefix + index of the call in the answer
};

struct OutputParserOptions {
  // The prompt already opened <think> (Qwen3's template with thinking on ends in "<think>\n"
  // for some models): the answer starts inside the reasoning.
  bool starts_in_reasoning = false;
  // Recognize <think> at the start of the answer.
  bool reasoning = true;
  // Recognize <tool_call> blocks.
  bool tool_calls = true;
  // The request's tools ([{"type": "function", "function": {"name", "parameters"}}] or bare
  // functions): argument values are typed by each parameter's JSON schema.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::string id_prefix = "call_";
};

// How a model writes its tool calls inside <tool_call>...</tool_call>: Qwen3's JSON object
// {"name": ..., "arguments": {...}}, or the XML form of Qwen3-Coder and Qwen3.5:
//   <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>
// (a string value as raw text, any other as JSON).
enum class ToolCallSyntax { kJson, kXml };

// The syntax a chat template teaches its model: XML when the template writes "<function=" or
// "<parameter=" tags, JSON otherwise.
ToolCallSyntax ToolCallSyntaxOf(std::string_view chat_template);

// Whether an argument of this parameter schema is written as raw text in the XML form and kept
// as a string: its type (or enum) allows a string, or it names no type. Other values are JSON.
bool ArgumentIsText(const nlohmann::ordered_json& schema);

// True when `prompt` ends inside an open <think> block (the answer continues the reasoning).
bool PromptOpensReasoning(std::string_view prompt);

// Types tool-call arguments by the tool's schema: a string-typed parameter stays text (a JSON
// value the model gave for it becomes its text); a parameter of another type given as text is
// read as JSON when it parses. Unknown parameters are kept as they are.
nlohmann::ordered_json TypeArguments(const nlohmann::ordered_json& tools, const std::string& name,
                                     nlohmann::ordered_json arguments);

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  // Feeds the next piece of the answer; tags may be split across pieces. Returns the events
  // the piece completes; text that may be the start of a tag is held back.
  std::vector<OutputEvent> Feed(std::string_view piece);

  // The answer ended: flushes held text. An unclosed tool call, or one whose body does not
  // parse, comes back as content, as it was written. In the XML form a value that is not text
  // (ArgumentIsText) and does not parse as JSON makes the call one that does not parse.
  std::vector<OutputEvent> Finish();

  int tool_calls() const { return calls_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };

  void Emit(OutputEvent::Kind kind, std::string_view text, std::vector<OutputEvent>& out);
  void Process(bool final, std::vector<OutputEvent>& out);
  void CloseToolCall(std::vector<OutputEvent>& out);
  // Reads call_body_ in either syntax, its arguments typed by the tools; false: not a call.
  bool ReadCall(std::string& name, nlohmann::ordered_json& arguments) const;

  OutputParserOptions options_;
  State state_;
  std::string buffer_;           // text not yet emitted
  std::string call_body_;        // the inside of the open tool call
  bool strip_newlines_ = false;  // drop newlines before the next text (after a tag)
  std::string held_newlines_;    // newlines that a closing tag would drop
  int calls_ = 0;
};

}  // namespace gizllm
