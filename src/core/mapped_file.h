// A read-only memory-mapped file: tensors are read lazily, page by page, as the kernels touch them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace gizllm {

class MappedFile {
 public:
  static Expected<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether [p, p + n) lies inside the mapping.
  bool Holds(const void* p, size_t n) const;
  // Drops the whole pages of [p, p + n) (inside the mapping) from the process's memory; a later
  // read faults them in from the file again. For readers that stream a file larger than memory
  // once (convert): the pages read stay in the page cache, not in the process.
  void Release(const void* p, size_t n) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string: config.json, tokenizer.json.
Expected<std::string> ReadFile(const std::string& path);
bool FileExists(const std::string& path);

}  // namespace gizllm
