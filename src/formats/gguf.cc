#include "formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/dtype.h"

namespace gizllm {
namespace {

constexpr uint64_t kMaxDims = 4;  // ggml's GGML_MAX_DIMS
// The most entries reserved ahead from a count the file claims (more grow as they are read).
constexpr uint64_t kMaxReserve = uint64_t{1} << 16;

std::string Quote(std::string_view s) {
  // Keys and names come from the file: show at most 200 bytes of one.
  if (s.size() > 200) return "\"" + std::string(s.substr(0, 200)) + "...\"";
  return "\"" + std::string(s) + "\"";
}

// Bytes of one element of a metadata array of numbers; 0 for strings, arrays and unknown types.
uint64_t ScalarBytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

uint64_t LoadLe(const uint8_t* p, uint64_t bytes) {
  uint64_t v = 0;
  for (uint64_t i = bytes; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// Sets the scalar fields of `v` (of numeric type v->type) from its little-endian bytes at `p`.
void DecodeScalar(const uint8_t* p, GgufValue* v) {
  const uint64_t n = ScalarBytes(v->type);
  const uint64_t raw = LoadLe(p, n);
  switch (v->type) {
    case GgufType::kInt8:
      v->integer = static_cast<int8_t>(raw);
      break;
    case GgufType::kInt16:
      v->integer = static_cast<int16_t>(raw);
      break;
    case GgufType::kInt32:
      v->integer = static_cast<int32_t>(raw);
      break;
    case GgufType::kInt64:
      v->integer = static_cast<int64_t>(raw);
      break;
    case GgufType::kFloat32: {
      float f;
      const uint32_t bits = static_cast<uint32_t>(raw);
      std::memcpy(&f, &bits, 4);
      v->real = f;
      break;
    }
    case GgufType::kFloat64:
      std::memcpy(&v->real, &raw, 8);
      break;
    case GgufType::kBool:
      v->unsigned_integer = raw != 0;
      break;
    default:  // unsigned
      v->unsigned_integer = raw;
      break;
  }
}

bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
bool IsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

// Reads the file front to back; every read checks the bytes left first.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t at() const { return at_; }
  uint64_t left() const { return size_ - at_; }
  const uint8_t* here() const { return data_ + at_; }

  Status Truncated(const std::string& field, uint64_t need) const {
    return DataLoss(path_ + ": " + field + " needs " + std::to_string(need) + " bytes at offset " +
                    std::to_string(at_) + ", but the file (" + std::to_string(size_) +
                    " bytes) ends first");
  }

  Status Skip(uint64_t bytes, const std::string& field) {
    if (bytes > left()) return Truncated(field, bytes);
    at_ += bytes;
    return Status::Ok();
  }
  Status U32(uint32_t* v, const std::string& field) {
    if (left() < 4) return Truncated(field, 4);
    *v = static_cast<uint32_t>(LoadLe(here(), 4));
    at_ += 4;
    return Status::Ok();
  }
  Status U64(uint64_t* v, const std::string& field) {
    if (left() < 8) return Truncated(field, 8);
    *v = LoadLe(here(), 8);
    at_ += 8;
    return Status::Ok();
  }
  Status String(std::string* s, const std::string& field) {
    uint64_t n = 0;
    GZ_RETURN_IF_ERROR(U64(&n, field + " (its length)"));
    if (n > left()) {
      return DataLoss(path_ + ": " + field + " is " + std::to_string(n) + " bytes long at offset " +
                      std::to_string(at_) + ", past the end of the file (" + std::to_string(size_) +
                      " bytes)");
    }
    s->assign(reinterpret_cast<const char*>(here()), static_cast<size_t>(n));
    at_ += n;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  const std::string& path_;
};

Status ReadValue(Reader& r, const std::string& path, const std::string& field, GgufValue* v) {
  const uint64_t scalar = ScalarBytes(v->type);
  if (scalar > 0) {
    if (r.left() < scalar) return r.Truncated(field, scalar);
    DecodeScalar(r.here(), v);
    return r.Skip(scalar, field);
  }
  if (v->type == GgufType::kString) return r.String(&v->string, field);
  if (v->type != GgufType::kArray) {
    return DataLoss(path + ": " + field + " has unknown value type " +
                    std::to_string(static_cast<uint32_t>(v->type)));
  }
  uint32_t element_type = 0;
  GZ_RETURN_IF_ERROR(r.U32(&element_type, field + " (its element type)"));
  v->element_type = static_cast<GgufType>(element_type);
  GZ_RETURN_IF_ERROR(r.U64(&v->count, field + " (its element count)"));
  if (v->element_type == GgufType::kArray) {
    return Unimplemented(path + ": " + field + " is an array of arrays, which no model needs");
  }
  const uint64_t element_bytes = ScalarBytes(v->element_type);
  if (element_bytes > 0) {
    if (v->count > r.left() / element_bytes) {
      return DataLoss(path + ": " + field + " claims " + std::to_string(v->count) + " " +
                      GgufTypeName(v->element_type) + " elements, more than the " +
                      std::to_string(r.left()) + " bytes left in the file hold");
    }
    v->elements = r.here();
    return r.Skip(v->count * element_bytes, field);
  }
  if (v->element_type != GgufType::kString) {
    return DataLoss(path + ": " + field + " has unknown element type " +
                    std::to_string(element_type));
  }
  // Each string takes at least its 8-byte length: a count beyond that is a lie, refused before
  // anything is allocated for it.
  if (v->count > r.left() / 8) {
    return DataLoss(path + ": " + field + " claims " + std::to_string(v->count) +
                    " strings, more than the " + std::to_string(r.left()) +
                    " bytes left in the file hold");
  }
  // Grown as strings are read, so that memory follows the bytes really there, not the count.
  v->strings.reserve(static_cast<size_t>(std::min<uint64_t>(v->count, kMaxReserve)));
  for (uint64_t i = 0; i < v->count; ++i) {
    GZ_RETURN_IF_ERROR(r.String(&v->strings.emplace_back(), field + "[" + std::to_string(i) + "]"));
  }
  return Status::Ok();
}

}  // namespace

std::string GgufTypeName(GgufType type) {
  static constexpr const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(type);
  if (i < std::size(kNames)) return kNames[i];
  return "type " + std::to_string(i);
}

bool GgmlBlockOf(GgmlType type, GgmlBlock* block) {
  constexpr int64_t K = 256;  // QK_K
  switch (type) {
    case GgmlType::kF32:
      *block = {1, 4};
      return true;
    case GgmlType::kF16:
      *block = {1, 2};
      return true;
    case GgmlType::kQ4_0:
      *block = {32, 2 + 16};
      return true;
    case GgmlType::kQ4_1:
      *block = {32, 2 + 2 + 16};
      return true;
    case GgmlType::kQ5_0:
      *block = {32, 2 + 4 + 16};
      return true;
    case GgmlType::kQ5_1:
      *block = {32, 2 + 2 + 4 + 16};
      return true;
    case GgmlType::kQ8_0:
      *block = {32, 2 + 32};
      return true;
    case GgmlType::kQ8_1:
      *block = {32, 2 + 2 + 32};
      return true;
    case GgmlType::kQ2_K:
      *block = {K, 2 + 2 + K / 16 + K / 4};
      return true;
    case GgmlType::kQ3_K:
      *block = {K, 2 + K / 4 + K / 8 + 12};
      return true;
    case GgmlType::kQ4_K:
      *block = {K, 2 + 2 + K / 2 + 12};
      return true;
    case GgmlType::kQ5_K:
      *block = {K, 2 + 2 + K / 2 + K / 8 + 12};
      return true;
    case GgmlType::kQ6_K:
      *block = {K, 2 + K / 2 + K / 4 + K / 16};
      return true;
    case GgmlType::kQ8_K:
      *block = {K, 4 + K + K / 8};
      return true;
    case GgmlType::kIQ2_XXS:
      *block = {K, 2 + K / 4};
      return true;
    case GgmlType::kIQ2_XS:
      *block = {K, 2 + K / 4 + K / 32};
      return true;
    case GgmlType::kIQ3_XXS:
      *block = {K, 2 + K / 4 + K / 8};
      return true;
    case GgmlType::kIQ1_S:
      *block = {K, 2 + K / 8 + K / 16};
      return true;
    case GgmlType::kIQ4_NL:
      *block = {32, 2 + 16};
      return true;
    case GgmlType::kIQ3_S:
      *block = {K, 2 + K / 4 + K / 8 + K / 32 + 4};
      return true;
    case GgmlType::kIQ2_S:
      *block = {K, 2 + K / 4 + K / 16};
      return true;
    case GgmlType::kIQ4_XS:
      *block = {K, 2 + 2 + K / 2 + K / 64};
      return true;
    case GgmlType::kI8:
      *block = {1, 1};
      return true;
    case GgmlType::kI16:
      *block = {1, 2};
      return true;
    case GgmlType::kI32:
      *block = {1, 4};
      return true;
    case GgmlType::kI64:
      *block = {1, 8};
      return true;
    case GgmlType::kF64:
      *block = {1, 8};
      return true;
    case GgmlType::kIQ1_M:
      *block = {K, K / 8 + K / 16 + K / 32};
      return true;
    case GgmlType::kBF16:
      *block = {1, 2};
      return true;
    case GgmlType::kTQ1_0:
      *block = {K, 2 + 4 * 13};
      return true;
    case GgmlType::kTQ2_0:
      *block = {K, 2 + 64};
      return true;
    case GgmlType::kMXFP4:
      *block = {32, 1 + 16};
      return true;
    case GgmlType::kNVFP4:
      *block = {64, 4 + 32};
      return true;
    case GgmlType::kQ1_0:
      *block = {128, 2 + 16};
      return true;
    case GgmlType::kQ2_0:
      *block = {64, 2 + 16};
      return true;
    case GgmlType::kGZ4:
      *block = {128, 2 + 4 + 64};
      return true;
    case GgmlType::kGZ8:
      *block = {128, 2 + 4 + 128};
      return true;
    case GgmlType::kGZ4S:
      *block = {32, 2 + 16};
      return true;
  }
  return false;
}

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ8_1:
      return "Q8_1";
    case GgmlType::kQ2_K:
      return "Q2_K";
    case GgmlType::kQ3_K:
      return "Q3_K";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kQ8_K:
      return "Q8_K";
    case GgmlType::kIQ2_XXS:
      return "IQ2_XXS";
    case GgmlType::kIQ2_XS:
      return "IQ2_XS";
    case GgmlType::kIQ3_XXS:
      return "IQ3_XXS";
    case GgmlType::kIQ1_S:
      return "IQ1_S";
    case GgmlType::kIQ4_NL:
      return "IQ4_NL";
    case GgmlType::kIQ3_S:
      return "IQ3_S";
    case GgmlType::kIQ2_S:
      return "IQ2_S";
    case GgmlType::kIQ4_XS:
      return "IQ4_XS";
    case GgmlType::kI8:
      return "I8";
    case GgmlType::kI16:
      return "I16";
    case GgmlType::kI32:
      return "I32";
    case GgmlType::kI64:
      return "I64";
    case GgmlType::kF64:
      return "F64";
    case GgmlType::kIQ1_M:
      return "IQ1_M";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kTQ1_0:
      return "TQ1_0";
    case GgmlType::kTQ2_0:
      return "TQ2_0";
    case GgmlType::kMXFP4:
      return "MXFP4";
    case GgmlType::kNVFP4:
      return "NVFP4";
    case GgmlType::kQ1_0:
      return "Q1_0";
    case GgmlType::kQ2_0:
      return "Q2_0";
    case GgmlType::kGZ4:
      return "GZ4";
    case GgmlType::kGZ8:
      return "GZ8";
    case GgmlType::kGZ4S:
      return "GZ4S";
  }
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

bool GgmlTypeFromName(std::string_view name, GgmlType* type) {
  for (const GgmlType own : {GgmlType::kGZ4, GgmlType::kGZ8, GgmlType::kGZ4S}) {
    if (GgmlTypeName(own) == name) {
      *type = own;
      return true;
    }
  }
  for (uint32_t n = 0; n < 64; ++n) {
    GgmlBlock block;
    if (GgmlBlockOf(static_cast<GgmlType>(n), &block) &&
        GgmlTypeName(static_cast<GgmlType>(n)) == name) {
      *type = static_cast<GgmlType>(n);
      return true;
    }
  }
  return false;
}

bool GgufValue::IsInteger() const { return IsSigned(type) || IsUnsigned(type); }

int64_t GgufTensor::Elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Expected<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile f;
  GZ_ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  Reader r(f.file_.data(), f.file_.size(), path);
  if (f.file_.size() < 4 || std::memcmp(f.file_.data(), "GGUF", 4) != 0) {
    return DataLoss(path + ": not a GGUF file (it does not start with \"GGUF\")");
  }
  GZ_RETURN_IF_ERROR(r.Skip(4, "the magic"));
  GZ_RETURN_IF_ERROR(r.U32(&f.version_, "the version"));
  if (f.version_ != 2 && f.version_ != 3) {
    return Unimplemented(path + ": GGUF version " + std::to_string(f.version_) +
                         " (versions 2 and 3 are read; a big-endian file reads as a huge one)");
  }
  uint64_t tensor_count = 0, metadata_count = 0;
  GZ_RETURN_IF_ERROR(r.U64(&tensor_count, "the tensor count"));
  GZ_RETURN_IF_ERROR(r.U64(&metadata_count, "the metadata count"));
  // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor info at least
  // 8 + 4 + 4 + 8: larger counts are refused before anything is allocated for them.
  if (metadata_count > r.left() / 13) {
    return DataLoss(path + ": the metadata count " + std::to_string(metadata_count) +
                    " is more than the file's " + std::to_string(f.file_.size()) + " bytes hold");
  }
  if (tensor_count > r.left() / 24) {
    return DataLoss(path + ": the tensor count " + std::to_string(tensor_count) +
                    " is more than the file's " + std::to_string(f.file_.size()) + " bytes hold");
  }

