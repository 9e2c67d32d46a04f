// bitgpu manifests (model/bitgpu_model.h says what a folder holds): manifest.json read with every
// field checked, the arch contract as config.json's fields, and the lookup tables; apart from the
// tensors' loading (bitgpu_model.cc), so that the config reader needs no more than this.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "model/arch.h"

namespace gizllm {

inline constexpr char kBitgpuManifest[] = "manifest.json";

// Whether `dir` is a bitgpu folder: a folder with manifest.json and without config.json.
bool IsBitgpuFolder(const std::string& dir);

// bitgpu's lookup tables, from their defining property: tgt2 [256, 2] turns a byte's 8 sign bits
// (LSB first) into 2-bit codes, 1 for -1 and 3 for +1, four a byte from the low bits up; tgt4
// [256, 4] into 4-bit codes 7 and 9, two a byte.
std::array<uint8_t, 512> BitgpuTgt2();
std::array<uint8_t, 1024> BitgpuTgt4();

// The config.json fields of the manifest's arch contract (qwen3: act silu, head_dim <= 128, plain
// rope from arch.rope; a planar lm_head unties the head), and the Arch they give.
Expected<nlohmann::json> ReadBitgpuConfig(const std::string& dir);
Expected<Arch> ReadBitgpuArch(const std::string& dir);

// One blob of a file: a ref checked against its file.
struct BitgpuRef {
  std::string field;  // where the manifest gives it, for messages
  bool aux = false;
  uint64_t off = 0, len = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;

  bool SameBytes(const BitgpuRef& o) const { return aux == o.aux && off == o.off && len == o.len; }
};

// manifest.json, read whole (at most 64 MiB, nesting bounded); every read checks its field and
// an error names the file and the field ("tensors.embed_tokens.weight.off").
class BitgpuManifest {
 public:
  static Expected<BitgpuManifest> Read(const std::string& dir);
  // The same from manifest.json's text; `path` stands for the file in messages.
  static Expected<BitgpuManifest> Parse(std::string_view text, const std::string& path);

  const std::string& path() const { return path_; }
  const nlohmann::json& root() const { return root_; }
  int64_t version() const { return version_; }  // 1 or 2

  Status Error(const std::string& field, const std::string& what) const;
  // obj[key] of `type` (number_float: any number); `at` names obj ("" at the top).
  Expected<const nlohmann::json*> Member(const nlohmann::json& obj, const std::string& at,
                                         const std::string& key,
                                         nlohmann::json::value_t type) const;
  Expected<int64_t> Int(const nlohmann::json& obj, const std::string& at, const std::string& key,
                        int64_t lo, int64_t hi) const;  // in [lo, hi]
  Expected<std::string> String(const nlohmann::json& obj, const std::string& at,
                               const std::string& key) const;

 private:
  std::string path_;
  nlohmann::json root_;
  int64_t version_ = 0;
};

// A ref {dtype (FLOAT or UINT8), shape, src, off, len} at `key` of `obj` (`at` names obj): its
// bytes lie inside its file (`data` or `aux`) and are the bytes of its dtype and shape.
Expected<BitgpuRef> ReadBitgpuRef(const BitgpuManifest& m, const nlohmann::json& obj,
                                  const std::string& at, const std::string& key,
                                  const MappedFile& data, const MappedFile& aux);

// The config.json fields of `m`'s arch.
Expected<nlohmann::json> BitgpuConfigOf(const BitgpuManifest& m);

}  // namespace gizllm
