#include "model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "model/weights.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// z-lab's build_target_layer_ids: one draft layer reads the middle layer; more spread from layer
// 1 to layer targets - 3.
std::vector<int> DefaultTargetLayers(int targets, int drafts) {
  if (drafts == 1) return {targets / 2};
  std::vector<int> ids;
  const double span = targets - 4;
  for (int i = 0; i < drafts; ++i) {
    ids.push_back(static_cast<int>(std::nearbyint(1 + i * span / (drafts - 1))));
  }
  return ids;
}

// dot(a, b) over n floats in 16 independent sums (so that the compiler vectorizes it), for the
// widest vectors the CPU has.
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2,fma", "default")))
#endif
float Dot(const float* a, const float* b, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 16; ++j) sum += lanes[j];
  return sum;
}

// y[j] = dot(x, w + j * n) for four rows of w at once (x read once for the four).
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2,fma", "default")))
#endif
void Dot4(const float* x, const float* w, int64_t n, float* y) {
  float lanes[4][16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int r = 0; r < 4; ++r) {
      for (int j = 0; j < 16; ++j) lanes[r][j] += x[i + j] * w[r * n + i + j];
    }
  }
  for (int r = 0; r < 4; ++r) {
    float sum = 0.0f;
    for (int64_t k = i; k < n; ++k) sum += x[k] * w[r * n + k];
    for (int j = 0; j < 16; ++j) sum += lanes[r][j];
    y[r] = sum;
  }
}

void RmsNorm(const float* x, int64_t n, int dim, const float* w, float eps, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* v = x + r * dim;
    float sum = 0.0f;
    for (int i = 0; i < dim; ++i) sum += v[i] * v[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    for (int i = 0; i < dim; ++i) out[r * dim + i] = v[i] * inv * w[i];
  }
}

// Multiply-adds below which a product runs on the calling thread.
constexpr int64_t kSerialWork = int64_t{1} << 20;

// What the drafter keeps of one sequence: each layer's keys (normed, rotated at their
// positions) and values, layer by layer, [positions, kv_heads * head_dim] each.
struct DFlashContext : BlockDrafter::Context {
  std::vector<int64_t> positions;
  std::vector<std::vector<float>> k, v;
};

}  // namespace

struct DFlashDrafter::Layer {
  std::vector<float> in_norm, post_norm, q, k, v, o, q_norm, k_norm, gate, up, down;
};

