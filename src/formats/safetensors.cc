#include "formats/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_excerpt.h"
#include "core/thread_pool.h"

namespace gizllm {
namespace {

using nlohmann::json;

// safetensors dtypes this engine does not load, so that the error says "unsupported" rather than
// "unknown" for a file that is valid but holds, say, float64 tensors.
constexpr std::string_view kOtherSafetensorsDTypes[] = {"BOOL", "F64",     "I16",     "U16",
                                                        "U64",  "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                                        "F4",   "F6_E2M3", "F6_E3M2", "C64"};

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// Elements of `shape`, or -1 when a dimension is negative or the product overflows int64.
int64_t CheckedElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

bool ReadNonNegative(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

// Parses one header entry; `data_size` is the byte count after the header.
Status ParseEntry(const std::string& name, const json& entry, const uint8_t* data,
                  uint64_t data_size, TensorInfo* t, uint64_t* begin) {
  const std::string where = "tensor " + Quote(name);
  if (!entry.is_object()) return DataLoss(where + ": expected an object in the header");
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return DataLoss(where + ": missing string field \"dtype\"");
  }
  const std::string dtype = dtype_it->get<std::string>();
  if (!ParseDType(dtype, &t->dtype)) {
    for (std::string_view other : kOtherSafetensorsDTypes) {
      if (other == dtype) return Unimplemented(where + ": unsupported dtype " + Quote(dtype));
    }
    return DataLoss(where + ": unknown dtype " + Quote(dtype));
  }
  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return DataLoss(where + ": missing array field \"shape\"");
  }
  for (const json& d : *shape_it) {
    int64_t v;
    if (!ReadNonNegative(d, &v)) {
      return DataLoss(where + ": \"shape\" must hold non-negative integers, got " +
                      JsonExcerpt(*shape_it, /*limit=*/200));
    }
    t->shape.push_back(v);
  }
  auto off_it = entry.find("data_offsets");
  int64_t b = 0, e = 0;
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !ReadNonNegative((*off_it)[0], &b) || !ReadNonNegative((*off_it)[1], &e) || e < b) {
    return DataLoss(
        where + ": \"data_offsets\" must be [begin, end] with 0 <= begin <= end, got " +
        (off_it == entry.end() ? std::string("nothing") : JsonExcerpt(*off_it, /*limit=*/200)));
  }
  if (static_cast<uint64_t>(e) > data_size) {
    return DataLoss(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                    "] lie outside the data (" + std::to_string(data_size) + " bytes)");
  }
  const int64_t elements = CheckedElements(t->shape);
  const uint64_t want = elements < 0 ? std::numeric_limits<uint64_t>::max()
                                     : static_cast<uint64_t>(elements) * DTypeSize(t->dtype);
  if (elements < 0 || elements > std::numeric_limits<int64_t>::max() / 8 ||
      want != static_cast<uint64_t>(e - b)) {
    return DataLoss(where + ": data_offsets span " + std::to_string(e - b) + " bytes, but " +
                    dtype + " " + ShapeString(t->shape) + " needs " +
                    (elements < 0 ? std::string("more than int64") : std::to_string(want)));
  }
  t->name = name;
  t->data = data + b;
  t->bytes = static_cast<size_t>(e - b);
  *begin = static_cast<uint64_t>(b);
  return Status::Ok();
}

Expected<json> ParseJsonFile(const std::string& path) {
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path + ": not valid JSON");
  return j;
}

}  // namespace

int64_t TensorInfo::Elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Status CheckFinite(const TensorInfo& t, ThreadPool* pool) {
  const int64_t n = t.Elements();
  int64_t bad = -1;
  if (!pool || pool->threads() < 2 || n < (int64_t{1} << 20)) {
    bad = FirstNonFinite(t.data, t.dtype, n);
  } else {
    // The first bad element of the tensor: the least of each range's first.
    const size_t size = DTypeSize(t.dtype);
    std::atomic<int64_t> first{n};
    pool->ParallelFor(n, int64_t{1} << 18, [&](int64_t begin, int64_t end, int) {
      const int64_t at = FirstNonFinite(t.data + begin * size, t.dtype, end - begin);
      if (at < 0) return;
      int64_t seen = first.load();
      while (begin + at < seen && !first.compare_exchange_weak(seen, begin + at)) {
      }
    });
    if (first.load() < n) bad = first.load();
  }
  if (bad < 0) return Status::Ok();
  float value = 0.0f;
  if (t.dtype == DType::kF32) {
    std::memcpy(&value, t.data + 4 * bad, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * bad, 2);
    value = t.dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
  }
  const std::string what = std::isnan(value) ? "NaN" : value > 0 ? "+inf" : "-inf";
  std::string at = std::to_string(bad);
  if (t.shape.size() == 2) {
    at += " (row " + std::to_string(bad / t.shape[1]) + ", column " +
          std::to_string(bad % t.shape[1]) + ")";
  }
  return InvalidArgument(t.file + ": tensor " + t.name + " holds " + what + " at element " + at +
                         "; its weights are corrupt");
}

