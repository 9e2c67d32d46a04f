#include "model/bitgpu_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include "core/json_nesting.h"
#include "core/mapped_file.h"
#include "formats/ggml_blocks.h"
#include "model/config.h"
#include "quant/linear_io.h"

namespace gizllm {
namespace {

using nlohmann::json;

constexpr int64_t kBlock = 128;       // inputs a block of every quantized tensor
constexpr int64_t kQ1_0Bytes = 18;    // a Q1_0 block: f16 scale, 16 sign bytes
constexpr int64_t kMaxDim = 1 << 24;  // of any count or size in the arch contract
constexpr uint64_t kMaxManifestBytes = 64ull << 20;

// Names and values come from the file: show at most 100 bytes of one.
std::string Quote(const std::string& s) {
  return "\"" + (s.size() > 100 ? s.substr(0, 100) + "..." : s) + "\"";
}

bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

// One blob of a file: a ref checked against its file.
struct Ref {
  std::string field;  // where the manifest gives it, for messages
  bool aux = false;
  uint64_t off = 0, len = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;

  bool SameBytes(const Ref& o) const { return aux == o.aux && off == o.off && len == o.len; }
};

// The manifest and the files it names; every read checks its field and names it.
class Manifest {
 public:
  static Expected<Manifest> Read(const std::string& dir) {
    Manifest m;
    m.dir_ = dir;
    m.path_ = dir + "/" + kBitgpuManifest;
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(m.path_, ec);
    if (ec) return NotFound(m.path_ + ": cannot read (" + ec.message() + ")");
    if (size > kMaxManifestBytes) {
      return DataLoss(m.path_ + ": " + std::to_string(size) +
                      " bytes, more than a manifest holds (" + std::to_string(kMaxManifestBytes) +
                      ")");
    }
    GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(m.path_));
    if (JsonTooDeep(text)) return DataLoss(m.path_ + ": JSON nested too deeply");
    m.root_ = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (m.root_.is_discarded() || !m.root_.is_object()) {
      return DataLoss(m.path_ + ": not a JSON object");
    }
    GZ_ASSIGN_OR_RETURN(m.version_, m.Int(m.root_, "", "version", 1, 2));
    return m;
  }

  const std::string& path() const { return path_; }
  const json& root() const { return root_; }
  int64_t version() const { return version_; }

  Status Error(const std::string& field, const std::string& what) const {
    return DataLoss(path_ + ": " + field + " " + what);
  }

