// A bitgpu folder's manifest.json: the input is "manifest.json text\0DATA_SIZE", DATA_SIZE the
// data file's size in decimal (a file of zeros, at most 1 GiB and sparse: the manifest's checks
// read sizes, not weights; without the \0 part, an empty file); the aux file is the lookup tables
// convert writes (tgt2 then tgt4). Parses the manifest (BitgpuManifest::Parse), its arch contract
// (BitgpuConfigOf, then ParseArch), then every ref the loader reads (luts.tgt2, luts.tgt4 and
// each tensor's weight, scales and zp) with ReadBitgpuRef against the two files; a ref accepted
// must lie inside its file, its bytes those of its dtype and shape.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/mapped_file.h"
#include "fuzz_input.h"
#include "memory_file.h"
#include "model/bitgpu_manifest.h"
#include "model/config.h"

namespace {

using nlohmann::json;

constexpr uint64_t kMaxDataBytes = uint64_t{1} << 30;

// A ref accepted by ReadBitgpuRef lies inside its file and holds its dtype's bytes.
void CheckRef(const gizllm::BitgpuRef& r, const gizllm::MappedFile& data,
              const gizllm::MappedFile& aux) {
  const gizllm::MappedFile& file = r.aux ? aux : data;
  CHECK(r.off <= file.size() && r.len <= file.size() - r.off);
  CHECK(r.len == 0 || r.data == file.data() + r.off);
  uint64_t elements = 1;
  for (int64_t d : r.shape) {
    CHECK(d >= 0);
    elements *= static_cast<uint64_t>(d);
  }
  CHECK(r.len == elements * (r.dtype == "FLOAT" ? 4 : 1));
  if (r.len > 0) gizllm::fuzz::Use(r.data[0] + r.data[r.len - 1]);
}

void ReadRefs(const gizllm::BitgpuManifest& m, const json& obj, const std::string& at,
              const std::vector<const char*>& keys, const gizllm::MappedFile& data,
              const gizllm::MappedFile& aux) {
  for (const char* key : keys) {
    if (!obj.contains(key)) continue;
    gizllm::Expected<gizllm::BitgpuRef> r = gizllm::ReadBitgpuRef(m, obj, at, key, data, aux);
    if (!r.ok()) {
      CHECK(r.status().message().find(m.path()) != std::string::npos);
      continue;
    }
    CHECK(r->field == at + "." + key);
    CheckRef(*r, data, aux);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gizllm::fuzz::MemoryFile* data_file = new gizllm::fuzz::MemoryFile();
  static gizllm::fuzz::MemoryFile* aux_file = [] {
    auto* f = new gizllm::fuzz::MemoryFile();
    std::string aux;
    const auto tgt2 = gizllm::BitgpuTgt2();
    const auto tgt4 = gizllm::BitgpuTgt4();
    aux.append(tgt2.begin(), tgt2.end());
    aux.append(tgt4.begin(), tgt4.end());
    f->Write(reinterpret_cast<const uint8_t*>(aux.data()), aux.size());
    return f;
  }();

  const gizllm::fuzz::Parts parts = gizllm::fuzz::SplitAtNul(gizllm::fuzz::AsText(data, size));
  uint64_t data_bytes = 0;
  if (parts.split) {
    const char* end = parts.second.data() + parts.second.size();
    std::from_chars(parts.second.data(), end, data_bytes);
    if (data_bytes > kMaxDataBytes) data_bytes = kMaxDataBytes;
  }
  data_file->Resize(data_bytes);

  const std::string path = "folder/manifest.json";
  gizllm::Expected<gizllm::BitgpuManifest> m = gizllm::BitgpuManifest::Parse(parts.first, path);
  if (!m.ok()) {
    CHECK(m.status().message().find(path) != std::string::npos);
    return 0;
  }
  CHECK(m->version() == 1 || m->version() == 2);
  CHECK(m->root().is_object());

  gizllm::Expected<json> config = gizllm::BitgpuConfigOf(*m);
  if (config.ok()) {
    gizllm::Expected<gizllm::Arch> arch = gizllm::ParseArch(*config, path + ": arch");
    if (arch.ok()) {
      CHECK(arch->layers > 0 && static_cast<int>(arch->layer.size()) == arch->layers);
      CHECK(arch->head_dim > 0 && arch->head_dim <= 128);
      CHECK(arch->family == "qwen3");
    } else {
      CHECK(!arch.status().message().empty());
    }
  } else {
    CHECK(config.status().message().find(path) != std::string::npos);
  }

  gizllm::Expected<gizllm::MappedFile> data_map = gizllm::MappedFile::Open(data_file->path());
  gizllm::Expected<gizllm::MappedFile> aux_map = gizllm::MappedFile::Open(aux_file->path());
  CHECK(data_map.ok() && aux_map.ok());
  const json& root = m->root();
  if (auto luts = root.find("luts"); luts != root.end() && luts->is_object()) {
    ReadRefs(*m, *luts, "luts", {"tgt2", "tgt4"}, *data_map, *aux_map);
  }
  if (auto tensors = root.find("tensors"); tensors != root.end() && tensors->is_object()) {
    for (auto it = tensors->begin(); it != tensors->end(); ++it) {
      if (!it->is_object()) continue;
      ReadRefs(*m, *it, "tensors." + it.key(), {"weight", "scales", "zp"}, *data_map, *aux_map);
    }
  }
  return 0;
}