Expected<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  GZ_ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  const uint8_t* bytes = f.file_.data();
  const uint64_t size = f.file_.size();
  if (size < 8) {
    return DataLoss(path + ": " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                    std::to_string(size) + " bytes)");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    return DataLoss(path + ": header is not JSON: " + e.what());
  }
  if (!header.is_object()) return DataLoss(path + ": header is not a JSON object");

  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, TensorInfo>> parsed;  // (begin offset, tensor)
  parsed.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) return DataLoss(path + ": \"__metadata__\" is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return DataLoss(path + ": \"__metadata__\" value " + Quote(m.key()) + " is not a string");
        }
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo t;
    uint64_t begin = 0;
    Status s = ParseEntry(it.key(), it.value(), data, data_size, &t, &begin);
    if (!s.ok()) return s.Annotate(path);
    t.file = path;
    parsed.emplace_back(begin, std::move(t));
  }

  // File order; tensors must not share bytes (empty tensors share nothing).
  std::stable_sort(parsed.begin(), parsed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const TensorInfo* prev = nullptr;
  uint64_t prev_end = 0;
  for (const auto& [begin, t] : parsed) {
    if (t.bytes == 0) continue;
    if (prev != nullptr && begin < prev_end) {
      return DataLoss(path + ": tensors " + Quote(prev->name) + " and " + Quote(t.name) +
                      " overlap");
    }
    prev = &t;
    prev_end = begin + t.bytes;
  }
  f.tensors_.reserve(parsed.size());
  for (auto& [begin, t] : parsed) {
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  return f;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Expected<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint c;
  std::error_code ec;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  std::vector<std::pair<std::string, std::string>> listed;  // (tensor, shard) from the index
  if (dir.ends_with(".gguf") && fs::is_regular_file(dir, ec)) {
    return Unimplemented(dir +
                         ": a GGUF file; only loading a model reads GGUF files yet, not "
                         "this command");
  }
  if (fs::is_regular_file(dir, ec) ||
      (dir.ends_with(".safetensors") && !fs::is_directory(dir, ec))) {
    GZ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(dir));
    c.files_.push_back(std::move(f));
  } else if (FileExists(index_path)) {
    GZ_ASSIGN_OR_RETURN(json index, ParseJsonFile(index_path));
    auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      return DataLoss(index_path + ": missing object field \"weight_map\"");
    }
    std::set<std::string> shards;
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it->is_string()) {
        return DataLoss(index_path + ": weight_map[" + Quote(it.key()) + "] is not a file name");
      }
      std::string shard = it->get<std::string>();
      const fs::path p(shard);
      if (shard.empty() || p.is_absolute() || p.has_parent_path() || shard == "..") {
        return DataLoss(index_path + ": weight_map[" + Quote(it.key()) + "] = " + Quote(shard) +
                        " is not a file name in the folder");
      }
      shards.insert(shard);
      listed.emplace_back(it.key(), shard);
    }
    if (shards.empty()) return DataLoss(index_path + ": \"weight_map\" lists no tensors");
    for (const std::string& shard : shards) {
      const std::string shard_path = (fs::path(dir) / shard).string();
      if (!FileExists(shard_path)) {
        return NotFound(index_path + ": shard " + Quote(shard) +
                        " listed in weight_map is missing");
      }
      GZ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(shard_path));
      c.files_.push_back(std::move(f));
    }
  } else if (FileExists(single_path)) {
    GZ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single_path));
    c.files_.push_back(std::move(f));
  } else {
    return NotFound(dir + ": no model.safetensors or model.safetensors.index.json");
  }

  // The index is built once every file has its final place: pointers into files_ stay valid.
  for (const SafetensorsFile& f : c.files_) {
    for (const TensorInfo& t : f.tensors()) {
      auto [it, inserted] = c.index_.emplace(t.name, &t);
      if (!inserted) {
        return DataLoss(dir + ": tensor " + Quote(t.name) + " is in both " + it->second->file +
                        " and " + t.file);
      }
    }
  }
  for (const auto& [name, shard] : listed) {
    const TensorInfo* t = c.Find(name);
    if (t == nullptr) {
      return DataLoss(index_path + ": tensor " + Quote(name) + " listed in weight_map is not in " +
                      "shard " + Quote(shard));
    }
    if (fs::path(t->file).filename() != shard) {
      return DataLoss(index_path + ": tensor " + Quote(name) + " listed in weight_map in shard " +
                      Quote(shard) + " is in " + t->file);
    }
  }
  return c;
}