  f.metadata_.reserve(static_cast<size_t>(std::min(metadata_count, kMaxReserve)));
  for (uint64_t i = 0; i < metadata_count; ++i) {
    const std::string nth = "metadata entry " + std::to_string(i);
    std::string key;
    GZ_RETURN_IF_ERROR(r.String(&key, nth + "'s key"));
    uint32_t type = 0;
    GZ_RETURN_IF_ERROR(r.U32(&type, "metadata " + Quote(key) + "'s type"));
    GgufValue v;
    v.type = static_cast<GgufType>(type);
    GZ_RETURN_IF_ERROR(ReadValue(r, path, "metadata " + Quote(key), &v));
    if (!f.metadata_index_.emplace(key, f.metadata_.size()).second) {
      return DataLoss(path + ": metadata key " + Quote(key) + " appears twice");
    }
    f.metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f.Find("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->unsigned_integer == 0 ||
        (a->unsigned_integer & (a->unsigned_integer - 1)) != 0) {
      return DataLoss(path +
                      ": metadata \"general.alignment\" must be a uint32 power of two, got " +
                      GgufTypeName(a->type) + " " + std::to_string(a->unsigned_integer));
    }
    f.alignment_ = a->unsigned_integer;
  }

  std::vector<uint64_t> dims_innermost_first;
  f.tensors_.reserve(static_cast<size_t>(std::min(tensor_count, kMaxReserve)));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    GZ_RETURN_IF_ERROR(r.String(&t.name, "tensor info " + std::to_string(i) + "'s name"));
    const std::string where = "tensor " + Quote(t.name);
    uint32_t dims = 0;
    GZ_RETURN_IF_ERROR(r.U32(&dims, where + "'s dimension count"));
    if (dims > kMaxDims) {
      return DataLoss(path + ": " + where + " has " + std::to_string(dims) +
                      " dimensions, more than ggml's " + std::to_string(kMaxDims));
    }
    dims_innermost_first.assign(dims, 0);
    int64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t n = 0;
      GZ_RETURN_IF_ERROR(r.U64(&n, where + "'s dimension " + std::to_string(d)));
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (n != 0 && static_cast<uint64_t>(elements) >
                         static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n)) {
        return DataLoss(path + ": " + where + "'s dimensions overflow int64");
      }
      elements *= static_cast<int64_t>(n);
      dims_innermost_first[d] = n;
    }
    uint32_t type = 0;
    GZ_RETURN_IF_ERROR(r.U32(&type, where + "'s block type"));
    t.type = static_cast<GgmlType>(type);
    GgmlBlock block;
    if (!GgmlBlockOf(t.type, &block) || IsOwnBlockType(t.type)) {
      return DataLoss(path + ": " + where + " has unknown block type " + std::to_string(type));
    }
    GZ_RETURN_IF_ERROR(r.U64(&t.offset, where + "'s offset"));
    if (dims > 0 && dims_innermost_first[0] % block.elements != 0) {
      return DataLoss(path + ": " + where + "'s rows of " +
                      std::to_string(dims_innermost_first[0]) + " elements are not whole " +
                      GgmlTypeName(t.type) + " blocks of " + std::to_string(block.elements));
    }
    // elements / block.elements blocks; rows are whole blocks, so the division is exact.
    const uint64_t blocks = static_cast<uint64_t>(elements) / block.elements;
    if (blocks > std::numeric_limits<uint64_t>::max() / block.bytes) {
      return DataLoss(path + ": " + where + "'s size overflows");
    }
    t.bytes = blocks * block.bytes;
    t.shape.assign(dims_innermost_first.rbegin(), dims_innermost_first.rend());
    if (t.offset % f.alignment_ != 0) {
      return DataLoss(path + ": " + where + "'s offset " + std::to_string(t.offset) +
                      " is not a multiple of the alignment " + std::to_string(f.alignment_));
    }
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second) {
      return DataLoss(path + ": tensor " + Quote(t.name) + " appears twice");
    }
    f.tensors_.push_back(std::move(t));
  }

  // The data starts at the next multiple of the alignment (not past the end of the file).
  const uint64_t pad = (f.alignment_ - r.at() % f.alignment_) % f.alignment_;
  const uint64_t data_start = pad <= r.left() ? r.at() + pad : f.file_.size();
  const uint64_t data_size = f.file_.size() - data_start;
  f.data_offset_ = data_start;
  for (GgufTensor& t : f.tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      return DataLoss(path + ": tensor " + Quote(t.name) + " (" + GgmlTypeName(t.type) + ", " +
                      std::to_string(t.bytes) + " bytes at offset " + std::to_string(t.offset) +
                      ") lies outside the data (" + std::to_string(data_size) + " bytes)");
    }
    t.data = f.file_.data() + data_start + t.offset;
  }
  // Tensors must not share bytes (empty ones share nothing).
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const GgufTensor& t : f.tensors_) {
    if (t.bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes) {
      return DataLoss(path + ": tensors " + Quote(by_offset[i - 1]->name) + " and " +
                      Quote(by_offset[i]->name) + " overlap");
    }
  }
  return f;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status Missing(const std::string& path, std::string_view key) {
  return NotFound(path + ": metadata " + Quote(key) + " is missing");
}
Status Wrong(const std::string& path, std::string_view key, const GgufValue& v,
             const std::string& expected) {
  std::string got = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) got += " of " + GgufTypeName(v.element_type);
  return InvalidArgument(path + ": metadata " + Quote(key) + " is " + got + ", expected " +
                         expected);
}

}  // namespace

