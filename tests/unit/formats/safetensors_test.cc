#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/dtype.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("gizllm_formats_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header text and a data size: 8-byte length, header, data bytes.
std::string Raw(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
  const uint64_t len = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  s += header;
  std::mt19937 rng(7);
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(rng() & 0xff));
  return s;
}

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(dist(rng));
  return v;
}

TEST(SafetensorsTest, OpensTinyChat) {
  auto c = Checkpoint::Open("models/tiny-chat");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const TensorInfo* embed = c->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kBF16);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{8192, 384}));
  EXPECT_EQ(embed->bytes, size_t{8192} * 384 * 2);
  EXPECT_EQ(c->Find("lm_head.weight"), nullptr);  // tied
  EXPECT_EQ(c->metadata().at("format"), "pt");
  const TensorInfo* q_norm = c->Find("model.layers.7.self_attn.q_norm.weight");
  ASSERT_NE(q_norm, nullptr);
  EXPECT_EQ(q_norm->shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(c->All().size(), 90u);  // embed + final norm + 8 layers x 11
  // The README's count: 16.9 M parameters.
  EXPECT_NEAR(static_cast<double>(CountParameters(*c)), 16.9e6, 0.05e6);
}

TEST(SafetensorsTest, RoundTrip) {
  TempDir dir;
  auto a = RandomBf16(3 * 5, 1);  // 30 bytes: the next tensor needs padding
  std::vector<float> b(7);
  std::mt19937 rng(2);
  for (auto& x : b) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  std::vector<int64_t> c = {static_cast<int64_t>(rng()), -5, 1ll << 40};
  std::vector<TensorToWrite> tensors = {
      {"z.first", DType::kBF16, {3, 5}, a.data(), a.size() * 2},
      {"a.second", DType::kF32, {7}, b.data(), b.size() * 4},
      {"scalar.empty", DType::kI8, {0, 4}, nullptr, 0},
      {"m.third", DType::kI64, {3}, c.data(), c.size() * 8},
  };
  std::map<std::string, std::string> meta = {{"format", "gizllm"}, {"bits", "4"}};
  const std::string path = dir.File("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, meta).ok());
  EXPECT_FALSE(fs::exists(path + ".partial"));

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const TensorToWrite& w : tensors) {
    const TensorInfo* t = f->Find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    ASSERT_EQ(t->bytes, w.bytes);
    EXPECT_EQ(t->file, path);
    if (w.bytes) {
      EXPECT_EQ(std::memcmp(t->data, w.data, w.bytes), 0) << w.name;
    }
  }
  // The data start and every tensor start are 8-byte aligned in the file.
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok());
  for (const TensorInfo& t : f->tensors()) {
    if (t.bytes) {
      EXPECT_EQ((t.data - f->tensors()[0].data) % 8, 0) << t.name;
    }
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, mapped->data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);

  // A checkpoint opens a single file given by path.
  auto ck = Checkpoint::Open(path);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(CountParameters(*ck), 15 + 7 + 0 + 3);
  EXPECT_EQ(ck->All().front()->name, "z.first");  // file order, not name order
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  TempDir dir;
  std::vector<float> v(6, 1.5f);
  std::vector<TensorToWrite> wrong_size = {{"w", DType::kF32, {2, 4}, v.data(), 24}};
  Status s = WriteSafetensors(dir.File("a.safetensors"), wrong_size, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"w\""), std::string::npos) << s.message();
  std::vector<TensorToWrite> twice = {{"w", DType::kF32, {6}, v.data(), 24},
                                      {"w", DType::kF32, {6}, v.data(), 24}};
  EXPECT_FALSE(WriteSafetensors(dir.File("b.safetensors"), twice, {}).ok());
  EXPECT_FALSE(fs::exists(dir.File("a.safetensors")));
}

}  // namespace
}  // namespace gizllm
