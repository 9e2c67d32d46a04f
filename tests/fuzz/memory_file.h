// An in-memory file for the harnesses of file formats: the input written to a memfd, opened by
// its /proc/self/fd path as the engine opens a model file (memory-mapped).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"

namespace gizllm::fuzz {

// An in-memory file whose /proc/self/fd path MappedFile::Open takes as any other.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("fuzz_input", 0)) { CHECK(fd_ >= 0); }
  ~MemoryFile() { close(fd_); }

  // Replaces the file's contents by `size` bytes at `data`.
  void Write(const uint8_t* data, size_t size) {
    CHECK(ftruncate(fd_, 0) == 0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      CHECK(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  // Replaces the file's contents by `size` zero bytes (sparse: no memory until read).
  void Resize(size_t size) {
    CHECK(ftruncate(fd_, 0) == 0);
    CHECK(ftruncate(fd_, static_cast<off_t>(size)) == 0);
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace gizllm::fuzz