Expected<Checkpoint> Checkpoint::FromTensors(std::vector<TensorInfo> tensors,
                                             std::shared_ptr<const void> keep,
                                             const std::string& where,
                                             std::map<std::string, std::string> metadata,
                                             const MappedFile* mapping) {
  Checkpoint c;
  c.held_ = std::move(tensors);
  c.keep_ = std::move(keep);
  c.held_mapping_ = mapping;
  c.held_metadata_ = std::move(metadata);
  for (const TensorInfo& t : c.held_) {
    if (!c.index_.emplace(t.name, &t).second) {
      return DataLoss(where + ": tensor " + Quote(t.name) + " is given twice");
    }
  }
  return c;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const TensorInfo*> Checkpoint::All() const {
  std::vector<const TensorInfo*> all;
  all.reserve(index_.size());
  for (const SafetensorsFile& f : files_) {
    for (const TensorInfo& t : f.tensors()) all.push_back(&t);
  }
  for (const TensorInfo& t : held_) all.push_back(&t);
  return all;
}

const std::map<std::string, std::string>& Checkpoint::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  if (!held_metadata_.empty()) return held_metadata_;
  return files_.empty() ? kEmpty : files_.front().metadata();
}

int64_t CountParameters(const Checkpoint& checkpoint) {
  int64_t n = 0;
  for (const TensorInfo* t : checkpoint.All()) n += t->Elements();
  return n;
}

namespace {

// The header's text for tensors at `entries`' data offsets: `__metadata__` first, then the
// tensors in order, padded with spaces to a multiple of 8 bytes (or to `size` when that is larger).
std::string HeaderText(std::span<const SafetensorsWriterEntry> entries,
                       const std::map<std::string, std::string>& metadata, size_t size = 0) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  for (const SafetensorsWriterEntry& e : entries) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // data starts at 8 + text.size(), 8-aligned
  if (text.size() < size) text.append(size - text.size(), ' ');
  return text;
}

// Checks one tensor to write: its name (not empty, not __metadata__, not given before) and that
// its bytes are its shape's.
Status CheckTensorToWrite(const std::string& path, const TensorToWrite& t,
                          const std::set<std::string, std::less<>>& names) {
  const std::string where = path + ": tensor " + Quote(t.name);
  if (t.name.empty() || t.name == "__metadata__") {
    return InvalidArgument(path + ": tensor name " + Quote(t.name) + " is not allowed");
  }
  if (names.count(t.name)) return InvalidArgument(where + ": written twice");
  const int64_t elements = CheckedElements(t.shape);
  if (elements < 0 || static_cast<uint64_t>(elements) * DTypeSize(t.dtype) != t.bytes) {
    return InvalidArgument(where + ": " + std::to_string(t.bytes) + " bytes given, but " +
                           std::string(DTypeName(t.dtype)) + " " + ShapeString(t.shape) +
                           " needs " + std::to_string(elements * DTypeSize(t.dtype)));
  }
  if (t.bytes > 0 && t.data == nullptr) return InvalidArgument(where + ": no data");
  return Status::Ok();
}

bool WriteLength(std::FILE* out, uint64_t n) {
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  return std::fwrite(len, 1, 8, out) == 8;
}

}  // namespace

Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriterEntry> entries;
  entries.reserve(tensors.size());
  std::set<std::string, std::less<>> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    GZ_RETURN_IF_ERROR(CheckTensorToWrite(path, t, names));
    names.insert(t.name);
    offset = (offset + 7) & ~uint64_t{7};
    entries.push_back({t.name, t.dtype, t.shape, offset, offset + t.bytes});
    offset += t.bytes;
  }
  const std::string text = HeaderText(entries, metadata);

  const std::string partial = path + ".partial";
  std::FILE* out = std::fopen(partial.c_str(), "wb");
  if (out == nullptr) return NotFound(partial + ": cannot create");
  bool ok = WriteLength(out, text.size());
  ok = ok && std::fwrite(text.data(), 1, text.size(), out) == text.size();
  static const char kZeros[8] = {};
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size() && ok; ++i) {
    const uint64_t pad = entries[i].begin - at;
    ok = ok && std::fwrite(kZeros, 1, pad, out) == pad;
    ok = ok && (tensors[i].bytes == 0 ||
                std::fwrite(tensors[i].data, 1, tensors[i].bytes, out) == tensors[i].bytes);
    at = entries[i].end;
  }
  ok = (std::fclose(out) == 0) && ok;
  if (!ok) {
    std::remove(partial.c_str());
    return Internal(partial + ": write failed (disk full?)");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    return Internal(path + ": cannot rename " + partial + " to it");
  }
  return Status::Ok();
}

