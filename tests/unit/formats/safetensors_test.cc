#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// The streaming writer gives the same tensors and metadata as WriteSafetensors: in the room it
// kept for the header (padded with spaces), or, when the header outgrows it, the very bytes
// WriteSafetensors writes. Its tensors' pages can be released from a checkpoint and read again.
TEST(SafetensorsTest, StreamingWriterEqualsTheWholeWriter) {
  TempDir dir;
  auto a = RandomBf16(3 * 5, 1);
  std::vector<float> b(7, 0.25f);
  std::vector<TensorToWrite> tensors = {
      {"z.first", DType::kBF16, {3, 5}, a.data(), a.size() * 2},
      {"a.second", DType::kF32, {7}, b.data(), b.size() * 4},
      {"scalar.empty", DType::kI8, {0, 4}, nullptr, 0},
  };
  std::map<std::string, std::string> meta = {{"format", "gizllm"}, {"bits", "4"}};
  const std::string whole = dir.File("whole.safetensors");
  ASSERT_TRUE(WriteSafetensors(whole, tensors, meta).ok());
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (size_t reserve : {size_t{4096}, size_t{16}}) {
    const std::string path = dir.File("s" + std::to_string(reserve) + ".safetensors");
    {
      auto w = SafetensorsWriter::Open(path, reserve);
      ASSERT_TRUE(w.ok()) << w.status().message();
      for (const TensorToWrite& t : tensors) ASSERT_TRUE(w->Add(t).ok()) << t.name;
      EXPECT_EQ(w->Add(tensors[0]).code(), StatusCode::kInvalidArgument);  // written twice
      EXPECT_EQ(w->count(), 3);
      ASSERT_TRUE(w->Finish(meta).ok());
    }
    EXPECT_FALSE(fs::exists(path + ".partial"));
    if (reserve == 16) {
      EXPECT_EQ(read(path), read(whole));  // the header outgrew its room
    } else {
      // The same data after a header of 4,096 bytes.
      uint64_t header = 0;
      std::memcpy(&header, read(whole).data(), 8);
      EXPECT_EQ(fs::file_size(path), fs::file_size(whole) - header + 4096);
      EXPECT_EQ(read(path).substr(8 + 4096), read(whole).substr(8 + header));
    }
    auto ck = Checkpoint::Open(path);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    EXPECT_EQ(ck->metadata(), meta);
    for (const TensorToWrite& t : tensors) {
      const TensorInfo* got = ck->Find(t.name);
      ASSERT_NE(got, nullptr) << t.name;
      EXPECT_EQ(got->shape, t.shape);
      ck->Release(*got);  // dropped from memory, read from the file again
      if (t.bytes) {
        EXPECT_EQ(std::memcmp(got->data, t.data, t.bytes), 0) << t.name;
      }
    }
  }
  // A writer dropped before Finish leaves nothing.
  {
    auto w = SafetensorsWriter::Open(dir.File("dropped.safetensors"), 64);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Add(tensors[0]).ok());
  }
  EXPECT_FALSE(fs::exists(dir.File("dropped.safetensors.partial")));
  EXPECT_FALSE(fs::exists(dir.File("dropped.safetensors")));
}

// Expects an error of `code` whose one-line message names each of `parts`.
template <typename T>
void ExpectError(const Expected<T>& e, StatusCode code, std::vector<std::string> parts) {
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), code) << e.status().message();
  for (const std::string& p : parts) {
    EXPECT_NE(e.status().message().find(p), std::string::npos)
        << "\"" << e.status().message() << "\" does not name " << p;
  }
  EXPECT_EQ(e.status().message().find('\n'), std::string::npos) << e.status().message();
}

