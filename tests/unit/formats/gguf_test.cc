#include "formats/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/dtype.h"
#include "gguf_writer.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using testing::GgufWriter;

// A file under the system temp dir, removed at the end of the test.
class TempFile {
 public:
  TempFile() {
    std::random_device rd;
    path_ = (fs::temp_directory_path() /
             ("gizllm_gguf_" + std::to_string(::getpid()) + "_" + std::to_string(rd()) + ".gguf"))
                .string();
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string& Write(const std::string& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path_;
  }

 private:
  std::string path_;
};

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// `bytes` (at most 8) little-endian bytes of v.
std::string Le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

GgufWriter Sample() {
  GgufWriter w;
  w.String("general.architecture", "qwen3");
  w.Uint32("qwen3.block_count", 2);
  w.Int32("signed", -7);
  w.Uint64("big", uint64_t{1} << 40);
  w.Float32("qwen3.rope.freq_base", 10000.5f);
  w.Bool("tokenizer.ggml.add_bos_token", true);
  w.Strings("tokenizer.ggml.tokens", {"a", "",
                                      "\xc4\xa0"
                                      "b"});
  w.Int32s("tokenizer.ggml.token_type", {1, 3, -1});
  w.Tensor("w", GgmlType::kF32, {3, 2}, RandomBytes(24, 1));
  w.Tensor("e", GgmlType::kBF16, {5}, RandomBytes(10, 2));
  w.Tensor("q", GgmlType::kQ8_0, {2, 64}, RandomBytes(4 * 34, 3));
  return w;
}

TEST(GgufTest, ReadsMetadataAndTensors) {
  TempFile file;
  GgufWriter w = Sample();
  const std::string bytes = w.Bytes();
  auto f = GgufFile::Open(file.Write(bytes));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  ASSERT_EQ(f->metadata().size(), 8u);
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");
  EXPECT_EQ(*f->GetString("general.architecture"), "qwen3");
  EXPECT_EQ(*f->GetUint("qwen3.block_count"), 2u);
  EXPECT_EQ(*f->GetInt("signed"), -7);
  EXPECT_FALSE(f->GetUint("signed").ok());
  EXPECT_EQ(*f->GetUint("big"), uint64_t{1} << 40);
  EXPECT_EQ(*f->GetFloat("qwen3.rope.freq_base"), 10000.5);
  EXPECT_EQ(*f->GetFloat("qwen3.block_count"), 2.0);
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f->GetStrings("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "",
                                                                               "\xc4\xa0"
                                                                               "b"}));
  EXPECT_EQ(*f->GetInts("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 3, -1}));

  auto missing = f->GetString("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("\"nope\""), std::string::npos);
  auto wrong = f->GetString("qwen3.block_count");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("uint32"), std::string::npos) << wrong.status().message();
  EXPECT_NE(wrong.status().message().find(f->path()), std::string::npos);

  ASSERT_EQ(f->tensors().size(), 3u);
  const GgufTensor* t = f->FindTensor("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t->type, GgmlType::kF32);
  EXPECT_EQ(t->bytes, 24u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), 24), RandomBytes(24, 1));
  const GgufTensor* e = f->FindTensor("e");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->offset, 32u);  // after "w"'s 24 bytes, aligned
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(e->data), 10), RandomBytes(10, 2));
  const GgufTensor* q = f->FindTensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(q->bytes, 4u * 34u);
  EXPECT_EQ(q->Elements(), 128);
  EXPECT_EQ((q->data - f->FindTensor("w")->data) % 32, 0);
  EXPECT_EQ(f->FindTensor("x"), nullptr);
}

TEST(GgufTest, ReadsNumberArraysAsFloats) {
  TempFile file;
  GgufWriter w;
  w.Float32s("tokenizer.ggml.scores", {0.0f, -1.5f, -1e9f});
  w.Int32s("ints", {3, -4});
  w.Strings("strings", {"a"});
  auto f = GgufFile::Open(file.Write(w.Bytes()));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->GetFloats("tokenizer.ggml.scores"), (std::vector<double>{0.0, -1.5, -1e9}));
  EXPECT_EQ(*f->GetFloats("ints"), (std::vector<double>{3.0, -4.0}));
  auto wrong = f->GetFloats("strings");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("an array of numbers"), std::string::npos)
      << wrong.status().message();
  EXPECT_FALSE(f->GetInts("tokenizer.ggml.scores").ok());
}

