// The streaming answer parser: the same events whichever way the answer is cut into pieces.
#include "template/output_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "template/chat_template.h"

namespace gizllm {
namespace {

using nlohmann::ordered_json;

struct Call {
  std::string name;
  std::string arguments;
  std::string id;
  bool operator==(const Call& o) const {
    return name == o.name && arguments == o.arguments && id == o.id;
  }
};

struct Parsed {
  std::string reasoning;
  std::string content;
  std::vector<Call> calls;
  std::vector<OutputEvent::Kind> order;  // kinds in the order they came, merged runs
};

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

void Collect(const std::vector<OutputEvent>& events, Parsed& p) {
  for (const OutputEvent& e : events) {
    EXPECT_TRUE(ValidUtf8(e.text)) << "an event splits a character: " << e.text;
    if (e.kind != OutputEvent::Kind::kToolCall) {
      EXPECT_FALSE(e.text.empty());
    }
    if (p.order.empty() || p.order.back() != e.kind || e.kind == OutputEvent::Kind::kToolCall) {
      p.order.push_back(e.kind);
    }
    switch (e.kind) {
      case OutputEvent::Kind::kReasoning:
        p.reasoning += e.text;
        break;
      case OutputEvent::Kind::kContent:
        p.content += e.text;
        break;
      case OutputEvent::Kind::kToolCall:
        p.calls.push_back({e.name, e.arguments, e.id});
        break;
    }
  }
}

Parsed Run(const OutputParserOptions& options, const std::vector<std::string>& pieces) {
  OutputParser parser(options);
  Parsed p;
  for (const std::string& piece : pieces) Collect(parser.Feed(piece), p);
  Collect(parser.Finish(), p);
  return p;
}

void ExpectSame(const Parsed& a, const Parsed& b, const std::string& how) {
  EXPECT_EQ(a.reasoning, b.reasoning) << how;
  EXPECT_EQ(a.content, b.content) << how;
  EXPECT_EQ(a.calls, b.calls) << how;
  EXPECT_EQ(a.order, b.order) << how;
}

// Whole, byte by byte, split in two at every byte, and in random pieces: all the same.
Parsed RunAllSplits(const OutputParserOptions& options, const std::string& text) {
  Parsed whole = Run(options, {text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ExpectSame(whole, Run(options, bytes), "byte by byte");
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ExpectSame(whole, Run(options, {text.substr(0, cut), text.substr(cut)}),
               "cut at " + std::to_string(cut));
  }
  std::mt19937 rng(static_cast<unsigned>(text.size()));
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> pieces;
    size_t at = 0;
    while (at < text.size()) {
      size_t n = 1 + rng() % 7;
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    ExpectSame(whole, Run(options, pieces), "random pieces");
  }
  return whole;
}

ordered_json Tools() {
  return ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                     "detail": {"type": "object"}, "metric": {"type": ["boolean", "null"]},
                     "note": {"type": ["string", "null"]}}}}},
    {"name": "search", "parameters": {"properties": {"query": {"type": "string"},
                                                     "limit": {"type": "number"}}}}])");
}

TEST(OutputParser, ReasoningThenContent) {
  Parsed p =
      RunAllSplits({}, "<think>\nThe user greets me.\nBe brief.\n</think>\n\nHello! Ünïcode ✓");
  EXPECT_EQ(p.reasoning, "The user greets me.\nBe brief.");
  EXPECT_EQ(p.content, "Hello! Ünïcode ✓");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.order, (std::vector{OutputEvent::Kind::kReasoning, OutputEvent::Kind::kContent}));
}

TEST(OutputParser, PromptOpenedTheReasoning) {
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
  OutputParserOptions options;
  options.starts_in_reasoning = true;
  Parsed p = RunAllSplits(options, "\nStill thinking.\n</think>\n\nDone.\n");
  EXPECT_EQ(p.reasoning, "Still thinking.");
  EXPECT_EQ(p.content, "Done.\n");
}

