// GGUF files (llama.cpp's single-file models): metadata and tensors memory-mapped in place.
//
// Layout (version 3; version 2 is the same): "GGUF", u32 version, u64 tensor count, u64 metadata
// count, then the metadata (key string, u32 value type, value), the tensor infos (name string,
// u32 dims, u64 dims innermost first, u32 block type, u64 offset), padding to general.alignment
// (32 by default), and the data, each tensor at its offset from the data's start. Strings are a
// u64 byte count and the bytes; everything is little-endian.
//
// Every count, length, offset and size is checked against the file's size before it is used, in
// arithmetic that cannot overflow: a truncated or hostile file gives an error naming the file and
// the field, never a read outside the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"

namespace gizllm {

// The type of a metadata value.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string GgufTypeName(GgufType type);  // "uint32", "array", ...; "type N" if unknown

// ggml's block types, numbered as in ggml.h.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
  kQ2_0 = 42,
  // gizllm's own block types (formats/ggml_blocks.h), written by `convert --bits b4` / `b8` into
  // converted folders and never read from a GGUF file: numbers far from ggml's.
  kGZ4 = 1004,
  kGZ8 = 1008,
  kGZ4S = 1014,
};

// Whether `type` is one of gizllm's own block types (kGZ4, kGZ8, kGZ4S), not ggml's.
inline bool IsOwnBlockType(GgmlType type) {
  return type == GgmlType::kGZ4 || type == GgmlType::kGZ8 || type == GgmlType::kGZ4S;
}

// A block type's elements and bytes per block; false for a number ggml does not define.
struct GgmlBlock {
  int64_t elements = 0;
  int64_t bytes = 0;
};
bool GgmlBlockOf(GgmlType type, GgmlBlock* block);
std::string GgmlTypeName(GgmlType type);  // "Q4_K", ...; "type N" if unknown
// The type GgmlTypeName calls `name`; false for a name it gives no type.
bool GgmlTypeFromName(std::string_view name, GgmlType* type);

// One metadata value. Scalars hold their value in the field of their kind (integers in
// `integer` or `unsigned_integer` by signedness, bool as 0/1 in `unsigned_integer`); arrays hold
// their element type and count, strings in `strings`, numbers as little-endian bytes in the file.
// Arrays of arrays are refused.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t unsigned_integer = 0;
  int64_t integer = 0;
  double real = 0.0;
  std::string string;
  GgufType element_type = GgufType::kUint8;  // arrays
  uint64_t count = 0;                        // arrays: elements
  const uint8_t* elements = nullptr;         // arrays of numbers: [count * element size]
  std::vector<std::string> strings;          // arrays of strings: [count]

  bool IsInteger() const;  // any integer type (bool not included)
  bool IsReal() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;     // outermost first, as safetensors and torch write it
  uint64_t offset = 0;            // from the data's start
  const uint8_t* data = nullptr;  // [bytes] into the memory-mapped file
  size_t bytes = 0;

  int64_t Elements() const;
};

// One memory-mapped GGUF file. Pointers into it (tensors, array elements) stay valid while the
// object lives, also after it is moved.
class GgufFile {
 public:
  static Expected<GgufFile> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const MappedFile& mapped() const { return file_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;  // null if absent

  // Typed reads; errors name the file and the key. GetUint takes any non-negative integer,
  // GetInt any integer in int64, GetFloat any number.
  Expected<std::string> GetString(std::string_view key) const;
  Expected<uint64_t> GetUint(std::string_view key) const;
  Expected<int64_t> GetInt(std::string_view key) const;
  Expected<double> GetFloat(std::string_view key) const;
  Expected<bool> GetBool(std::string_view key) const;
  Expected<std::vector<std::string>> GetStrings(std::string_view key) const;
  Expected<std::vector<int64_t>> GetInts(std::string_view key) const;   // an integer array
  Expected<std::vector<double>> GetFloats(std::string_view key) const;  // an array of numbers

  // Where the tensor data starts in the file (a tensor's bytes lie at data_offset() + offset).
  uint64_t data_offset() const { return data_offset_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // in file order
  const GgufTensor* FindTensor(std::string_view name) const;           // null if absent

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace gizllm