Expected<DFlashConfig> ReadDFlashConfig(const std::string& dir, const Arch& target) {
  const std::string path = (fs::path(dir) / "config.json").string();
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json c = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) return InvalidArgument(path + ": not a JSON object");
  auto bad = [&](const std::string& field, const std::string& why) {
    return InvalidArgument(path + ": " + field + " " + why);
  };
  bool dflash = false;
  if (c.contains("architectures") && c["architectures"].is_array()) {
    for (const json& a : c["architectures"]) dflash |= a.is_string() && a == "DFlashDraftModel";
  }
  if (!dflash) return bad("architectures", "does not name DFlashDraftModel: not a DFlash drafter");
  auto integer = [&](const json& o, const std::string& field, int64_t low, int64_t high,
                     const std::string& name) -> Expected<int64_t> {
    if (!o.contains(field) || !o[field].is_number_integer()) {
      return bad(name, "is missing or not an integer");
    }
    const int64_t v = o[field].get<int64_t>();
    if (v < low || v > high) {
      return bad(name, "is " + std::to_string(v) + ", expected " + std::to_string(low) + " to " +
                           std::to_string(high));
    }
    return v;
  };
  DFlashConfig d;
  GZ_ASSIGN_OR_RETURN(int64_t dim, integer(c, "hidden_size", 1, 1 << 16, "hidden_size"));
  GZ_ASSIGN_OR_RETURN(int64_t layers, integer(c, "num_hidden_layers", 1, 256, "num_hidden_layers"));
  GZ_ASSIGN_OR_RETURN(int64_t heads,
                      integer(c, "num_attention_heads", 1, 1024, "num_attention_heads"));
  GZ_ASSIGN_OR_RETURN(int64_t kv_heads,
                      integer(c, "num_key_value_heads", 1, heads, "num_key_value_heads"));
  GZ_ASSIGN_OR_RETURN(int64_t ffn,
                      integer(c, "intermediate_size", 1, 1 << 20, "intermediate_size"));
  GZ_ASSIGN_OR_RETURN(int64_t block, integer(c, "block_size", 2, 64, "block_size"));
  d.dim = static_cast<int>(dim), d.layers = static_cast<int>(layers);
  d.heads = static_cast<int>(heads), d.kv_heads = static_cast<int>(kv_heads);
  d.ffn = static_cast<int>(ffn), d.block_size = static_cast<int32_t>(block);
  if (heads % kv_heads != 0) {
    return bad("num_attention_heads",
               "(" + std::to_string(heads) + ") is not a multiple of num_key_value_heads");
  }
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    GZ_ASSIGN_OR_RETURN(int64_t hd, integer(c, "head_dim", 2, 1024, "head_dim"));
    d.head_dim = static_cast<int>(hd);
  } else {
    d.head_dim = static_cast<int>(dim / heads);
  }
  if (d.head_dim % 2 != 0) return bad("head_dim", "is odd");
  if (c.contains("rms_norm_eps") && c["rms_norm_eps"].is_number()) {
    d.eps = c["rms_norm_eps"].get<float>();
  }
  const json* rope = &c;
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    rope = &c["rope_parameters"];
  }
  if (rope->contains("rope_theta") && (*rope)["rope_theta"].is_number()) {
    d.rope_theta = (*rope)["rope_theta"].get<double>();
  }
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!c.contains(key) || !c[key].is_object()) continue;
    const json& s = c[key];
    const std::string type = s.value("rope_type", s.value("type", std::string("default")));
    if (type != "default") return Unimplemented(path + ": " + key + " of type " + type);
  }
  if (c.value("attention_bias", false)) return Unimplemented(path + ": attention_bias true");
  if (c.value("hidden_act", std::string("silu")) != "silu") {
    return Unimplemented(path + ": hidden_act " + c["hidden_act"].dump() + " (silu only)");
  }
  if (c.value("use_sliding_window", false)) {
    return Unimplemented(path + ": use_sliding_window true (sliding-window draft layers)");
  }
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    for (size_t i = 0; i < c["layer_types"].size(); ++i) {
      if (c["layer_types"][i] != "full_attention") {
        return Unimplemented(path + ": layer_types[" + std::to_string(i) + "] is " +
                             c["layer_types"][i].dump() + " (full_attention only)");
      }
    }
  }
  if (!c.contains("dflash_config") || !c["dflash_config"].is_object()) {
    return bad("dflash_config", "is missing or not an object");
  }
  const json& f = c["dflash_config"];
  if (f.value("causal", false)) return Unimplemented(path + ": dflash_config.causal true");
  GZ_ASSIGN_OR_RETURN(int64_t mask, integer(f, "mask_token_id", 0, target.vocab - 1,
                                            "dflash_config.mask_token_id (of the model's "
                                            "vocabulary of " +
                                                std::to_string(target.vocab) + ")"));
  d.mask_token = static_cast<int32_t>(mask);
  d.num_target_layers = target.layers;
  if (c.contains("num_target_layers")) {
    GZ_ASSIGN_OR_RETURN(int64_t t,
                        integer(c, "num_target_layers", 1, 1 << 12, "num_target_layers"));
    if (t != target.layers) {
      return bad("num_target_layers", "is " + std::to_string(t) + ", but the model has " +
                                          std::to_string(target.layers) +
                                          " layers: the drafter was made for another model");
    }
  }
  if (f.contains("target_layer_ids")) {
    if (!f["target_layer_ids"].is_array() || f["target_layer_ids"].empty()) {
      return bad("dflash_config.target_layer_ids", "is not a list of layers");
    }
    for (size_t i = 0; i < f["target_layer_ids"].size(); ++i) {
      const json& v = f["target_layer_ids"][i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= target.layers) {
        return bad(
            "dflash_config.target_layer_ids[" + std::to_string(i) + "]",
            "is " + v.dump() + ", not a layer of the model's " + std::to_string(target.layers));
      }
      d.target_layer_ids.push_back(v.get<int>());
    }
  } else {
    d.target_layer_ids = DefaultTargetLayers(target.layers, d.layers);
  }
  if (d.dim != target.dim) {
    return bad("hidden_size", "is " + std::to_string(d.dim) + ", but the model's is " +
                                  std::to_string(target.dim));
  }
  return d;
}

DFlashDrafter::~DFlashDrafter() = default;