TEST(OutputParser, EmptyThinkBlockAndPlainAnswers) {
  Parsed empty = RunAllSplits({}, "<think>\n\n</think>\n\nJust the answer.");
  EXPECT_EQ(empty.reasoning, "");
  EXPECT_EQ(empty.content, "Just the answer.");
  Parsed plain = RunAllSplits({}, "No reasoning here, <thinking> is text.");
  EXPECT_EQ(plain.reasoning, "");
  EXPECT_EQ(plain.content, "No reasoning here, <thinking> is text.");
  Parsed lookalike = RunAllSplits({}, "<thinking>");
  EXPECT_EQ(lookalike.content, "<thinking>");
  Parsed unfinished = RunAllSplits({}, "<think>\nran out of tokens\n");
  EXPECT_EQ(unfinished.reasoning, "ran out of tokens\n");
  EXPECT_EQ(unfinished.content, "");
  Parsed partial_tag = RunAllSplits({}, "ends with <tool_ca");
  EXPECT_EQ(partial_tag.content, "ends with <tool_ca");
}

TEST(OutputParser, ToolCallsTypedBySchema) {
  OutputParserOptions options;
  options.tools = Tools();
  options.id_prefix = "call_r7_";
  const std::string text =
      "<think>\nI need the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
      R"({"name": "get_weather", "arguments": {"city": 1234, "days": "3", "detail": "{\"a\": [1]}", "metric": "true", "note": null, "extra": "5"}})"
      "\n</tool_call>\n<tool_call>\n"
      R"({"name": "search", "arguments": "{\"query\": \"café\", \"limit\": \"2.5\"}"})"
      "\n</tool_call>";
  Parsed p = RunAllSplits(options, text);
  EXPECT_EQ(p.reasoning, "I need the weather.");
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments,
            R"({"city":"1234","days":3,"detail":{"a":[1]},"metric":true,"note":null,"extra":"5"})");
  EXPECT_EQ(p.calls[0].id, "call_r7_0");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments, R"({"query":"café","limit":2.5})");
  EXPECT_EQ(p.calls[1].id, "call_r7_1");
  EXPECT_EQ(p.order, (std::vector{OutputEvent::Kind::kReasoning, OutputEvent::Kind::kContent,
                                  OutputEvent::Kind::kToolCall, OutputEvent::Kind::kToolCall}));
}

TEST(OutputParser, XmlToolCallsKeepStringsAsText) {
  OutputParserOptions options;
  options.tools = Tools();
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n7\n</parameter>\n<parameter=note>\n{\"not\": \"json\"}\n</parameter>\n"
      "</function>\n</tool_call>\nAfter the call.";
  Parsed p = RunAllSplits(options, text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"New York","days":7,"note":"{\"not\": \"json\"}"})");
  EXPECT_EQ(p.content, "After the call.");
}

// Each type of value in the XML form, several calls, streamed in every split: strings stay text
// (a newline inside kept, one at each end dropped), other types are read as JSON.
TEST(OutputParser, XmlToolCallsTypeEachValue) {
  OutputParserOptions options;
  options.tools = Tools();
  const std::string text =
      "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\nBrazil\n"
      "</parameter>\n<parameter=days>\n-3\n</parameter>\n<parameter=detail>\n{\"a\": [1, true]}\n"
      "</parameter>\n<parameter=metric>\nfalse\n</parameter>\n<parameter=note>\n42\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\n"
      "a < b </param>\n</parameter>\n<parameter=limit>\n2.5e1\n</parameter>\n</function>\n"
      "</tool_call>";
  Parsed p = RunAllSplits(options, text);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments,
            R"({"city":"São Paulo\nBrazil","days":-3,"detail":{"a":[1,true]},"metric":false,)"
            R"("note":"42"})");
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments, R"({"query":"a < b </param>","limit":25.0})");
  EXPECT_EQ(p.calls[1].id, "call_1");
  EXPECT_EQ(p.content, "Checking.");
}