  Expected<const json*> Member(const json& obj, const std::string& at, const std::string& key,
                               json::value_t type) const {
    const std::string field = at.empty() ? key : at + "." + key;
    auto it = obj.find(key);
    if (it == obj.end()) return NotFound(path_ + ": " + field + " is missing");
    const bool ok = type == json::value_t::number_integer ? it->is_number_integer()
                    : type == json::value_t::number_float ? it->is_number()
                                                          : it->type() == type;
    if (!ok) return Error(field, "has the wrong type (" + std::string(it->type_name()) + ")");
    return &*it;
  }
  Expected<int64_t> Int(const json& obj, const std::string& at, const std::string& key, int64_t lo,
                        int64_t hi) const {
    GZ_ASSIGN_OR_RETURN(const json* v, Member(obj, at, key, json::value_t::number_integer));
    const bool negative =
        v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() < 0;
    const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi);
    if (negative || too_big || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
      return Error(
          at.empty() ? key : at + "." + key,
          v->dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v->get<int64_t>();
  }
  Expected<std::string> String(const json& obj, const std::string& at,
                               const std::string& key) const {
    GZ_ASSIGN_OR_RETURN(const json* v, Member(obj, at, key, json::value_t::string));
    return v->get<std::string>();
  }

 private:
  std::string dir_, path_;
  json root_;
  int64_t version_ = 0;
};

// A ref {dtype, shape, src, off, len} at `field` of `obj`, inside its file: its bytes lie inside
// the file and are the bytes of its dtype and shape.
Expected<Ref> ReadRef(const Manifest& m, const json& obj, const std::string& at,
                      const std::string& key, const MappedFile& data, const MappedFile& aux) {
  Ref r;
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

// The logical names of bitgpu's engine, by role.
struct Logical {
  std::string name;
  TensorRole role;
  int layer;
  std::string kind;  // binary, q4, q2, f32
};

std::vector<Logical> LogicalNames(const Arch& arch) {
  std::vector<Logical> out;
  constexpr std::pair<const char*, TensorRole> kLinears[] = {
      {"attn.q_proj", TensorRole::kQ},      {"attn.k_proj", TensorRole::kK},
      {"attn.v_proj", TensorRole::kV},      {"attn.o_proj", TensorRole::kO},
      {"mlp.gate_proj", TensorRole::kGate}, {"mlp.up_proj", TensorRole::kUp},
      {"mlp.down_proj", TensorRole::kDown}};
  constexpr std::pair<const char*, TensorRole> kNorms[] = {
      {"input_layernorm", TensorRole::kAttnNorm},
      {"post_attention_layernorm", TensorRole::kFfnNorm},
      {"attn.q_norm", TensorRole::kQNorm},
      {"attn.k_norm", TensorRole::kKNorm}};
  for (int l = 0; l < arch.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const auto& [name, role] : kLinears) out.push_back({p + name, role, l, "binary"});
    for (const auto& [name, role] : kNorms) out.push_back({p + name, role, l, "f32"});
  }
  out.push_back({"layers." + std::to_string(arch.layers) + ".final_norm_layernorm",
                 TensorRole::kFinalNorm, -1, "f32"});
  out.push_back({"embed_tokens", TensorRole::kEmbed, -1, "q4"});
  out.push_back({"lm_head", TensorRole::kHead, -1, "q2"});
  return out;
}

Expected<json> ConfigOf(const Manifest& m) {
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

// The tables a ref holds must be the recipe's.
Status CheckLut(const Manifest& m, const Ref& r, const uint8_t* want, size_t bytes,
                int64_t columns) {
  if (!r.aux) return m.Error(r.field + ".src", "must be \"aux\" (the tables load first)");
  if (r.dtype != "UINT8" || r.shape != std::vector<int64_t>{256, columns}) {
    return m.Error(r.field, "is " + r.dtype + " " + ShapeString(r.shape) +
                                ", expected UINT8 [256, " + std::to_string(columns) + "]");
  }
  if (r.len != bytes || std::memcmp(r.data, want, bytes) != 0) {
    return m.Error(r.field,
                   "is not the 1-bit recipe's table (sign bits to codes about the "
                   "midpoint); other tables are not read");
  }
  return Status::Ok();
}

struct Held {
  MappedFile data;
  MappedFile aux;
  std::vector<std::vector<uint8_t>> copies;
};

// Every byte of zero points `r` is `value` (the recipe's midpoints, packed).
Status CheckZeroPoints(const Manifest& m, const Ref& r, uint8_t value, const std::string& what) {
  if (r.dtype != "UINT8") return m.Error(r.field, "is " + r.dtype + ", expected UINT8");
  for (uint64_t i = 0; i < r.len; ++i) {
    if (r.data[i] != value) {
      return Unimplemented(m.path() + ": " + r.field + " byte " + std::to_string(i) + " is " +
                           std::to_string(r.data[i]) + ", not " + std::to_string(value) + " (" +
                           what + "); other zero points are not read");
    }
  }
  return Status::Ok();
}

// A planar tensor (an ONNX export's): sign bytes [rows, cols / 8] (LSB first, bit 1 = +1; the
// checked tgt2 and tgt4 turn them into the recipe's codes), scales [rows, cols / 128] f32 and zero
// points at the midpoints, so each weight is +-scale. A linear (binary) or the head (q2) becomes a
// q1 linear over the bytes as they are (quant/layout.h's kQ1 is this layout, unrotated); the
// embedding (q4) is converted to float32, which the embedding lookup reads.
Status ReadPlanar(const Manifest& m, const json& entry, const std::string& at, const Logical& l,
                  const std::string& name, int64_t rows, int64_t cols, Held& held,
                  std::vector<Ref>* refs, std::vector<TensorInfo>* infos,
                  std::map<std::string, std::string>* metadata) {
  const std::vector<int64_t> sign_shape = {rows, cols / 8};
  const std::vector<int64_t> scale_shape = {rows, cols / kBlock};
  GZ_ASSIGN_OR_RETURN(Ref weight, ReadRef(m, entry, at, "weight", held.data, held.aux));
  if (weight.dtype != "UINT8" || weight.shape != sign_shape) {
    return m.Error(weight.field, "is " + weight.dtype + " " + ShapeString(weight.shape) +
                                     ", expected UINT8 " + ShapeString(sign_shape) +
                                     " (planar sign bytes)");
  }
  GZ_ASSIGN_OR_RETURN(Ref scales, ReadRef(m, entry, at, "scales", held.data, held.aux));
  if (scales.dtype != "FLOAT" || scales.shape != scale_shape) {
    return m.Error(scales.field, "is " + scales.dtype + " " + ShapeString(scales.shape) +
                                     ", expected FLOAT " + ShapeString(scale_shape));
  }
  refs->push_back(weight);
  refs->push_back(scales);
  const bool embed = l.role == TensorRole::kEmbed;
  if (entry.contains("zp") || embed) {
    GZ_ASSIGN_OR_RETURN(Ref zp, ReadRef(m, entry, at, "zp", held.data, held.aux));
    refs->push_back(zp);
    if (embed) {
      GZ_RETURN_IF_ERROR(CheckZeroPoints(m, zp, 0x88, "two 4-bit 8s"));
    } else if (l.kind == "q2") {
      GZ_RETURN_IF_ERROR(CheckZeroPoints(m, zp, 0xaa, "four 2-bit 2s"));
    }  // a binary tensor's zero points are not read: its weights are the signs
  }
  const int64_t groups = cols / kBlock;
  auto scale = [&](int64_t row, int64_t group) {
    float v;
    std::memcpy(&v, scales.data + 4 * (row * groups + group), 4);
    return v;
  };
  if (embed) {
    std::vector<uint8_t>& copy = held.copies.emplace_back(rows * cols * sizeof(float));
    float* out = reinterpret_cast<float*>(copy.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float s = scale(r, c / kBlock);
        out[r * cols + c] = (weight.data[(r * cols + c) / 8] >> (c % 8)) & 1 ? s : -s;
      }
    }
    TensorInfo t;
    t.name = name;
    t.dtype = DType::kF32;
    t.shape = {rows, cols};
    t.data = copy.data();
    t.bytes = copy.size();
    t.file = m.path();
    infos->push_back(std::move(t));
    return Status::Ok();
  }
  TensorInfo codes;
  codes.name = name;
  codes.dtype = DType::kU8;
  codes.shape = sign_shape;
  codes.data = weight.data;
  codes.bytes = weight.len;
  codes.file = m.path();
  TensorInfo scale_info = codes;
  scale_info.name = name + quant::kScalesSuffix;
  scale_info.dtype = DType::kF32;
  scale_info.shape = scale_shape;
  scale_info.data = scales.data;
  scale_info.bytes = scales.len;
  if (reinterpret_cast<uintptr_t>(scales.data) % alignof(float) != 0) {
    std::vector<uint8_t>& copy = held.copies.emplace_back(scales.data, scales.data + scales.len);
    scale_info.data = copy.data();
  }
  infos->push_back(std::move(codes));
  infos->push_back(std::move(scale_info));
  (*metadata)[quant::kLinearKeyPrefix + name] = json{
      {"format", FormatName(Format::kQ1)},
      {"rows", rows},
      {"cols", cols},
      {"group", kBlock},
      {"rotated", false}}.dump();
  return Status::Ok();
}

}  // namespace

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
  GZ_ASSIGN_OR_RETURN(Manifest m, Manifest::Read(dir));
  return ConfigOf(m);
}

