#include "model/bitgpu_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "formats/ggml_blocks.h"
#include "model/config.h"
#include "quant/linear_io.h"

namespace gizllm {
namespace {

using nlohmann::json;

constexpr int64_t kBlock = 128;     // inputs a block of every quantized tensor
constexpr int64_t kQ1_0Bytes = 18;  // a Q1_0 block: f16 scale, 16 sign bytes
constexpr int64_t kMaxDim = 1 << 24;

// Names and values come from the file: show at most 100 bytes of one.
std::string Quote(const std::string& s) {
  return "\"" + (s.size() > 100 ? s.substr(0, 100) + "..." : s) + "\"";
}

bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
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

// The tables a ref holds must be the recipe's.
Status CheckLut(const BitgpuManifest& m, const BitgpuRef& r, const uint8_t* want, size_t bytes,
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
Status CheckZeroPoints(const BitgpuManifest& m, const BitgpuRef& r, uint8_t value,
                       const std::string& what) {
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
Status ReadPlanar(const BitgpuManifest& m, const json& entry, const std::string& at,
                  const Logical& l, const std::string& name, int64_t rows, int64_t cols, Held& held,
                  std::vector<BitgpuRef>* refs, std::vector<TensorInfo>* infos,
                  std::map<std::string, std::string>* metadata) {
  const std::vector<int64_t> sign_shape = {rows, cols / 8};
  const std::vector<int64_t> scale_shape = {rows, cols / kBlock};
  GZ_ASSIGN_OR_RETURN(BitgpuRef weight, ReadBitgpuRef(m, entry, at, "weight", held.data, held.aux));
  if (weight.dtype != "UINT8" || weight.shape != sign_shape) {
    return m.Error(weight.field, "is " + weight.dtype + " " + ShapeString(weight.shape) +
                                     ", expected UINT8 " + ShapeString(sign_shape) +
                                     " (planar sign bytes)");
  }
  GZ_ASSIGN_OR_RETURN(BitgpuRef scales, ReadBitgpuRef(m, entry, at, "scales", held.data, held.aux));
  if (scales.dtype != "FLOAT" || scales.shape != scale_shape) {
    return m.Error(scales.field, "is " + scales.dtype + " " + ShapeString(scales.shape) +
                                     ", expected FLOAT " + ShapeString(scale_shape));
  }
  refs->push_back(weight);
  refs->push_back(scales);
  const bool embed = l.role == TensorRole::kEmbed;
  if (entry.contains("zp") || embed) {
    GZ_ASSIGN_OR_RETURN(BitgpuRef zp, ReadBitgpuRef(m, entry, at, "zp", held.data, held.aux));
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

Expected<BitgpuModel> OpenBitgpuModel(const std::string& dir,
                                      const std::function<bool(GgmlType)>& keep) {
  GZ_ASSIGN_OR_RETURN(BitgpuManifest m, BitgpuManifest::Read(dir));
  GZ_ASSIGN_OR_RETURN(json config, BitgpuConfigOf(m));
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

  std::vector<BitgpuRef> refs;  // every ref, for the overlap check
  GZ_ASSIGN_OR_RETURN(const json* luts, m.Member(m.root(), "", "luts", json::value_t::object));
  const auto tgt2 = BitgpuTgt2();
  const auto tgt4 = BitgpuTgt4();
  GZ_ASSIGN_OR_RETURN(BitgpuRef lut2,
                      ReadBitgpuRef(m, *luts, "luts", "tgt2", held->data, held->aux));
  GZ_RETURN_IF_ERROR(CheckLut(m, lut2, tgt2.data(), tgt2.size(), 2));
  GZ_ASSIGN_OR_RETURN(BitgpuRef lut4,
                      ReadBitgpuRef(m, *luts, "luts", "tgt4", held->data, held->aux));
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
  BitgpuRef embed_ref;
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
      GZ_ASSIGN_OR_RETURN(BitgpuRef r,
                          ReadBitgpuRef(m, *entry, at, "weight", held->data, held->aux));
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
    GZ_ASSIGN_OR_RETURN(BitgpuRef r, ReadBitgpuRef(m, *entry, at, "weight", held->data, held->aux));
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
  std::sort(refs.begin(), refs.end(), [](const BitgpuRef& a, const BitgpuRef& b) {
    return std::tie(a.aux, a.off, a.len) < std::tie(b.aux, b.off, b.len);
  });
  for (size_t i = 1; i < refs.size(); ++i) {
    const BitgpuRef& a = refs[i - 1];
    const BitgpuRef& b = refs[i];
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