TEST(SafetensorsTest, RejectsBadFiles) {
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  ExpectError(SafetensorsFile::Open(path), StatusCode::kNotFound, {path});

  WriteBytes(path, std::string("\x05\x00\x00", 3));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "3 bytes", "shorter"});

  const std::string ok_header =
      R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":"v"}})";
  WriteBytes(path, Raw(ok_header, 24));
  ASSERT_TRUE(SafetensorsFile::Open(path).ok());

  // The header length says more than the file holds.
  WriteBytes(path, Raw(ok_header, 24, /*claimed_len=*/ok_header.size() + 25));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "header length"});
  WriteBytes(path, Raw(ok_header, 24, /*claimed_len=*/UINT64_MAX - 1));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "header length"});

  // Truncated data: the last tensor runs past the end.
  WriteBytes(path, Raw(ok_header, 23));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss,
              {path, "\"a\"", "outside the data"});

  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24])", 24));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "not JSON"});
  WriteBytes(path, Raw(R"([1,2])", 0));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "object"});

  // Offsets that disagree with dtype x shape.
  WriteBytes(path, Raw(R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", 24));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss,
              {path, "\"a\"", "24 bytes", "BF16 [2, 3] needs 12"});
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", 24));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "\"a\"", "shape"});
  WriteBytes(path, Raw(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],)"
                       R"("data_offsets":[0,0]}})",
                       0));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "\"a\"", "needs"});
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "data_offsets"});
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "data_offsets"});
  WriteBytes(path, Raw(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 8));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "dtype"});

  // Overlapping tensors.
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]}})",
                       20));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss,
              {path, "\"a\"", "\"b\"", "overlap"});

  // Unknown and unsupported dtypes, named.
  WriteBytes(path, Raw(R"({"a":{"dtype":"Q9_K","shape":[4],"data_offsets":[0,16]}})", 16));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "\"a\"", "Q9_K"});
  WriteBytes(path, Raw(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kUnimplemented, {path, "\"a\"", "F64"});

  WriteBytes(path, Raw(R"({"__metadata__":{"n":3}})", 0));
  ExpectError(SafetensorsFile::Open(path), StatusCode::kDataLoss, {path, "__metadata__"});
}

// Files as others write them: gaps and padding between tensors, spaces after the header,
// empty tensors, an empty file of tensors.
TEST(SafetensorsTest, RejectsHostileHeaders) {
  TempDir dir;
  const std::string path = dir.File("deep.safetensors");
  // A shape or offsets nested a million deep: the error shows their start (dump() of the whole
  // value recursed a million times and overflowed the stack).
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", 0));
  Expected<SafetensorsFile> f = SafetensorsFile::Open(path);
  ExpectError(f, StatusCode::kDataLoss, {path, "\"a\"", "shape", "[[[[[[[[[...]]]]]]]]]"});
  EXPECT_LT(f.status().message().size(), 400u);
  WriteBytes(path, Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + deep + "}}", 0));
  f = SafetensorsFile::Open(path);
  ExpectError(f, StatusCode::kDataLoss, {path, "\"a\"", "data_offsets", "[[[[[[[[[...]]]]]]]]]"});
  EXPECT_LT(f.status().message().size(), 400u);
}

TEST(SafetensorsTest, AcceptsValidVariants) {
  TempDir dir;
  const std::string path = dir.File("ok.safetensors");
  WriteBytes(path, Raw(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
                       R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                       R"("a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}   )",
                       16));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors()[0].name, "a");  // file order
  EXPECT_EQ(f->Find("b")->data - f->Find("a")->data, 8);
  EXPECT_EQ(f->Find("e")->bytes, 0u);
  EXPECT_EQ(f->Find("e")->Elements(), 0);
  EXPECT_EQ(f->Find("missing"), nullptr);
  EXPECT_TRUE(f->metadata().empty());

  WriteBytes(path, Raw("{}", 0));
  f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
}

// Writes shards a (tensors x0, x1) and b (tensor y) and the index that lists them.
void WriteShards(const TempDir& dir, const std::string& index) {
  auto x0 = RandomBf16(6, 3), x1 = RandomBf16(4, 4), y = RandomBf16(8, 5);
  std::vector<TensorToWrite> a = {{"x0", DType::kBF16, {2, 3}, x0.data(), 12},
                                  {"x1", DType::kBF16, {4}, x1.data(), 8}};
  std::vector<TensorToWrite> b = {{"y", DType::kBF16, {2, 4}, y.data(), 16}};
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), a, {{"format", "pt"}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), b, {}).ok());
  std::ofstream(dir.File("model.safetensors.index.json")) << index;
}