Expected<Arch> ReadBitgpuArch(const std::string& dir) {
  GZ_ASSIGN_OR_RETURN(Manifest m, Manifest::Read(dir));
  GZ_ASSIGN_OR_RETURN(json config, ConfigOf(m));
  return ParseArch(config, m.path() + ": arch");
}

Expected<BitgpuModel> OpenBitgpuModel(const std::string& dir,
                                      const std::function<bool(GgmlType)>& keep) {
  GZ_ASSIGN_OR_RETURN(Manifest m, Manifest::Read(dir));
  GZ_ASSIGN_OR_RETURN(json config, ConfigOf(m));
  BitgpuModel out;
  GZ_ASSIGN_OR_RETURN(out.arch, ParseArch(config, m.path() + ": arch"));
  const Arch& arch = out.arch;
  auto held = std::make_shared<Held>();
  for (const char* key : {"data_file", "aux_file"}) {
    GZ_ASSIGN_OR_RETURN(std::string name, m.String(m.root(), "", key));
    if (!PlainFileName(name)) {
      return m.Error(key, Quote(name) + " is not a file name inside the folder");
    }
    GZ_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(dir + "/" + name));
    (std::string(key) == "data_file" ? held->data : held->aux) = std::move(f);
  }

  std::vector<Ref> refs;  // every ref, for the overlap check
  GZ_ASSIGN_OR_RETURN(const json* luts, m.Member(m.root(), "", "luts", json::value_t::object));
  const auto tgt2 = BitgpuTgt2();
  const auto tgt4 = BitgpuTgt4();
  GZ_ASSIGN_OR_RETURN(Ref lut2, ReadRef(m, *luts, "luts", "tgt2", held->data, held->aux));
  GZ_RETURN_IF_ERROR(CheckLut(m, lut2, tgt2.data(), tgt2.size(), 2));
  GZ_ASSIGN_OR_RETURN(Ref lut4, ReadRef(m, *luts, "luts", "tgt4", held->data, held->aux));
  GZ_RETURN_IF_ERROR(CheckLut(m, lut4, tgt4.data(), tgt4.size(), 4));
  refs.push_back(lut2);
  refs.push_back(lut4);

  GZ_ASSIGN_OR_RETURN(const json* tensors,
                      m.Member(m.root(), "", "tensors", json::value_t::object));
  const std::vector<Logical> names = LogicalNames(arch);
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    const bool known = std::any_of(names.begin(), names.end(),
                                   [&](const Logical& l) { return l.name == it.key(); });
    if (!known && it.key() != "cos_cache" && it.key() != "sin_cache") {
      return Unimplemented(m.path() + ": tensors." + Quote(it.key()) + " has no place in a " +
                           std::to_string(arch.layers) + "-layer qwen3 model here");
    }
  }
  std::vector<TensorInfo> infos;
  // Read as a converted folder's header describes its linears (quant/linear_io.h).
  std::map<std::string, std::string> metadata = {{quant::kFormatVersionKey, quant::kFormatVersion}};
  Ref embed_ref;
  bool noticed = false;
  for (const Logical& l : names) {
    const std::string at = "tensors." + l.name;
    auto entry = tensors->find(l.name);
    if (entry == tensors->end()) return NotFound(m.path() + ": " + at + " is missing");
    if (!entry->is_object()) return m.Error(at, "is not an object");
    GZ_ASSIGN_OR_RETURN(std::string kind, m.String(*entry, at, "kind"));
    if (kind != l.kind) {
      return m.Error(at + ".kind", Quote(kind) + ", expected " + Quote(l.kind));
    }
    const std::vector<int64_t> shape = TensorShape(arch, l.role, l.layer);
    TensorInfo info;
    info.name = TensorName(arch, l.role, l.layer);
    info.shape = shape;
    info.file = m.path();
    if (kind == "f32") {
      GZ_ASSIGN_OR_RETURN(Ref r, ReadRef(m, *entry, at, "weight", held->data, held->aux));
      if (r.dtype != "FLOAT" || r.shape != shape) {
        return m.Error(r.field, "is " + r.dtype + " " + ShapeString(r.shape) + ", expected FLOAT " +
                                    ShapeString(shape));
      }
      info.dtype = DType::kF32;
      info.data = r.data;
      info.bytes = r.len;
      refs.push_back(r);
      infos.push_back(std::move(info));
      continue;
    }
    // binary, q4, q2: blocks of 128 through the recipe's table.
    const bool q4 = kind == "q4";
    GZ_ASSIGN_OR_RETURN(int64_t rows, m.Int(*entry, at, q4 ? "rows" : "N", 1, kMaxDim));
    GZ_ASSIGN_OR_RETURN(int64_t cols, m.Int(*entry, at, q4 ? "cols" : "K", 1, kMaxDim));
    if (rows != shape[0] || cols != shape[1]) {
      return m.Error(at, "is " + std::to_string(rows) + " x " + std::to_string(cols) +
                             ", the arch says " + ShapeString(shape));
    }
    GZ_ASSIGN_OR_RETURN(int64_t block, m.Int(*entry, at, "block", 1, kMaxDim));
    if (block != kBlock) {
      return m.Error(at + ".block", std::to_string(block) + " is not 128");
    }
    GZ_ASSIGN_OR_RETURN(int64_t bits, m.Int(*entry, at, "bits", 1, 8));
    if (bits != (q4 ? 4 : 2)) {
      return m.Error(at + ".bits", std::to_string(bits) + ", expected " + (q4 ? "4" : "2"));
    }
    GZ_ASSIGN_OR_RETURN(std::string lut, m.String(*entry, at, "lut"));
    if (lut != (q4 ? "tgt4" : "tgt2")) {
      return m.Error(at + ".lut", Quote(lut) + ", expected " + (q4 ? "\"tgt4\"" : "\"tgt2\""));
    }
    if (cols % kBlock != 0) {
      return m.Error(at, "has " + std::to_string(cols) + " columns, not whole blocks of 128");
    }
    if (!entry->contains("container")) {
      GZ_RETURN_IF_ERROR(
          ReadPlanar(m, *entry, at, l, info.name, rows, cols, *held, &refs, &infos, &metadata));
      continue;
    }
    GZ_ASSIGN_OR_RETURN(std::string container, m.String(*entry, at, "container"));
    if (container != "q1_0") {
      return m.Error(at + ".container", Quote(container) + " is not \"q1_0\"");
    }
    if (m.version() < 2) {
      return m.Error(at + ".container", "needs manifest version 2 (this one is 1)");
    }
    if (entry->contains("scales") || entry->contains("zp")) {
      return m.Error(at, "is a q1_0 container and carries scales or zp (its blocks hold them)");
    }
    GZ_ASSIGN_OR_RETURN(Ref r, ReadRef(m, *entry, at, "weight", held->data, held->aux));
    const std::vector<int64_t> blocks = {rows, cols / kBlock * kQ1_0Bytes};
    if (r.aux || r.dtype != "UINT8" || r.shape != blocks) {
      return m.Error(r.field, "is " + r.dtype + " " + ShapeString(r.shape) + " in " +
                                  (r.aux ? "aux" : "data") + ", expected UINT8 " +
                                  ShapeString(blocks) + " in data (Q1_0 blocks)");
    }
    if (l.role == TensorRole::kEmbed) embed_ref = r;
    if (l.role == TensorRole::kHead && arch.tied_head) {
      // Tied: the head reads the embedding's blocks.
      if (!r.SameBytes(embed_ref)) {
        return m.Error(r.field, "is not embed_tokens' bytes, but arch.tie_word_embeddings is true");
      }
      continue;
    }
    refs.push_back(r);
    info.bytes = r.len;
    if (keep && keep(GgmlType::kQ1_0)) {
      info.dtype = DType::kU8;
      info.shape = blocks;
      info.data = r.data;
      metadata[quant::kLinearKeyPrefix + info.name] =
          quant::GgmlLinearDescription(static_cast<uint32_t>(GgmlType::kQ1_0), rows, cols);
    } else {
      if (!noticed) {
        std::fprintf(stderr, "%s: Q1_0 tensors are converted to F32 at load (exactly)\n",
                     dir.c_str());
        noticed = true;
      }
      std::vector<uint8_t>& copy = held->copies.emplace_back(rows * cols * sizeof(float));
      GZ_RETURN_IF_ERROR(DequantizeBlocks(GgmlType::kQ1_0, r.data, r.len, rows * cols,
                                          reinterpret_cast<float*>(copy.data()),
                                          m.path() + ": " + at));
      info.dtype = DType::kF32;
      info.data = copy.data();
      info.bytes = copy.size();
    }
    infos.push_back(std::move(info));
  }

  // Refs share bytes only as the same range (a tied head); partial overlaps are invalid.
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) {
    return std::tie(a.aux, a.off, a.len) < std::tie(b.aux, b.off, b.len);
  });
  for (size_t i = 1; i < refs.size(); ++i) {
    const Ref& a = refs[i - 1];
    const Ref& b = refs[i];
    if (a.aux != b.aux || a.len == 0 || b.len == 0 || a.SameBytes(b)) continue;
    if (b.off < a.off + a.len) {
      return m.Error(b.field, "overlaps " + a.field + " (bytes [" + std::to_string(b.off) + ", +" +
                                  std::to_string(b.len) + ") and [" + std::to_string(a.off) +
                                  ", +" + std::to_string(a.len) + "))");
    }
  }
  GZ_ASSIGN_OR_RETURN(out.checkpoint,
                      Checkpoint::FromTensors(std::move(infos), held, dir, std::move(metadata)));
  return out;
}

}  // namespace gizllm