Expected<std::unique_ptr<DFlashDrafter>> DFlashDrafter::Open(const std::string& dir, Runner* target,
                                                             int threads) {
  const Arch& arch = target->arch();
  GZ_ASSIGN_OR_RETURN(DFlashConfig config, ReadDFlashConfig(dir, arch));
  GZ_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(dir));
  auto drafter = std::unique_ptr<DFlashDrafter>(new DFlashDrafter());
  drafter->config_ = config;
  drafter->target_ = target;
  // Layer id i reads transformers' hidden_states[i + 1], the output of layer i; the last layer's
  // entry there is after the final norm (last_hidden_state), so a drafter that reads the last
  // layer reads it normed (Hidden's layers + 1).
  for (int id : config.target_layer_ids) {
    drafter->feature_layers_.push_back(id + 1 == arch.layers ? arch.layers + 1 : id + 1);
  }
  // A tensor as float32, of the shape the config gives (names with or without "model.").
  auto read = [&](const std::string& name, std::vector<int64_t> shape,
                  std::vector<float>* out) -> Status {
    const std::string found = ckpt.Find(name) || !ckpt.Find("model." + name) ? name
                                                                              : "model." + name;
    GZ_ASSIGN_OR_RETURN(*out, ReadVector(ckpt, dir, found, shape));
    return Status::Ok();
  };
  const int64_t dim = config.dim, hd = config.head_dim, q = config.heads * hd,
                kv = config.kv_heads * hd, ffn = config.ffn;
  const int64_t features = static_cast<int64_t>(config.target_layer_ids.size()) * dim;
  GZ_RETURN_IF_ERROR(read("fc.weight", {dim, features}, &drafter->fc_));
  GZ_RETURN_IF_ERROR(read("hidden_norm.weight", {dim}, &drafter->hidden_norm_));
  GZ_RETURN_IF_ERROR(read("norm.weight", {dim}, &drafter->norm_));
  drafter->layers_.resize(config.layers);
  for (int l = 0; l < config.layers; ++l) {
    Layer& L = drafter->layers_[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    GZ_RETURN_IF_ERROR(read(p + "input_layernorm.weight", {dim}, &L.in_norm));
    GZ_RETURN_IF_ERROR(read(p + "post_attention_layernorm.weight", {dim}, &L.post_norm));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.q_proj.weight", {q, dim}, &L.q));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.k_proj.weight", {kv, dim}, &L.k));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.v_proj.weight", {kv, dim}, &L.v));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.o_proj.weight", {dim, q}, &L.o));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.q_norm.weight", {hd}, &L.q_norm));
    GZ_RETURN_IF_ERROR(read(p + "self_attn.k_norm.weight", {hd}, &L.k_norm));
    GZ_RETURN_IF_ERROR(read(p + "mlp.gate_proj.weight", {ffn, dim}, &L.gate));
    GZ_RETURN_IF_ERROR(read(p + "mlp.up_proj.weight", {ffn, dim}, &L.up));
    GZ_RETURN_IF_ERROR(read(p + "mlp.down_proj.weight", {dim, ffn}, &L.down));
  }
  // Qwen3's rotary frequencies as transformers computes them in float32.
  for (int64_t i = 0; i < hd / 2; ++i) {
    drafter->inv_freq_.push_back(static_cast<float>(
        1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / static_cast<double>(hd))));
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  drafter->pool_ = std::make_unique<ThreadPool>(threads);
  return drafter;
}

int64_t DFlashDrafter::Parameters() const {
  int64_t n = static_cast<int64_t>(fc_.size() + hidden_norm_.size() + norm_.size());
  for (const Layer& L : layers_) {
    n += static_cast<int64_t>(L.in_norm.size() + L.post_norm.size() + L.q.size() + L.k.size() +
                              L.v.size() + L.o.size() + L.q_norm.size() + L.k_norm.size() +
                              L.gate.size() + L.up.size() + L.down.size());
  }
  return n;
}

void DFlashDrafter::Linear(const float* x, int64_t n, const std::vector<float>& w, int64_t out,
                           int64_t in, float* y) {
  auto rows = [&](int64_t o0, int64_t o1, int) {
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * in;
      int64_t o = o0;
      for (; o + 4 <= o1; o += 4) Dot4(xr, w.data() + o * in, in, y + r * out + o);
      for (; o < o1; ++o) y[r * out + o] = Dot(xr, w.data() + o * in, in);
    }
  };
  // A small product on the calling thread: waking the pool costs more than it saves.
  if (n * out * in < kSerialWork) {
    rows(0, out, 0);
  } else {
    pool_->ParallelFor(out, 16, rows);
  }
}

