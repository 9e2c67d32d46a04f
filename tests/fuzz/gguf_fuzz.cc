// GGUF files: the input is a whole file, opened as the engine opens a model (memory-mapped), then
// every metadata value and every tensor's bytes read.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "formats/gguf.h"
#include "fuzz_input.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gizllm::fuzz::MemoryFile file;
  file.Write(data, size);
  gizllm::Expected<gizllm::GgufFile> f = gizllm::GgufFile::Open(file.path());
  if (!f.ok()) return 0;
  uint64_t sum = 0;
  // What the loader does next: typed reads of the metadata, the tensors' bytes (ASan checks the
  // bounds).
  for (const auto& [key, v] : f->metadata()) {
    CHECK(f->Find(key) == &v);
    sum += key.size() + v.string.size();
    if (v.type == gizllm::GgufType::kArray) {
      if (auto ints = f->GetInts(key); ints.ok()) sum += ints->size();
      if (auto strings = f->GetStrings(key); strings.ok()) sum += strings->size();
    }
    if (auto x = f->GetFloat(key); x.ok()) sum += static_cast<uint64_t>(*x != 0.0);
  }
  for (const gizllm::GgufTensor& t : f->tensors()) {
    CHECK(f->FindTensor(t.name) == &t);
    for (size_t i = 0; i < t.bytes; ++i) sum += t.data[i];
  }
  gizllm::fuzz::Use(sum);
  return 0;
}
