#include "model/bitgpu_manifest.h"

#include <filesystem>
#include <limits>

#include "core/json_nesting.h"
#include "formats/safetensors.h"
#include "model/config.h"

namespace gizllm {
namespace {

using nlohmann::json;

constexpr int64_t kMaxDim = 1 << 24;  // of any count or size in the arch contract
constexpr uint64_t kMaxManifestBytes = 64ull << 20;

// Names and values come from the file: show at most 100 bytes of one.
std::string Quote(const std::string& s) {
  return "\"" + (s.size() > 100 ? s.substr(0, 100) + "..." : s) + "\"";
}

}  // namespace

Expected<BitgpuManifest> BitgpuManifest::Read(const std::string& dir) {
  const std::string path = dir + "/" + kBitgpuManifest;
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return NotFound(path + ": cannot read (" + ec.message() + ")");
  if (size > kMaxManifestBytes) {
    return DataLoss(path + ": " + std::to_string(size) + " bytes, more than a manifest holds (" +
                    std::to_string(kMaxManifestBytes) + ")");
  }
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return Parse(text, path);
}

Expected<BitgpuManifest> BitgpuManifest::Parse(std::string_view text, const std::string& path) {
  BitgpuManifest m;
  m.path_ = path;
  if (text.size() > kMaxManifestBytes) {
    return DataLoss(path + ": " + std::to_string(text.size()) +
                    " bytes, more than a manifest holds (" + std::to_string(kMaxManifestBytes) +
                    ")");
  }
  if (JsonTooDeep(text)) return DataLoss(path + ": JSON nested too deeply");
  m.root_ = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.root_.is_discarded() || !m.root_.is_object()) {
    return DataLoss(path + ": not a JSON object");
  }
  GZ_ASSIGN_OR_RETURN(m.version_, m.Int(m.root_, "", "version", 1, 2));
  return m;
}

Status BitgpuManifest::Error(const std::string& field, const std::string& what) const {
  return DataLoss(path_ + ": " + field + " " + what);
}

Expected<const json*> BitgpuManifest::Member(const json& obj, const std::string& at,
                                             const std::string& key, json::value_t type) const {
  const std::string field = at.empty() ? key : at + "." + key;
  auto it = obj.find(key);
  if (it == obj.end()) return NotFound(path_ + ": " + field + " is missing");
  const bool ok = type == json::value_t::number_integer ? it->is_number_integer()
                  : type == json::value_t::number_float ? it->is_number()
                                                        : it->type() == type;
  if (!ok) return Error(field, "has the wrong type (" + std::string(it->type_name()) + ")");
  return &*it;
}

