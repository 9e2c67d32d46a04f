// A small GGUF writer for tests: metadata of every type and tensors of any block type, laid out
// as llama.cpp's gguf writer does (version 3, data at general.alignment, each tensor aligned).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"

namespace gizllm::testing {

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}

  void Uint32(std::string_view key, uint32_t v) { Scalar(key, GgufType::kUint32, v, 4); }
  void Int32(std::string_view key, int32_t v) {
    Scalar(key, GgufType::kInt32, static_cast<uint32_t>(v), 4);
  }
  void Uint64(std::string_view key, uint64_t v) { Scalar(key, GgufType::kUint64, v, 8); }
  void Float32(std::string_view key, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    Scalar(key, GgufType::kFloat32, bits, 4);
  }
  void Bool(std::string_view key, bool v) { Scalar(key, GgufType::kBool, v ? 1 : 0, 1); }
  void String(std::string_view key, std::string_view v) {
    Key(key, GgufType::kString);
    Str(&kv_, v);
  }
  void Strings(std::string_view key, const std::vector<std::string>& v) {
    Key(key, GgufType::kArray);
    Le(&kv_, static_cast<uint32_t>(GgufType::kString), 4);
    Le(&kv_, v.size(), 8);
    for (const std::string& s : v) Str(&kv_, s);
  }
  void Int32s(std::string_view key, const std::vector<int32_t>& v) {
    Key(key, GgufType::kArray);
    Le(&kv_, static_cast<uint32_t>(GgufType::kInt32), 4);
    Le(&kv_, v.size(), 8);
    for (int32_t x : v) Le(&kv_, static_cast<uint32_t>(x), 4);
  }
  void Bools(std::string_view key, const std::vector<bool>& v) {
    Key(key, GgufType::kArray);
    Le(&kv_, static_cast<uint32_t>(GgufType::kBool), 4);
    Le(&kv_, v.size(), 8);
    for (bool x : v) Le(&kv_, x ? 1 : 0, 1);
  }
  void Float32s(std::string_view key, const std::vector<float>& v) {
    Key(key, GgufType::kArray);
    Le(&kv_, static_cast<uint32_t>(GgufType::kFloat32), 4);
    Le(&kv_, v.size(), 8);
    for (float x : v) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      Le(&kv_, bits, 4);
    }
  }
  // Any bytes after the key: for values a reader must refuse.
  void Raw(std::string_view key, uint32_t type, std::string_view value_bytes) {
    Str(&kv_, key);
    Le(&kv_, type, 4);
    kv_ += value_bytes;
    ++kv_count_;
  }

  // `shape` outermost first; `data` must be the tensor's bytes in `type`.
  void Tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape,
              std::string_view data) {
    tensors_.push_back({std::string(name), type, std::move(shape), std::string(data)});
  }

  // The whole file. `tensor_count_delta` adds to the tensor count written (a lying header).
  std::string Bytes(int64_t tensor_count_delta = 0) const {
    std::string out = "GGUF";
    Le(&out, 3, 4);
    Le(&out, tensors_.size() + tensor_count_delta, 8);
    Le(&out, kv_count_, 8);
    out += kv_;
    std::vector<uint64_t> offsets;
    uint64_t offset = 0;
    for (const Entry& t : tensors_) {
      Str(&out, t.name);
      Le(&out, t.shape.size(), 4);
      for (size_t d = t.shape.size(); d-- > 0;) Le(&out, static_cast<uint64_t>(t.shape[d]), 8);
      Le(&out, static_cast<uint32_t>(t.type), 4);
      Le(&out, offset, 8);
      offsets.push_back(offset);
      offset = Align(offset + t.data.size());
    }
    out.resize(Align(out.size()), '\0');
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], '\0');
      out += tensors_[i].data;
    }
    return out;
  }

  bool Write(const std::string& path) const {
    const std::string bytes = Bytes();
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return static_cast<bool>(f);
  }

 private:
  struct Entry {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    std::string data;
  };

  static void Le(std::string* out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  static void Str(std::string* out, std::string_view s) {
    Le(out, s.size(), 8);
    *out += s;
  }
  void Key(std::string_view key, GgufType type) {
    Str(&kv_, key);
    Le(&kv_, static_cast<uint32_t>(type), 4);
    ++kv_count_;
  }
  void Scalar(std::string_view key, GgufType type, uint64_t v, int bytes) {
    Key(key, type);
    Le(&kv_, v, bytes);
  }
  uint64_t Align(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  uint64_t alignment_;
  std::string kv_;
  uint64_t kv_count_ = 0;
  std::vector<Entry> tensors_;
};

}  // namespace gizllm::testing