Expected<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kString) return Wrong(path(), key, *v, "a string");
  return v->string;
}

Expected<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (IsUnsigned(v->type)) return v->unsigned_integer;
  if (IsSigned(v->type) && v->integer >= 0) return static_cast<uint64_t>(v->integer);
  return Wrong(path(), key, *v, "a non-negative integer");
}

Expected<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (IsSigned(v->type)) return v->integer;
  if (IsUnsigned(v->type) &&
      v->unsigned_integer <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return static_cast<int64_t>(v->unsigned_integer);
  return Wrong(path(), key, *v, "an integer");
}

Expected<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->IsReal()) return v->real;
  if (IsSigned(v->type)) return static_cast<double>(v->integer);
  if (IsUnsigned(v->type)) return static_cast<double>(v->unsigned_integer);
  return Wrong(path(), key, *v, "a number");
}

Expected<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kBool) return Wrong(path(), key, *v, "a bool");
  return v->unsigned_integer != 0;
}

Expected<std::vector<std::string>> GgufFile::GetStrings(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString)
    return Wrong(path(), key, *v, "an array of strings");
  return v->strings;
}

Expected<std::vector<int64_t>> GgufFile::GetInts(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kArray || !(IsSigned(v->element_type) || IsUnsigned(v->element_type)))
    return Wrong(path(), key, *v, "an array of integers");
  const uint64_t bytes = ScalarBytes(v->element_type);
  std::vector<int64_t> out(static_cast<size_t>(v->count));
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    e.type = v->element_type;
    DecodeScalar(v->elements + i * bytes, &e);
    if (IsSigned(e.type)) {
      out[i] = e.integer;
    } else if (e.unsigned_integer > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument(path() + ": metadata " + Quote(key) + "[" + std::to_string(i) +
                             "] does not fit int64");
    } else {
      out[i] = static_cast<int64_t>(e.unsigned_integer);
    }
  }
  return out;
}

Expected<std::vector<double>> GgufFile::GetFloats(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kArray || v->element_type == GgufType::kString ||
      v->element_type == GgufType::kArray || v->element_type == GgufType::kBool)
    return Wrong(path(), key, *v, "an array of numbers");
  const uint64_t bytes = ScalarBytes(v->element_type);
  std::vector<double> out(static_cast<size_t>(v->count));
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    e.type = v->element_type;
    DecodeScalar(v->elements + i * bytes, &e);
    out[i] = e.IsReal()         ? e.real
             : IsSigned(e.type) ? static_cast<double>(e.integer)
                                : static_cast<double>(e.unsigned_integer);
  }
  return out;
}

}  // namespace gizllm