Expected<SafetensorsWriter> SafetensorsWriter::Open(const std::string& path, size_t reserve) {
  SafetensorsWriter w;
  w.path_ = path;
  w.reserve_ = (reserve + 7) & ~size_t{7};
  const std::string partial = path + ".partial";
  w.file_ = std::fopen(partial.c_str(), "wb");
  if (w.file_ == nullptr) return NotFound(partial + ": cannot create");
  // The header's place: its length and spaces, written over by Finish.
  const std::string blank(w.reserve_, ' ');
  bool ok = WriteLength(w.file_, w.reserve_);
  ok = ok && std::fwrite(blank.data(), 1, blank.size(), w.file_) == blank.size();
  if (!ok) {
    w.Abandon();
    return Internal(partial + ": write failed (disk full?)");
  }
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept { *this = std::move(o); }

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    Abandon();
    path_ = std::move(o.path_);
    file_ = o.file_;
    reserve_ = o.reserve_;
    offset_ = o.offset_;
    entries_ = std::move(o.entries_);
    names_ = std::move(o.names_);
    o.file_ = nullptr;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() { Abandon(); }

void SafetensorsWriter::Abandon() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  file_ = nullptr;
  std::remove((path_ + ".partial").c_str());
}

Status SafetensorsWriter::Add(const TensorToWrite& t) {
  const std::string partial = path_ + ".partial";
  if (file_ == nullptr) return Internal(partial + ": not open");
  GZ_RETURN_IF_ERROR(CheckTensorToWrite(path_, t, names_));
  static const char kZeros[8] = {};
  const uint64_t begin = (offset_ + 7) & ~uint64_t{7};
  bool ok = std::fwrite(kZeros, 1, begin - offset_, file_) == begin - offset_;
  ok = ok && (t.bytes == 0 || std::fwrite(t.data, 1, t.bytes, file_) == t.bytes);
  if (!ok) {
    Abandon();
    return Internal(partial + ": write failed (disk full?)");
  }
  names_.insert(t.name);
  entries_.push_back({t.name, t.dtype, t.shape, begin, begin + t.bytes});
  offset_ = begin + t.bytes;
  return Status::Ok();
}

Status SafetensorsWriter::Finish(const std::map<std::string, std::string>& metadata) {
  const std::string partial = path_ + ".partial";
  if (file_ == nullptr) return Internal(partial + ": not open");
  const std::string text = HeaderText(entries_, metadata, reserve_);
  bool ok = true;
  if (text.size() == reserve_) {
    ok = std::fseek(file_, 8, SEEK_SET) == 0 &&
         std::fwrite(text.data(), 1, text.size(), file_) == text.size();
    ok = (std::fclose(file_) == 0) && ok;
    file_ = nullptr;
  } else {
    // The header outgrew its place: write it, then copy the data after it.
    ok = std::fflush(file_) == 0;
    const std::string second = path_ + ".partial2";
    std::FILE* in = std::fopen(partial.c_str(), "rb");
    std::FILE* out = std::fopen(second.c_str(), "wb");
    ok = ok && in && out && std::fseek(in, static_cast<long>(8 + reserve_), SEEK_SET) == 0;
    ok = ok && WriteLength(out, text.size()) &&
         std::fwrite(text.data(), 1, text.size(), out) == text.size();
    std::vector<char> buffer(size_t{8} << 20);
    uint64_t left = offset_;
    while (ok && left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
      ok = std::fread(buffer.data(), 1, n, in) == n && std::fwrite(buffer.data(), 1, n, out) == n;
      left -= n;
    }
    if (in) std::fclose(in);
    if (out) ok = (std::fclose(out) == 0) && ok;
    Abandon();
    if (ok && std::rename(second.c_str(), partial.c_str()) != 0) ok = false;
    if (!ok) {
      std::remove(second.c_str());
      std::remove(partial.c_str());
      return Internal(partial + ": write failed (disk full?)");
    }
  }
  if (!ok) {
    std::remove(partial.c_str());
    return Internal(partial + ": write failed (disk full?)");
  }
  if (std::rename(partial.c_str(), path_.c_str()) != 0) {
    std::remove(partial.c_str());
    return Internal(path_ + ": cannot rename " + partial + " to it");
  }
  return Status::Ok();
}

void Checkpoint::Release(const TensorInfo& t) const {
  for (const SafetensorsFile& f : files_) {
    if (f.mapped().Holds(t.data, t.bytes)) {
      f.mapped().Release(t.data, t.bytes);
      return;
    }
  }
  // A held tensor read in place from its mapped file (not one converted into a copy).
  if (held_mapping_ && held_mapping_->Holds(t.data, t.bytes)) {
    held_mapping_->Release(t.data, t.bytes);
  }
}

}  // namespace gizllm