constexpr const char* kIndex = R"({"metadata": {"total_size": 36}, "weight_map": {
  "x0": "model-00001-of-00002.safetensors", "x1": "model-00001-of-00002.safetensors",
  "y": "model-00002-of-00002.safetensors"}})";

TEST(SafetensorsTest, Shards) {
  TempDir dir;
  WriteShards(dir, kIndex);
  auto opened = Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  // Pointers stay valid when the checkpoint moves.
  Checkpoint c = std::move(opened).value();
  const TensorInfo* y = c.Find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->file, dir.File("model-00002-of-00002.safetensors"));
  EXPECT_EQ(y->shape, (std::vector<int64_t>{2, 4}));
  const std::vector<uint16_t> want = RandomBf16(8, 5);
  EXPECT_EQ(std::memcmp(y->data, want.data(), 16), 0);
  Checkpoint moved = std::move(c);
  EXPECT_EQ(moved.Find("y"), y);
  EXPECT_EQ(std::memcmp(y->data, want.data(), 16), 0);
  std::vector<std::string> names;
  for (const TensorInfo* t : moved.All()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"x0", "x1", "y"}));
  EXPECT_EQ(moved.metadata().at("format"), "pt");
  EXPECT_EQ(CountParameters(moved), 18);
  EXPECT_EQ(moved.files().size(), 2u);
}

TEST(SafetensorsTest, RejectsBadShards) {
  {
    TempDir dir;
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kNotFound,
                {dir.path().string(), "model.safetensors"});
  }
  {
    TempDir dir;  // a shard listed in the index is missing
    WriteShards(dir, kIndex);
    fs::remove(dir.File("model-00002-of-00002.safetensors"));
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kNotFound,
                {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"});
  }
  {
    TempDir dir;  // a tensor listed in the index is not in its shard
    WriteShards(dir, R"({"weight_map": {"x0": "model-00001-of-00002.safetensors",
                         "z": "model-00002-of-00002.safetensors"}})");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model.safetensors.index.json", "\"z\"", "model-00002-of-00002.safetensors"});
  }
  {
    TempDir dir;  // listed in the wrong shard
    WriteShards(dir, R"({"weight_map": {"y": "model-00001-of-00002.safetensors",
                         "x0": "model-00002-of-00002.safetensors"}})");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model.safetensors.index.json", "\"x0\"", "model-00001-of-00002.safetensors"});
  }
  {
    TempDir dir;
    WriteShards(dir, R"({"weight_map": {"x0": "../model-00001-of-00002.safetensors"}})");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model.safetensors.index.json", "weight_map"});
    WriteShards(dir, R"({"metadata": {}})");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model.safetensors.index.json", "weight_map"});
    WriteShards(dir, R"({"weight_map": )");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model.safetensors.index.json", "JSON"});
  }
  {
    TempDir dir;  // one tensor in two shards
    std::vector<uint16_t> v = RandomBf16(2, 9);
    std::vector<TensorToWrite> t = {{"w", DType::kBF16, {2}, v.data(), 4}};
    ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), t, {}).ok());
    ASSERT_TRUE(WriteSafetensors(dir.File("s2.safetensors"), t, {}).ok());
    std::ofstream(dir.File("model.safetensors.index.json"))
        << R"({"weight_map": {"w": "s1.safetensors", "v": "s2.safetensors"}})";
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"\"w\"", "s1.safetensors", "s2.safetensors"});
  }
  {
    TempDir dir;  // a bad shard names itself
    WriteShards(dir, kIndex);
    WriteBytes(dir.File("model-00002-of-00002.safetensors"), "1234");
    ExpectError(Checkpoint::Open(dir.path().string()), StatusCode::kDataLoss,
                {"model-00002-of-00002.safetensors", "shorter"});
  }
}

}  // namespace
}  // namespace gizllm