Expected<int64_t> BitgpuManifest::Int(const json& obj, const std::string& at,
                                      const std::string& key, int64_t lo, int64_t hi) const {
  GZ_ASSIGN_OR_RETURN(const json* v, Member(obj, at, key, json::value_t::number_integer));
  const bool negative = !v->is_number_unsigned() && v->get<int64_t>() < 0;
  const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi);
  if (negative || too_big || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
    return Error(
        at.empty() ? key : at + "." + key,
        v->dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v->get<int64_t>();
}

Expected<std::string> BitgpuManifest::String(const json& obj, const std::string& at,
                                             const std::string& key) const {
  GZ_ASSIGN_OR_RETURN(const json* v, Member(obj, at, key, json::value_t::string));
  return v->get<std::string>();
}

Expected<BitgpuRef> ReadBitgpuRef(const BitgpuManifest& m, const json& obj, const std::string& at,
                                  const std::string& key, const MappedFile& data,
                                  const MappedFile& aux) {
  BitgpuRef r;
  r.field = at + "." + key;
  GZ_ASSIGN_OR_RETURN(const json* ref, m.Member(obj, at, key, json::value_t::object));
  GZ_ASSIGN_OR_RETURN(r.dtype, m.String(*ref, r.field, "dtype"));
  int64_t size = 0;
  if (r.dtype == "FLOAT") {
    size = 4;
  } else if (r.dtype == "UINT8") {
    size = 1;
  } else {
    return m.Error(r.field + ".dtype", Quote(r.dtype) + " is not read (FLOAT or UINT8)");
  }
  GZ_ASSIGN_OR_RETURN(const json* shape, m.Member(*ref, r.field, "shape", json::value_t::array));
  if (shape->empty() || shape->size() > 4) {
    return m.Error(r.field + ".shape",
                   "has " + std::to_string(shape->size()) + " dimensions (expected 1 to 4)");
  }
  uint64_t elements = 1;
  for (size_t i = 0; i < shape->size(); ++i) {
    const json& d = (*shape)[i];
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
      return m.Error(r.field + ".shape[" + std::to_string(i) + "]", d.dump() + " is not a size");
    }
    r.shape.push_back(d.get<int64_t>());
    // Each factor is below 2^40 and the product stays below 2^62 or stops here.
    if (elements > 0 && static_cast<uint64_t>(r.shape.back()) > (uint64_t{1} << 62) / elements) {
      return m.Error(r.field + ".shape", "holds more elements than any file");
    }
    elements *= static_cast<uint64_t>(r.shape.back());
  }
  GZ_ASSIGN_OR_RETURN(std::string src, m.String(*ref, r.field, "src"));
  if (src != "data" && src != "aux") {
    return m.Error(r.field + ".src", Quote(src) + " is neither \"data\" nor \"aux\"");
  }
  r.aux = src == "aux";
  const MappedFile& file = r.aux ? aux : data;
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  GZ_ASSIGN_OR_RETURN(int64_t off, m.Int(*ref, r.field, "off", 0, kMax));
  GZ_ASSIGN_OR_RETURN(int64_t len, m.Int(*ref, r.field, "len", 0, kMax));
  r.off = static_cast<uint64_t>(off);
  r.len = static_cast<uint64_t>(len);
  if (r.off > file.size() || r.len > file.size() - r.off) {
    return m.Error(r.field, "bytes [" + std::to_string(r.off) + ", +" + std::to_string(r.len) +
                                ") lie past the end of " + file.path() + " (" +
                                std::to_string(file.size()) + " bytes)");
  }
  if (r.len != elements * static_cast<uint64_t>(size)) {
    return m.Error(r.field + ".len", std::to_string(r.len) + " is not the " +
                                         std::to_string(elements * size) + " bytes of " + r.dtype +
                                         " " + ShapeString(r.shape));
  }
  r.data = file.data() + r.off;
  return r;
}