// rotate_half over each head of x [n, heads * head_dim] at the rows' positions.
void DFlashDrafter::Rope(float* x, int64_t n, int heads, const int64_t* positions) const {
  const int hd = config_.head_dim, half = hd / 2;
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[r]) * inv_freq_[i];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int h = 0; h < heads; ++h) {
        float* v = x + (r * heads + h) * hd;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

std::unique_ptr<BlockDrafter::Context> DFlashDrafter::NewContext() const {
  auto c = std::make_unique<DFlashContext>();
  c->k.resize(config_.layers);
  c->v.resize(config_.layers);
  return c;
}

Status DFlashDrafter::Extend(Context& context, std::span<const int64_t> positions,
                             const float* features) {
  auto& ctx = static_cast<DFlashContext&>(context);
  if (positions.empty()) return Status::Ok();
  for (size_t i = 1; i < positions.size(); ++i) {
    if (positions[i] <= positions[i - 1]) {
      return InvalidArgument("DFlash context: positions must ascend");
    }
  }
  const int64_t kv = static_cast<int64_t>(config_.kv_heads) * config_.head_dim;
  // Drop what the context held at the first new position and after.
  const size_t keep = static_cast<size_t>(
      std::lower_bound(ctx.positions.begin(), ctx.positions.end(), positions[0]) -
      ctx.positions.begin());
  ctx.positions.resize(keep);
  for (int l = 0; l < config_.layers; ++l) {
    ctx.k[l].resize(keep * kv);
    ctx.v[l].resize(keep * kv);
  }
  const int64_t n = static_cast<int64_t>(positions.size()), dim = config_.dim;
  const int64_t in = static_cast<int64_t>(feature_layers_.size()) * dim;
  // Scratch kept between calls (a vector of more than 128 KiB is a fresh mapping each time).
  std::vector<float>&c = scratch_[0], &k = scratch_[1], &v = scratch_[2];
  c.resize(n * dim), k.resize(n * kv), v.resize(n * kv);
  Linear(features, n, fc_, dim, in, c.data());
  RmsNorm(c.data(), n, config_.dim, hidden_norm_.data(), config_.eps, c.data());
  for (int l = 0; l < config_.layers; ++l) {
    const Layer& L = layers_[l];
    Linear(c.data(), n, L.k, kv, dim, k.data());
    Linear(c.data(), n, L.v, kv, dim, v.data());
    RmsNorm(k.data(), n * config_.kv_heads, config_.head_dim, L.k_norm.data(), config_.eps,
            k.data());
    Rope(k.data(), n, config_.kv_heads, positions.data());
    ctx.k[l].insert(ctx.k[l].end(), k.begin(), k.end());
    ctx.v[l].insert(ctx.v[l].end(), v.begin(), v.end());
  }
  ctx.positions.insert(ctx.positions.end(), positions.begin(), positions.end());
  return Status::Ok();
}

Status DFlashDrafter::Draft(std::span<Context* const> contexts, std::span<const int32_t> last,
                            std::span<const int64_t> positions, int32_t count, int32_t* tokens) {
  const int64_t S = static_cast<int64_t>(contexts.size());
  if (last.size() != contexts.size() || positions.size() != contexts.size()) {
    return InvalidArgument("DFlash draft: one newest token and position a sequence");
  }
  if (count < 1 || count > MostDrafts()) {
    return InvalidArgument("DFlash draft: " + std::to_string(count) + " drafts, expected 1 to " +
                           std::to_string(MostDrafts()));
  }
  if (S == 0) return Status::Ok();
  const int64_t B = config_.block_size, n = S * B, dim = config_.dim;
  const int hd = config_.head_dim, heads = config_.heads, kvh = config_.kv_heads;
  const int64_t q_width = static_cast<int64_t>(heads) * hd, kv = static_cast<int64_t>(kvh) * hd;
  std::vector<int32_t> block(n, config_.mask_token);
  std::vector<int64_t> pos(n);
  for (int64_t s = 0; s < S; ++s) {
    block[s * B] = last[s];
    for (int64_t j = 0; j < B; ++j) pos[s * B + j] = positions[s] + j;
  }
  std::vector<float>&h = scratch_[0], &x = scratch_[1], &qb = scratch_[2], &kb = scratch_[3],
                     &vb = scratch_[4], &attn = scratch_[5], &t = scratch_[6], &gate = scratch_[7],
                     &up = scratch_[8];
  h.resize(n * dim), x.resize(n * dim), qb.resize(n * q_width), kb.resize(n * kv);
  vb.resize(n * kv), attn.resize(n * q_width), t.resize(n * dim), gate.resize(n * config_.ffn);
  up.resize(n * config_.ffn);
  GZ_RETURN_IF_ERROR(target_->EmbedTokens(block, h.data()));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int l = 0; l < config_.layers; ++l) {
    const Layer& L = layers_[l];
    RmsNorm(h.data(), n, config_.dim, L.in_norm.data(), config_.eps, x.data());
    Linear(x.data(), n, L.q, q_width, dim, qb.data());
    Linear(x.data(), n, L.k, kv, dim, kb.data());
    Linear(x.data(), n, L.v, kv, dim, vb.data());
    RmsNorm(qb.data(), n * heads, hd, L.q_norm.data(), config_.eps, qb.data());
    RmsNorm(kb.data(), n * kvh, hd, L.k_norm.data(), config_.eps, kb.data());
    Rope(qb.data(), n, heads, pos.data());
    Rope(kb.data(), n, kvh, pos.data());
    // Each block row attends to its sequence's context and to its whole block (no mask).
    int64_t context_rows = 0;
    for (Context* c : contexts) {
      context_rows += static_cast<int64_t>(static_cast<const DFlashContext*>(c)->positions.size());
    }
    const auto attend = [&](int64_t t0, int64_t t1, int) {
      std::vector<float> scores;
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t s = task / heads;
        const int head = static_cast<int>(task % heads), g = head / (heads / kvh);
        const auto& ctx = static_cast<const DFlashContext&>(*contexts[s]);
        const int64_t m = static_cast<int64_t>(ctx.positions.size());
        scores.resize(m + B);
        for (int64_t j = 0; j < B; ++j) {
          const float* qv = qb.data() + (s * B + j) * q_width + head * hd;
          float top = -INFINITY;
          for (int64_t c = 0; c < m + B; ++c) {
            const float* kv_row = c < m ? ctx.k[l].data() + c * kv + g * hd
                                        : kb.data() + (s * B + c - m) * kv + g * hd;
            scores[c] = Dot(qv, kv_row, hd) * scale;
            top = std::max(top, scores[c]);
          }
          float total = 0.0f;
          for (int64_t c = 0; c < m + B; ++c) total += scores[c] = std::exp(scores[c] - top);
          float* out = attn.data() + (s * B + j) * q_width + head * hd;
          std::fill(out, out + hd, 0.0f);
          for (int64_t c = 0; c < m + B; ++c) {
            const float* v_row = c < m ? ctx.v[l].data() + c * kv + g * hd
                                       : vb.data() + (s * B + c - m) * kv + g * hd;
            const float p = scores[c] / total;
            for (int i = 0; i < hd; ++i) out[i] += p * v_row[i];
          }
        }
      }
    };
    if ((context_rows + S * B) * B * q_width * 2 < kSerialWork) {
      attend(0, S * heads, 0);
    } else {
      pool_->ParallelFor(S * heads, 1, attend);
    }
    Linear(attn.data(), n, L.o, dim, q_width, t.data());
    for (int64_t i = 0; i < n * dim; ++i) h[i] += t[i];
    RmsNorm(h.data(), n, config_.dim, L.post_norm.data(), config_.eps, x.data());
    Linear(x.data(), n, L.gate, config_.ffn, dim, gate.data());
    Linear(x.data(), n, L.up, config_.ffn, dim, up.data());
    for (size_t i = 0; i < gate.size(); ++i) {
      const float a = gate[i];
      gate[i] = a / (1.0f + std::exp(-a)) * up[i];
    }
    Linear(gate.data(), n, L.down, dim, config_.ffn, t.data());
    for (int64_t i = 0; i < n * dim; ++i) h[i] += t[i];
  }
  // Rows 1 .. count of each block through the final norm and the target's head.
  std::vector<float>& rows = scratch_[1];
  rows.resize(S * count * dim);
  for (int64_t s = 0; s < S; ++s) {
    RmsNorm(h.data() + (s * B + 1) * dim, count, config_.dim, norm_.data(), config_.eps,
            rows.data() + s * count * dim);
  }
  const int64_t vocab = target_->arch().vocab;
  std::vector<float>& logits = scratch_[9];
  logits.resize(S * count * vocab);
  GZ_RETURN_IF_ERROR(target_->HeadLogits(rows.data(), S * count, logits.data()));
  for (int64_t r = 0; r < S * count; ++r) {
    const float* lr = logits.data() + r * vocab;
    tokens[r] = static_cast<int32_t>(std::max_element(lr, lr + vocab) - lr);
  }
  return Status::Ok();
}

}  // namespace gizllm
