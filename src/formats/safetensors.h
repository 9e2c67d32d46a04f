// safetensors files: tensors memory-mapped in place, never copied; a writer for converted models.
//
// Layout: u64 (little-endian) header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets count from the first byte after the header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace gizllm {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // [bytes] into the memory-mapped file; not aligned in general
  size_t bytes = 0;               // = elements * DTypeSize(dtype), or the blocks' bytes
  std::string file;               // path of the file that holds it
  // A GGUF matrix kept in ggml's blocks: its GgmlType (formats/gguf.h), with dtype kU8 and
  // `bytes` the blocks' (rows of whole blocks); -1 for every other tensor.
  int32_t ggml_type = -1;

  int64_t Elements() const;
};

class ThreadPool;

// An error naming the file, the tensor and the element when a float tensor (F32, F16, BF16) holds
// a NaN or an infinity: a model with one writes nonsense, it does not fail by itself. Split over
// `pool` where given (the same element named).
Status CheckFinite(const TensorInfo& t, ThreadPool* pool = nullptr);

// A shape as "[rows, cols]", for messages.
std::string ShapeString(std::span<const int64_t> shape);

// One memory-mapped .safetensors file. Pointers into it (TensorInfo, data) stay valid while the
// object lives, also after it is moved.
class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> Open(const std::string& path);

  const TensorInfo* Find(std::string_view name) const;                 // null if absent
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }  // "__metadata__"
  const std::string& path() const { return file_.path(); }
  const MappedFile& mapped() const { return file_; }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder.
class Checkpoint {
 public:
  // `dir` holds model.safetensors, or the shards listed in model.safetensors.index.json
  // ("weight_map"). `dir` may also name a single .safetensors file.
  static Expected<Checkpoint> Open(const std::string& dir);
  // Tensors held elsewhere (a GGUF file's, under the names the families use; some converted at
  // load): `keep` owns the memory they point into; `metadata` stands for a file's header (a
  // bitgpu folder's describes its linears); `mapping`, owned by `keep`, is the mapped file
  // whose tensors Release may drop (null: none). An error names `where` and a repeated name.
  static Expected<Checkpoint> FromTensors(std::vector<TensorInfo> tensors,
                                          std::shared_ptr<const void> keep,
                                          const std::string& where,
                                          std::map<std::string, std::string> metadata = {},
                                          const MappedFile* mapping = nullptr);

  const TensorInfo* Find(std::string_view name) const;         // null if absent
  std::vector<const TensorInfo*> All() const;                  // file by file, in file order
  const std::map<std::string, std::string>& metadata() const;  // of the first file, or given
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Drops the pages of `t` from the process's memory where it lies in a mapped file (see
  // MappedFile::Release); tensors held elsewhere are left as they are.
  void Release(const TensorInfo& t) const;

 private:
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> held_;      // FromTensors: tensors outside any safetensors file
  std::shared_ptr<const void> keep_;  // what held_ points into
  const MappedFile* held_mapping_ = nullptr;  // FromTensors' mapped file (in keep_), or null
  std::map<std::string, std::string> held_metadata_;  // FromTensors' metadata
  std::map<std::string, const TensorInfo*, std::less<>> index_;
};

// Elements of every tensor of the checkpoint.
int64_t CountParameters(const Checkpoint& checkpoint);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // [bytes]
  size_t bytes = 0;            // must equal elements * DTypeSize(dtype)
};

// Writes `tensors` (in the given order) and `metadata` as a .safetensors file. The header is padded
// with spaces so that the data starts 8-byte aligned, and each tensor starts at an 8-byte aligned
// offset. When every tensor's size is a multiple of 8 (the usual case) the tensors are contiguous
// and the file is what the reference writer produces; otherwise the alignment leaves gaps, which
// this reader accepts but the Python safetensors library does not.
// Writes to path + ".partial", then renames it to `path`.
Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata);

// Where a tensor lies in a file being written (data offsets from the data's start).
struct SafetensorsWriterEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// The same file written one tensor at a time, so that the writer holds no tensor after Add
// returns (convert's output of a model larger than memory). The data goes to path + ".partial"
// after `reserve` bytes kept for the header; Finish writes the header there, padded with spaces
// as the format allows, and renames the file to `path`. A header longer than `reserve` is
// written in front of a copy of the data instead (slower; the same file). A writer dropped
// before Finish removes its partial file.
class SafetensorsWriter {
 public:
  static Expected<SafetensorsWriter> Open(const std::string& path, size_t reserve);
  SafetensorsWriter() = default;
  SafetensorsWriter(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  Status Add(const TensorToWrite& t);
  Status Finish(const std::map<std::string, std::string>& metadata);
  int64_t count() const { return static_cast<int64_t>(entries_.size()); }

 private:
  void Abandon();

  std::string path_;
  std::FILE* file_ = nullptr;
  size_t reserve_ = 0;
  uint64_t offset_ = 0;  // data bytes written
  std::vector<SafetensorsWriterEntry> entries_;
  std::set<std::string, std::less<>> names_;
};

}  // namespace gizllm