// A value of a non-string type that is not JSON makes the call unreadable: it stays content, as
// a JSON-form call that does not parse does. Parameters and functions the tools do not name
// are not typed (their values stay text).
TEST(OutputParser, XmlToolCallsWithBadValuesStayContent) {
  OutputParserOptions options;
  options.tools = Tools();
  for (const char* bad :
       {"<parameter=days>\nseven\n</parameter>\n", "<parameter=detail>\n{\"a\": \n</parameter>\n",
        "<parameter=metric>\nyes\n</parameter>\n"}) {
    SCOPED_TRACE(bad);
    const std::string call =
        "<tool_call>\n<function=get_weather>\n" + std::string(bad) + "</function>\n</tool_call>";
    Parsed p = RunAllSplits(options, "A" + call + "B");
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, "A" + call + "B");
  }
  // Python's booleans, as Qwen3-Coder's template writes them, are booleans.
  Parsed python =
      RunAllSplits(options,
                   "<tool_call>\n<function=get_weather>\n<parameter=metric>\nTrue\n</parameter>\n"
                   "</function>\n</tool_call>");
  ASSERT_EQ(python.calls.size(), 1u);
  EXPECT_EQ(python.calls[0].arguments, R"({"metric":true})");
  Parsed other = RunAllSplits(
      options,
      "<tool_call>\n<function=get_time>\n<parameter=zone>\n+2\n</parameter>\n</function>\n"
      "</tool_call><tool_call>\n<function=search>\n<parameter=page>\n7\n</parameter>\n"
      "</function>\n</tool_call>");
  ASSERT_EQ(other.calls.size(), 2u);
  EXPECT_EQ(other.calls[0].name, "get_time");
  EXPECT_EQ(other.calls[0].arguments, R"({"zone":"+2"})");
  EXPECT_EQ(other.calls[1].arguments, R"({"page":"7"})");
}

// Tags that are not whole: a parameter without its closing tag, a function tag without '>' or
// a name, a stray text between parameters, or a call cut before its end.
TEST(OutputParser, XmlToolCallsWithBrokenTagsStayContent) {
  OutputParserOptions options;
  options.tools = Tools();
  for (const char* body :
       {"<function=search>\n<parameter=query>\ncats\n</function>\n",
        "<function=search\n<parameter=query>\ncats\n</parameter>\n</function>\n",
        "<function=>\n<parameter=query>\ncats\n</parameter>\n</function>\n",
        "<function=search>\n<parameter=query\ncats\n</parameter>\n</function>\n",
        "<function=search>\nhello<parameter=query>\ncats\n</parameter>\n</function>\n",
        "<function=search>\n<parameter=query>\ncats\n</parameter>\n</function>\nmore\n"}) {
    SCOPED_TRACE(body);
    const std::string call = "<tool_call>\n" + std::string(body) + "</tool_call>";
    Parsed p = RunAllSplits(options, call);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, call);
  }
  // Cut inside a value: content as written.
  const std::string cut = "<tool_call>\n<function=search>\n<parameter=query>\nca";
  Parsed p = RunAllSplits(options, cut);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, cut);
  // Cut after the last parameter (no </function>, no </tool_call>): the body is whole.
  Parsed whole =
      RunAllSplits(options, "<tool_call>\n<function=search>\n<parameter=limit>\n3\n</parameter>\n");
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].arguments, R"({"limit":3})");
}

TEST(OutputParser, ToolCallSyntaxFollowsTheTemplate) {
  EXPECT_EQ(ToolCallSyntaxOf("{{- '<tool_call>\\n{\"name\": ' + name }}"), ToolCallSyntax::kJson);
  EXPECT_EQ(ToolCallSyntaxOf("{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"),
            ToolCallSyntax::kXml);
  EXPECT_EQ(ToolCallSyntaxOf("{{- '<parameter=' + args_name + '>\\n' }}"), ToolCallSyntax::kXml);
  EXPECT_EQ(ToolCallSyntaxOf(""), ToolCallSyntax::kJson);
  EXPECT_TRUE(ArgumentIsText(ordered_json::parse(R"({"type": "string"})")));
  EXPECT_TRUE(ArgumentIsText(ordered_json::parse(R"({"type": ["integer", "string"]})")));
  EXPECT_TRUE(ArgumentIsText(ordered_json::parse(R"({"enum": ["a", 1]})")));
  EXPECT_TRUE(ArgumentIsText(ordered_json::parse(R"({"description": "anything"})")));
  EXPECT_FALSE(ArgumentIsText(ordered_json::parse(R"({"type": ["integer", "null"]})")));
  EXPECT_FALSE(ArgumentIsText(ordered_json::parse(R"({"enum": [1, 2]})")));
  EXPECT_FALSE(ArgumentIsText(ordered_json::parse(R"({"type": "array"})")));
}

