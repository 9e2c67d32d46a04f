// safetensors files: the input is a whole file (u64 header length, JSON header, data), opened as
// the engine opens a checkpoint's file (memory-mapped), then every tensor's bytes read.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "formats/safetensors.h"
#include "fuzz_input.h"

namespace {

// An in-memory file whose /proc/self/fd path MappedFile::Open takes as any other.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("safetensors_fuzz", 0)) { CHECK(fd_ >= 0); }
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
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static MemoryFile file;
  file.Write(data, size);
  gizllm::Expected<gizllm::SafetensorsFile> f = gizllm::SafetensorsFile::Open(file.path());
  if (!f.ok()) return 0;
  // What the loader does next: look tensors up and read their bytes (ASan checks the bounds).
  uint64_t sum = 0;
  for (const gizllm::TensorInfo& t : f->tensors()) {
    CHECK(f->Find(t.name) == &t);
    CHECK(t.bytes == static_cast<size_t>(t.Elements()) * gizllm::DTypeSize(t.dtype));
    for (size_t i = 0; i < t.bytes; ++i) sum += t.data[i];
  }
  for (const auto& [key, value] : f->metadata()) sum += key.size() + value.size();
  gizllm::fuzz::Use(sum);
  return 0;
}
