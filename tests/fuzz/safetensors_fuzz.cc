// safetensors files: the input is a whole file (u64 header length, JSON header, data), opened as
// the engine opens a checkpoint's file (memory-mapped), then every tensor's bytes read.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "formats/safetensors.h"
#include "fuzz_input.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gizllm::fuzz::MemoryFile file;
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
