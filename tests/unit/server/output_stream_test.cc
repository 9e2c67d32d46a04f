#include "server/output_stream.h"

#include <gtest/gtest.h>

#include "server/fake_generator.h"

namespace gizllm::server {
namespace {

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> t;
  for (unsigned char c : s) t.push_back(c);
  return t;
}

// Pushes `text` one token (byte) at a time and gathers what comes out.
OutputDelta Stream(OutputStream& out, std::string_view text) {
  OutputDelta all;
  for (int32_t t : Bytes(text)) {
    Expected<OutputDelta> d = out.Push(std::span<const int32_t>(&t, 1));
    EXPECT_TRUE(d.ok());
    all.Append(std::move(*d));
  }
  Expected<OutputDelta> rest = out.Finish();
  EXPECT_TRUE(rest.ok());
  all.Append(std::move(*rest));
  return all;
}

TEST(EndsInsideCharacter, Utf8) {
  EXPECT_FALSE(EndsInsideCharacter("abc"));
  EXPECT_FALSE(EndsInsideCharacter("\xC3\xA9"));
  EXPECT_TRUE(EndsInsideCharacter("a\xC3"));
  EXPECT_TRUE(EndsInsideCharacter("\xF0\x9F\x98"));
  EXPECT_FALSE(EndsInsideCharacter("\xF0\x9F\x98\x80"));
  EXPECT_TRUE(EndsInsideCharacter("x\xEF\xBF\xBD"));
}

TEST(TokenDecoder, NeverCutsACharacter) {
  FakeTextModel text;
  TokenDecoder decoder(text);
  std::string s =
      "a\xF0\x9F\x98\x80"
      "b\xC3\xA9";
  std::vector<std::string> pieces;
  for (int32_t t : Bytes(s)) {
    Expected<std::string> p = decoder.Push(std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(p.ok());
    if (!p->empty()) pieces.push_back(*p);
  }
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "\xF0\x9F\x98\x80", "b", "\xC3\xA9"}));
}