TEST(GgufTest, HonoursAlignment) {
  TempFile file;
  GgufWriter w(/*alignment=*/64);
  w.Uint32("general.alignment", 64);
  w.Tensor("a", GgmlType::kF16, {3}, RandomBytes(6, 4));
  w.Tensor("b", GgmlType::kF16, {3}, RandomBytes(6, 5));
  auto f = GgufFile::Open(file.Write(w.Bytes()));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->FindTensor("b")->offset, 64u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->FindTensor("b")->data), 6),
            RandomBytes(6, 5));
}

void ExpectRefused(const std::string& bytes, StatusCode code,
                   const std::vector<std::string>& parts) {
  TempFile file;
  const std::string& path = file.Write(bytes);
  auto f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), code) << f.status().message();
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
  for (const std::string& p : parts) {
    EXPECT_NE(f.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << f.status().message();
  }
  EXPECT_LT(f.status().message().size(), 600u);
}

TEST(GgufTest, RefusesEveryTruncation) {
  // Every prefix of a valid file is refused cleanly (no over-read under ASan).
  const std::string bytes = Sample().Bytes();
  TempFile file;
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = GgufFile::Open(file.Write(bytes.substr(0, n)));
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes";
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().message();
  }
}

TEST(GgufTest, RefusesBadHeaders) {
  ExpectRefused("GGUX" + Le(3, 4) + Le(0, 8) + Le(0, 8), StatusCode::kDataLoss, {"not a GGUF"});
  ExpectRefused("GGUF" + Le(1, 4) + Le(0, 8) + Le(0, 8), StatusCode::kUnimplemented, {"version 1"});
  ExpectRefused("GGUF" + Le(3, 4) + Le(uint64_t{1} << 62, 8) + Le(0, 8), StatusCode::kDataLoss,
                {"tensor count"});
  ExpectRefused("GGUF" + Le(3, 4) + Le(0, 8) + Le(~uint64_t{0}, 8), StatusCode::kDataLoss,
                {"metadata count"});
  // A key whose length runs past the end, then one of 2^64 - 1 bytes (no overflow).
  ExpectRefused("GGUF" + Le(3, 4) + Le(0, 8) + Le(1, 8) + Le(100, 8) + "abc" + std::string(20, 0),
                StatusCode::kDataLoss, {"metadata entry 0's key", "100 bytes"});
  ExpectRefused("GGUF" + Le(3, 4) + Le(0, 8) + Le(1, 8) + Le(~uint64_t{0}, 8) + std::string(20, 0),
                StatusCode::kDataLoss, {"metadata entry 0's key"});
}

TEST(GgufTest, RefusesBadMetadata) {
  {
    GgufWriter w;
    w.Raw("k", 13, Le(0, 8));
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"k\"", "unknown value type 13"});
  }
  {
    GgufWriter w;  // an array of arrays
    w.Raw("nested", 9, Le(9, 4) + Le(1, 8) + Le(4, 4) + Le(0, 8));
    ExpectRefused(w.Bytes(), StatusCode::kUnimplemented, {"\"nested\"", "array of arrays"});
  }
  {
    GgufWriter w;  // more int32 elements than bytes, with a count that overflows count * 4
    w.Raw("ints", 9, Le(5, 4) + Le(uint64_t{1} << 62, 8) + std::string(16, '\0'));
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"ints\"", "int32 elements"});
  }
  {
    GgufWriter w;  // 2^40 strings claimed: refused before any is allocated
    w.Raw("strs", 9, Le(8, 4) + Le(uint64_t{1} << 40, 8) + std::string(16, '\0'));
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"strs\"", "strings"});
  }
  {
    GgufWriter w;  // the second string's length runs past the end
    w.Raw("strs", 9, Le(8, 4) + Le(2, 8) + Le(1, 8) + "x" + Le(1000, 8) + "yz");
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"strs\"[1]", "1000 bytes"});
  }
  {
    GgufWriter w;
    w.Raw("elements", 9, Le(77, 4) + Le(1, 8));
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"elements\"", "unknown element type 77"});
  }
  {
    GgufWriter w;
    w.Uint32("a", 1);
    w.Uint32("a", 2);
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"a\" appears twice"});
  }
  for (uint32_t bad : {0u, 3u, 48u}) {
    GgufWriter w;
    w.Uint32("general.alignment", bad);
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"general.alignment", "power of two"});
  }
  {
    GgufWriter w;
    w.Uint64("general.alignment", 32);
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"general.alignment", "uint64"});
  }
}