// A chat template of the XML form (the tool-call lines of Qwen3-Coder's) is told apart from the
// JSON form's, and the calls it renders into an assistant turn parse back into the arguments
// it was given, typed by the tools.
TEST(OutputParser, XmlCallsATemplateWritesParseBack) {
  const std::string source = R"({%- for m in messages %}<|im_start|>{{ m.role }}
{%- for tool_call in m.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
{%- for args_name, args_value in tool_call.arguments|items %}
{{- '<parameter=' + args_name + '>\n' }}
{%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
{{- args_value }}
{{- '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}<|im_end|>
{% endfor %})";
  Expected<ChatTemplate> chat_template = ChatTemplate::FromString(source);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status().message();
  EXPECT_EQ(ToolCallSyntaxOf(chat_template->source()), ToolCallSyntax::kXml);
  const ordered_json arguments = ordered_json::parse(
      R"({"city": "Paris\nFrance", "days": 3, "detail": {"a": [1, 2]}, "metric": true,
          "note": "x < y"})");
  const ordered_json other = ordered_json::parse(R"({"query": "cats", "limit": 2.5})");
  ordered_json input;
  input["messages"] = ordered_json::array();
  input["messages"].push_back(
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        {{{"function", {{"name", "get_weather"}, {"arguments", arguments}}}},
         {{"function", {{"name", "search"}, {"arguments", other}}}}}}});
  Expected<std::string> text = chat_template->Render(input);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const std::string open = "<|im_start|>assistant";
  ASSERT_EQ(text->rfind(open, 0), 0u) << *text;
  const std::string answer = text->substr(open.size(), text->find("<|im_end|>") - open.size());
  OutputParserOptions options;
  options.tools = Tools();
  Parsed p = RunAllSplits(options, answer);
  ASSERT_EQ(p.calls.size(), 2u) << answer;
  EXPECT_EQ(ordered_json::parse(p.calls[0].arguments), arguments) << answer;
  EXPECT_EQ(ordered_json::parse(p.calls[1].arguments), other) << answer;
  EXPECT_EQ(p.content, "");
}

TEST(OutputParser, UnreadableCallsStayContent) {
  OutputParserOptions options;
  options.tools = Tools();
  Parsed bad = RunAllSplits(options, "A<tool_call>\n{\"name\": oops}\n</tool_call>B");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "A<tool_call>\n{\"name\": oops}\n</tool_call>B");
  // The answer stopped inside a call: a whole body is still a call.
  Parsed whole = RunAllSplits(options, "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n");
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].arguments, "{}");
  Parsed cut = RunAllSplits(options, "<tool_call>\n{\"name\": \"sea");
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<tool_call>\n{\"name\": \"sea");
}

TEST(OutputParser, OptionsTurnRecognitionOff) {
  OutputParserOptions options;
  options.reasoning = false;
  options.tool_calls = false;
  const std::string text = "<think>x</think><tool_call>{\"name\": \"f\"}</tool_call>";
  Parsed p = RunAllSplits(options, text);
  EXPECT_EQ(p.content, text);
  EXPECT_TRUE(p.calls.empty());
}

TEST(OutputParser, TypeArgumentsLeavesUnknownToolsAlone) {
  ordered_json args = ordered_json::parse(R"({"days": "3"})");
  EXPECT_EQ(TypeArguments(Tools(), "nope", args), args);
  EXPECT_EQ(TypeArguments(Tools(), "get_weather", args), ordered_json::parse(R"({"days": 3})"));
  // Text that is not JSON stays text even where the schema wants a number.
  ordered_json words = ordered_json::parse(R"({"days": "three"})");
  EXPECT_EQ(TypeArguments(Tools(), "get_weather", words), words);
}

}  // namespace
}  // namespace gizllm