TEST(OutputStream, StopStringAcrossTokensIsCutAndNeverSent) {
  FakeTextModel text;
  OutputStream out(text, {"STOP", "zz"}, std::nullopt);
  std::string sent;
  for (int32_t t : Bytes("hello STxSTOP more")) {
    Expected<OutputDelta> d = out.Push(std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(d.ok());
    sent += d->content;
    // Never a piece of the stop string.
    EXPECT_EQ(sent.find("STO"), std::string::npos);
  }
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(sent, "hello STx");
}

TEST(OutputStream, HeldTextComesOutAtTheEnd) {
  FakeTextModel text;
  OutputStream out(text, {"STOP"}, std::nullopt);
  OutputDelta all = Stream(out, "abc ST");
  EXPECT_FALSE(out.stopped());
  EXPECT_EQ(all.content, "abc ST");
}

nlohmann::json Tools(std::initializer_list<const char*> names) {
  nlohmann::json tools = nlohmann::json::array();
  for (const char* name : names) {
    tools.push_back({{"type", "function"}, {"function", {{"name", name}}}});
  }
  return tools;
}

ChatPrompt PromptOf(std::string text) {
  ChatPrompt prompt;
  prompt.text = std::move(text);
  return prompt;
}

// The chat's answer goes through gizllm::OutputParser (the CLI chat's parser): reasoning,
// content and tool calls, whatever the tokens cut the tags into.
TEST(ChatOutput, ReasoningContentAndCalls) {
  FakeTextModel text;
  OutputStream out(text, {}, ChatParserOptions(Tools({"f", "g"}), PromptOf("<|assistant|>")));
  OutputDelta all = Stream(out,
                           "<think>\nhmm\n</think>\n\nSure.<tool_call>\n{\"name\": \"f\", "
                           "\"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": "
                           "\"g\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(all.reasoning, "hmm");
  EXPECT_EQ(all.content, "Sure.");
  ASSERT_EQ(all.tool_calls.size(), 2u);
  EXPECT_EQ(all.tool_calls[0].name, "f");
  EXPECT_EQ(all.tool_calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(all.tool_calls[1].name, "g");
  EXPECT_EQ(all.tool_calls[1].arguments, "{}");
}

TEST(ChatOutput, PromptOpensTheReasoning) {
  FakeTextModel text;
  OutputParserOptions options = ChatParserOptions(nullptr, PromptOf("<|assistant|><think>\n"));
  EXPECT_TRUE(options.starts_in_reasoning);
  EXPECT_FALSE(options.tool_calls);
  OutputStream out(text, {}, options);
  OutputDelta all = Stream(out, "plan</think>\n\nanswer <tool_call>{}</tool_call>");
  EXPECT_EQ(all.reasoning, "plan");
  // No tools: a tool call's tags are text.
  EXPECT_EQ(all.content, "answer <tool_call>{}</tool_call>");
  EXPECT_TRUE(all.tool_calls.empty());
}

TEST(ChatOutput, BrokenCallStaysText) {
  FakeTextModel text;
  OutputStream out(text, {}, ChatParserOptions(Tools({"f"}), PromptOf("")));
  OutputDelta all = Stream(out, "<tool_call>not json</tool_call>x<tool_call>{\"na");
  EXPECT_TRUE(all.tool_calls.empty());
  EXPECT_EQ(all.content, "<tool_call>not json</tool_call>x<tool_call>{\"na");
}

// A forced call: the prompt holds the call's tag, the model writes the call object on.
TEST(ChatOutput, AssumedStartCompletesACall) {
  FakeTextModel text;
  OutputStream out(text, {}, ChatParserOptions(Tools({"get_weather"}), PromptOf("")));
  out.Assume("<tool_call>\n");
  OutputDelta all =
      Stream(out, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(all.content, "");
  EXPECT_EQ(all.reasoning, "");
  ASSERT_EQ(all.tool_calls.size(), 1u);
  EXPECT_EQ(all.tool_calls[0].name, "get_weather");
  EXPECT_EQ(all.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  // The raw text is what the model wrote.
  EXPECT_EQ(out.text(), "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
}

// parallel_tool_calls false: the answer ends with its first call; what follows is dropped.
TEST(ChatOutput, CallLimitEndsTheAnswerAfterItsLastCall) {
  const std::string two =
      "ok <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call> then "
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call> end";
  FakeTextModel text;
  {
    OutputStream out(text, {}, ChatParserOptions(Tools({"a", "b"}), PromptOf("")));
    OutputDelta all = Stream(out, two);
    ASSERT_EQ(all.tool_calls.size(), 2u);  // no limit
    EXPECT_FALSE(out.stopped());
  }
  OutputStream out(text, {}, ChatParserOptions(Tools({"a", "b"}), PromptOf("")));
  out.LimitToolCalls(1);
  OutputDelta all;
  bool stopped_at_call = false;
  for (int32_t t : Bytes(two)) {
    Expected<OutputDelta> d = out.Push(std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(d.ok());
    if (!d->tool_calls.empty()) stopped_at_call = out.stopped();
    all.Append(std::move(*d));
  }
  Expected<OutputDelta> rest = out.Finish();
  ASSERT_TRUE(rest.ok());
  all.Append(std::move(*rest));
  EXPECT_TRUE(stopped_at_call);
  ASSERT_EQ(all.tool_calls.size(), 1u);
  EXPECT_EQ(all.tool_calls[0].name, "a");
  EXPECT_EQ(all.content.find("then"), std::string::npos) << all.content;
}

// Completions: no parser, the whole answer is content.
TEST(ChatOutput, NoParserKeepsTags) {
  FakeTextModel text;
  OutputStream out(text, {}, std::nullopt);
  OutputDelta all = Stream(out, "<think>x</think><tool_call>{}</tool_call>");
  EXPECT_EQ(all.content, "<think>x</think><tool_call>{}</tool_call>");
  EXPECT_TRUE(all.reasoning.empty());
}

}  // namespace
}  // namespace gizllm::server