// A file with one tensor info written by hand: name, dims (innermost first), type, offset; and
// `data` bytes after the padding.
std::string OneTensor(const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset,
                      size_t data) {
  std::string s = "GGUF" + Le(3, 4) + Le(1, 8) + Le(0, 8);
  s += Le(1, 8) + "t" + Le(dims.size(), 4);
  for (uint64_t d : dims) s += Le(d, 8);
  s += Le(type, 4) + Le(offset, 8);
  s.resize((s.size() + 31) / 32 * 32, '\0');
  return s + RandomBytes(data, 9);
}

TEST(GgufTest, RefusesBadTensorInfos) {
  TempFile valid;
  ASSERT_TRUE(GgufFile::Open(valid.Write(OneTensor({4, 2}, 0, 0, 32))).ok());
  ExpectRefused(OneTensor({4, 2}, 0, 0, 31), StatusCode::kDataLoss,
                {"\"t\"", "32 bytes at offset 0", "outside the data (31 bytes)"});
  ExpectRefused(OneTensor({4, 2}, 0, 32, 32), StatusCode::kDataLoss, {"\"t\"", "outside"});
  ExpectRefused(OneTensor({4, 2}, 0, 8, 64), StatusCode::kDataLoss,
                {"\"t\"", "offset 8", "alignment 32"});
  ExpectRefused(OneTensor({4, 2}, 0, ~uint64_t{0} / 32 * 32, 64), StatusCode::kDataLoss,
                {"\"t\"", "outside"});
  ExpectRefused(OneTensor({4, 2, 1, 1, 1}, 0, 0, 64), StatusCode::kDataLoss,
                {"\"t\"", "5 dimensions"});
  ExpectRefused(OneTensor({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 64), StatusCode::kDataLoss,
                {"\"t\"", "overflow"});
  ExpectRefused(OneTensor({~uint64_t{0}}, 0, 0, 64), StatusCode::kDataLoss, {"\"t\"", "overflow"});
  // 2^62 F32 elements: the element count fits int64, the byte count does not fit the file.
  ExpectRefused(OneTensor({uint64_t{1} << 62}, 0, 0, 64), StatusCode::kDataLoss, {"\"t\""});
  ExpectRefused(OneTensor({4}, 99, 0, 64), StatusCode::kDataLoss,
                {"\"t\"", "unknown block type 99"});
  // gizllm's own block types are a converted folder's, never a GGUF file's.
  ExpectRefused(OneTensor({128}, 1008, 0, 256), StatusCode::kDataLoss,
                {"\"t\"", "unknown block type 1008"});
  ExpectRefused(OneTensor({128}, 1004, 0, 128), StatusCode::kDataLoss,
                {"\"t\"", "unknown block type 1004"});
  ExpectRefused(OneTensor({48}, 8, 0, 64), StatusCode::kDataLoss,
                {"\"t\"", "48 elements", "Q8_0 blocks of 32"});
  {
    GgufWriter w;
    w.Tensor("a", GgmlType::kF32, {2}, RandomBytes(8, 1));
    w.Tensor("a", GgmlType::kF32, {2}, RandomBytes(8, 1));
    ExpectRefused(w.Bytes(), StatusCode::kDataLoss, {"\"a\" appears twice"});
  }
  {
    // Two tensors at offset 0.
    std::string s = "GGUF" + Le(3, 4) + Le(2, 8) + Le(0, 8);
    for (const char* name : {"a", "b"})
      s += Le(1, 8) + name + Le(1, 4) + Le(8, 8) + Le(0, 4) + Le(0, 8);
    s.resize((s.size() + 31) / 32 * 32, '\0');
    ExpectRefused(s + RandomBytes(32, 1), StatusCode::kDataLoss, {"\"a\" and \"b\" overlap"});
  }
  // A header that promises one more tensor than it lists.
  ExpectRefused(Sample().Bytes(/*tensor_count_delta=*/1), StatusCode::kDataLoss, {"tensor"});
}

TEST(GgufTest, KnowsBlockSizes) {
  GgmlBlock b;
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kQ4_K, &b));
  EXPECT_EQ(b.elements, 256);
  EXPECT_EQ(b.bytes, 144);
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kQ6_K, &b));
  EXPECT_EQ(b.bytes, 210);
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kQ1_0, &b));
  EXPECT_EQ(b.elements, 128);
  EXPECT_EQ(b.bytes, 18);
  EXPECT_FALSE(GgmlBlockOf(static_cast<GgmlType>(31), &b));
  EXPECT_EQ(GgmlTypeName(GgmlType::kIQ4_XS), "IQ4_XS");
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(31)), "type 31");
}

}  // namespace
}  // namespace gizllm