Expected<json> BitgpuConfigOf(const BitgpuManifest& m) {
  GZ_ASSIGN_OR_RETURN(const json* arch, m.Member(m.root(), "", "arch", json::value_t::object));
  json c = json::object();
  c["model_type"] = "qwen3";
  if (arch->contains("model_type")) {
    GZ_ASSIGN_OR_RETURN(std::string type, m.String(*arch, "arch", "model_type"));
    if (type != "qwen3") {
      return Unimplemented(m.path() + ": arch.model_type " + Quote(type) +
                           " is not read (bitgpu folders hold qwen3 models)");
    }
  }
  const std::pair<const char*, const char*> kInts[] = {{"layers", "num_hidden_layers"},
                                                       {"hidden", "hidden_size"},
                                                       {"intermediate", "intermediate_size"},
                                                       {"heads", "num_attention_heads"},
                                                       {"kv_heads", "num_key_value_heads"},
                                                       {"head_dim", "head_dim"},
                                                       {"vocab", "vocab_size"}};
  for (const auto& [key, field] : kInts) {
    GZ_ASSIGN_OR_RETURN(c[field], m.Int(*arch, "arch", key, 1, kMaxDim));
  }
  if (c["head_dim"].get<int64_t>() > 128) {
    return Unimplemented(m.path() + ": arch.head_dim " + c["head_dim"].dump() +
                         " is more than the 128 the format allows");
  }
  GZ_ASSIGN_OR_RETURN(const json* eps,
                      m.Member(*arch, "arch", "rms_eps", json::value_t::number_float));
  c["rms_norm_eps"] = *eps;
  GZ_ASSIGN_OR_RETURN(std::string act, m.String(*arch, "arch", "act"));
  if (act != "silu") {
    return Unimplemented(m.path() + ": arch.act " + Quote(act) + " is not silu (SwiGLU)");
  }
  c["hidden_act"] = "silu";
  GZ_ASSIGN_OR_RETURN(const json* tied,
                      m.Member(*arch, "arch", "tie_word_embeddings", json::value_t::boolean));
  c["tie_word_embeddings"] = *tied;
  // A planar lm_head has scales of its own: the head is its own matrix even where it shares the
  // embedding's sign bytes.
  auto tensors = m.root().find("tensors");
  if (tensors != m.root().end() && tensors->is_object()) {
    auto head = tensors->find("lm_head");
    if (head != tensors->end() && head->is_object() && !head->contains("container")) {
      c["tie_word_embeddings"] = false;
    }
  }
  GZ_ASSIGN_OR_RETURN(const json* eos,
                      m.Member(*arch, "arch", "eos", json::value_t::number_integer));
  c["eos_token_id"] = *eos;
  auto rope = arch->find("rope");
  if (rope == arch->end()) {
    return Unimplemented(m.path() +
                         ": arch.rope is missing; baked rope tables (cos_cache, sin_cache) "
                         "without their parameters are not read");
  }
  if (!rope->is_object()) return m.Error("arch.rope", "is not an object");
  GZ_ASSIGN_OR_RETURN(const json* theta,
                      m.Member(*rope, "arch.rope", "rope_theta", json::value_t::number_float));
  c["rope_theta"] = *theta;
  if (rope->contains("rope_type")) {
    GZ_ASSIGN_OR_RETURN(std::string type, m.String(*rope, "arch.rope", "rope_type"));
    if (type != "default") {
      return Unimplemented(m.path() + ": arch.rope.rope_type " + Quote(type) +
                           " is not supported (plain rope only)");
    }
  }
  GZ_ASSIGN_OR_RETURN(c["max_position_embeddings"],
                      m.Int(*arch, "arch", "max_positions", 1, kMaxDim));
  return c;
}

bool IsBitgpuFolder(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) &&
         std::filesystem::exists(dir + "/" + kBitgpuManifest, ec) &&
         !std::filesystem::exists(dir + "/config.json", ec);
}

std::array<uint8_t, 512> BitgpuTgt2() {
  std::array<uint8_t, 512> t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) {
      const int code = (b >> j) & 1 ? 3 : 1;
      t[2 * b + j / 4] |= static_cast<uint8_t>(code << (2 * (j % 4)));
    }
  }
  return t;
}

std::array<uint8_t, 1024> BitgpuTgt4() {
  std::array<uint8_t, 1024> t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) {
      const int code = (b >> j) & 1 ? 9 : 7;
      t[4 * b + j / 2] |= static_cast<uint8_t>(code << (4 * (j % 2)));
    }
  }
  return t;
}

Expected<json> ReadBitgpuConfig(const std::string& dir) {
  GZ_ASSIGN_OR_RETURN(BitgpuManifest m, BitgpuManifest::Read(dir));
  return BitgpuConfigOf(m);
}

Expected<Arch> ReadBitgpuArch(const std::string& dir) {
  GZ_ASSIGN_OR_RETURN(BitgpuManifest m, BitgpuManifest::Read(dir));
  GZ_ASSIGN_OR_RETURN(json config, BitgpuConfigOf(m));
  return ParseArch(config, m.path() + ": arch");
}

}  // namespace gizllm
