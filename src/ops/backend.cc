#include "ops/backend.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/check.h"
#include "ops/kv_codes.h"

namespace gizllm {
namespace {
Status Bad(const char* op, const char* field, const std::string& why) {
  return InvalidArgument(std::string(op) + "." + field + ": " + why);
}
}  // namespace

std::vector<KvFormat> AllKvFormats() {
  std::vector<KvFormat> all = {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8};
  for (int keys : {8, 4, 2})
    for (int values : {8, 4, 2}) all.push_back(RotatedKv(keys, values));
  return all;
}

int KvFormatBytes(KvFormat f) {
  CHECK(!IsRotatedKv(f));
  return f == KvFormat::kF32 ? 4 : f == KvFormat::kF16 ? 2 : 1;
}

int64_t KvKeyBytes(KvFormat f, int head_dim) { return kv::CodeBytes(KvKeyBits(f), head_dim); }
int64_t KvValueBytes(KvFormat f, int head_dim) { return kv::CodeBytes(KvValueBits(f), head_dim); }

int KvFormatScaleBytes(KvFormat f, int head_dim) {
  return f == KvFormat::kQ8 ? 4 : IsRotatedKv(f) ? 8 * kv::Groups(head_dim) : 0;
}

std::string KvFormatName(KvFormat f) {
  if (IsRotatedKv(f)) {
    const int keys = KvKeyBits(f), values = KvValueBits(f);
    return keys == values ? std::to_string(keys)
                          : std::to_string(keys) + "/" + std::to_string(values);
  }
  switch (f) {
    case KvFormat::kF16:
      return "f16";
    case KvFormat::kQ8:
      return "q8";
    default:
      return "f32";
  }
}

Expected<KvBits> ParseKvBits(std::string_view text) {
  if (text == "f32") return KvBits{32, 32};
  if (text == "f16") return KvBits{16, 16};
  if (text == "q8") return KvBits{8, 8};
  auto bits = [](std::string_view part) {
    for (int b : {32, 16, 8, 4, 2})
      if (part == std::to_string(b)) return b;
    return 0;
  };
  const size_t slash = text.find('/');
  const int keys = bits(text.substr(0, slash));
  const int values = slash == std::string_view::npos ? keys : bits(text.substr(slash + 1));
  if (keys == 0 || values == 0) {
    return InvalidArgument("--kv " + std::string(text) +
                           ": expected auto, the bits of keys and values (32, 16, 8, 4 or 2), "
                           "keys/values bits such as 8/4, or f32, f16 or q8");
  }
  return KvBits{keys, values};
}

std::optional<KvFormat> KvFormatOf(KvBits bits) {
  if (bits.keys <= 8 && bits.values <= 8) return RotatedKv(bits.keys, bits.values);
  if (bits.keys != bits.values) return std::nullopt;
  if (bits.keys == 32) return KvFormat::kF32;
  if (bits.keys == 16) return KvFormat::kF16;
  return std::nullopt;
}

KvFormat AutoKvFormat(const std::vector<KvFormat>& candidates, const KvFit& fit) {
  CHECK(!candidates.empty());
  auto fits = [&](KvFormat f, int64_t contexts) {
    return fit.position_bytes(f) * fit.context * contexts <= fit.budget_bytes;
  };
  for (KvFormat f : candidates) {
    if (KvKeyBits(f) > 4 && KvValueBits(f) > 4 && fits(f, fit.slots)) return f;
  }
  for (KvFormat f : candidates) {
    if ((KvKeyBits(f) <= 4 || KvValueBits(f) <= 4) && fits(f, 1)) return f;
  }
  KvFormat smallest = candidates.front();
  for (KvFormat f : candidates) {
    if (fit.position_bytes(f) < fit.position_bytes(smallest)) smallest = f;
  }
  return smallest;
}

Expected<KvFormat> ChooseKvFormat(std::string_view text, const Backend& backend, const KvFit* fit) {
  if (text == "auto") {
    const KvFormat standard = backend.DefaultKvFormat();
    if (!fit) return standard;
    // From the default down, by bits (keys first): 16, 8, 8/4, 4, 4/2, 2 (q8 is not among them:
    // the rotated 8-bit pages take its place).
    std::vector<KvFormat> candidates;
    for (KvFormat f : AllKvFormats()) {
      const bool narrower = KvKeyBits(f) < KvKeyBits(standard) ||
                            (KvKeyBits(f) == KvKeyBits(standard) && f == standard);
      if (f != KvFormat::kQ8 && narrower && KvValueBits(f) <= KvKeyBits(f) &&
          backend.SupportsKvFormat(f)) {
        candidates.push_back(f);
      }
    }
    return AutoKvFormat(candidates, *fit);
  }
  GZ_ASSIGN_OR_RETURN(KvBits bits, ParseKvBits(text));
  const std::optional<KvFormat> format = KvFormatOf(bits);
  if (format && backend.SupportsKvFormat(*format)) return *format;
  std::string taken;
  for (KvFormat f : AllKvFormats()) {
    if (!backend.SupportsKvFormat(f)) continue;
    const std::string name = f == KvFormat::kF32   ? "32 (f32)"
                             : f == KvFormat::kF16 ? "16 (f16)"
                                                   : KvFormatName(f);
    taken += (taken.empty() ? "" : ", ") + name;
  }
  std::string what = bits.keys == bits.values ? std::to_string(bits.keys) + "-bit KV pages"
                                              : std::to_string(bits.keys) + "-bit keys and " +
                                                    std::to_string(bits.values) + "-bit values";
  if (!format) {
    return Unimplemented("--kv " + std::string(text) + ": " + what +
                         " (pages do not mix floats and codes: keys and values of 16 or 32 bits "
                         "take the same bits)");
  }
  return Unimplemented("--kv " + std::string(text) + ": " + what + " do not run on " +
                       backend.Describe() + "; it takes --kv " + taken);
}

Status EmbedParams::Check() const {
  if (!out) return Bad("Embed", "out", "null");
  if (!table || table->empty()) return Bad("Embed", "table", "null");
  if (!tokens && rows > 0) return Bad("Embed", "tokens", "null");
  if (rows < 0) return Bad("Embed", "rows", "negative");
  if (!std::isfinite(scale)) return Bad("Embed", "scale", "not finite");
  return Status::Ok();
}

Status RmsNormParams::Check() const {
  if (!out || !x) return Bad("RmsNorm", "out/x", "null");
  if (!weight) return Bad("RmsNorm", "weight", "null");
  if (rows < 0 || dim <= 0) return Bad("RmsNorm", "dim", "must be positive");
  return Status::Ok();
}

Status MatmulParams::Check() const {
  if (!x && rows > 0) return Bad("Matmul", "x", "null");
  if (outputs < 1 || outputs > kMaxOutputs) return Bad("Matmul", "outputs", "must be 1..3");
  for (int i = 0; i < outputs; ++i) {
    if (!w[i] || w[i]->empty()) return Bad("Matmul", "w", "null");
    if (!out[i]) return Bad("Matmul", "out", "null");
    if (w[i]->cols != w[0]->cols) return Bad("Matmul", "w", "outputs differ in cols");
  }
  if (accumulate && swiglu) return Bad("Matmul", "accumulate", "and swiglu together");
  if (accumulate && outputs != 1) return Bad("Matmul", "accumulate", "needs one output");
  if (accumulate && out[0] == x) return Bad("Matmul", "accumulate", "out aliases x");
  if (swiglu && (outputs != 2 || w[0]->rows != w[1]->rows))
    return Bad("Matmul", "swiglu", "needs two outputs of the same size");
  return Status::Ok();
}

Status RopeKvParams::Check() const {
  GZ_RETURN_IF_ERROR(q.Check());
  GZ_RETURN_IF_ERROR(k.Check());
  GZ_RETURN_IF_ERROR(kv.Check());
  if (k.x != kv.k) return Bad("RopeKv", "kv.k", "is not k.x");
  if (q.rows != k.rows || k.rows != kv.rows) return Bad("RopeKv", "rows", "differ");
  if (k.heads != kv.kv_heads || k.head_dim != kv.head_dim)
    return Bad("RopeKv", "k", "heads or head_dim differ from kv's");
  return Status::Ok();
}

Status RopeParams::Check() const {
  if (!x && rows > 0) return Bad("Rope", "x", "null");
  if (heads <= 0 || head_dim <= 0) return Bad("Rope", "heads", "must be positive");
  if (rotary_dims < 0 || rotary_dims > head_dim || rotary_dims % 2)
    return Bad("Rope", "rotary_dims", "must be even and <= head_dim");
  if (rotary_dims > 0 && (!inv_freq || !positions)) return Bad("Rope", "inv_freq", "null");
  return Status::Ok();
}

Status KvWriteParams::Check() const {
  if (!cache.keys || !cache.values) return Bad("KvWrite", "cache", "null");
  if (KvFormatScaleBytes(cache.format, head_dim) > 0 && (!cache.key_scales || !cache.value_scales))
    return Bad("KvWrite", "cache", "q8 or rotated pages without scales");
  if (IsRotatedKv(cache.format) && head_dim % 8 != 0)
    return Bad("KvWrite", "head_dim", "rotated pages need a multiple of 8");
  if (!table.pages || table.max_pages <= 0) return Bad("KvWrite", "table", "empty");
  if (rows > 0 && (!k || !v || !slots || !positions)) return Bad("KvWrite", "k/v", "null");
  if (kv_heads <= 0 || head_dim <= 0) return Bad("KvWrite", "kv_heads", "must be positive");
  return Status::Ok();
}

Status AttentionParams::Check() const {
  if (!out || !q) return Bad("Attention", "out/q", "null");
  if (!cache.keys || !cache.values) return Bad("Attention", "cache", "null");
  if (KvFormatScaleBytes(cache.format, head_dim) > 0 && (!cache.key_scales || !cache.value_scales))
    return Bad("Attention", "cache", "q8 or rotated pages without scales");
  if (IsRotatedKv(cache.format) && head_dim % 8 != 0)
    return Bad("Attention", "head_dim", "rotated pages need a multiple of 8");
  if (!table.pages || table.max_pages <= 0) return Bad("Attention", "table", "empty");
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads)
    return Bad("Attention", "heads", "must be a positive multiple of kv_heads");
  if (head_dim <= 0) return Bad("Attention", "head_dim", "must be positive");
  if (window < 0) return Bad("Attention", "window", "negative");
  if (!(softcap >= 0) || !std::isfinite(softcap))
    return Bad("Attention", "softcap", "must be a finite number >= 0");
  return Status::Ok();
}

Status GluParams::Check() const {
  if (n > 0 && (!out || !gate || !up)) return Bad("Glu", "out", "null");
  if (act != Activation::kSilu && act != Activation::kGeluTanh && act != Activation::kSigmoid)
    return Bad("Glu", "act", "unknown activation");
  return Status::Ok();
}

Status SoftcapParams::Check() const {
  if (n > 0 && !x) return Bad("Softcap", "x", "null");
  if (!(cap > 0) || !std::isfinite(cap)) return Bad("Softcap", "cap", "must be positive");
  return Status::Ok();
}

Status AddParams::Check() const {
  if (n > 0 && (!out || !x)) return Bad("Add", "out", "null");
  return Status::Ok();
}

Status GatherRowsParams::Check() const {
  if (count > 0 && (!out || !x || !index)) return Bad("GatherRows", "out", "null");
  if (dim <= 0) return Bad("GatherRows", "dim", "must be positive");
  return Status::Ok();
}

Status MoeFeedForwardParams::Check() const {
  const char* op = "MoeFeedForward";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (dim <= 0 || ffn <= 0) return Bad(op, "dim", "dim and ffn must be positive");
  if (experts <= 0) return Bad(op, "experts", "must be positive");
  if (top_k < 1 || top_k > experts) return Bad(op, "top_k", "must be in [1, experts]");
  if (!router || !gate || !up || !down) return Bad(op, "router", "weights null");
  if (rows > 0 && (!out || !x)) return Bad(op, "out", "null");
  if (out == x && rows > 0) return Bad(op, "out", "must not alias x");
  if (router->rows != experts || router->cols != dim) return Bad(op, "router", "shape");
  for (int e = 0; e < experts; ++e) {
    if (gate[e].rows != ffn || gate[e].cols != dim || up[e].rows != ffn || up[e].cols != dim ||
        down[e].rows != dim || down[e].cols != ffn)
      return Bad(op, "gate", "an expert's shape differs from [ffn, dim], [dim, ffn]");
  }
  if (shared_ffn < 0) return Bad(op, "shared_ffn", "must not be negative");
  if (shared_ffn > 0) {
    if (!shared_gate || !shared_up || !shared_down) return Bad(op, "shared_gate", "null");
    if (shared_gate->rows != shared_ffn || shared_gate->cols != dim ||
        shared_up->rows != shared_ffn || shared_up->cols != dim || shared_down->rows != dim ||
        shared_down->cols != shared_ffn)
      return Bad(op, "shared_gate", "shape differs from [shared_ffn, dim], [dim, shared_ffn]");
    if (shared_scale && (shared_scale->rows != 1 || shared_scale->cols != dim))
      return Bad(op, "shared_scale", "shape differs from [1, dim]");
  }
  return Status::Ok();
}

Status CausalConvParams::Check() const {
  const char* op = "CausalConv";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (channels <= 0) return Bad(op, "channels", "must be positive");
  if (row_stride < channels) return Bad(op, "row_stride", "must be at least channels");
  if (kernel < 2 || kernel > 64) return Bad(op, "kernel", "must be in [2, 64]");
  if (rows > 0 && (!x || !weight || !states || !slots || !positions)) return Bad(op, "x", "null");
  return Status::Ok();
}

Status L2NormParams::Check() const {
  const char* op = "L2Norm";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (heads <= 0 || dim <= 0) return Bad(op, "heads", "heads and dim must be positive");
  if (row_stride < static_cast<int64_t>(heads) * dim)
    return Bad(op, "row_stride", "must be at least heads * dim");
  if (!(eps > 0)) return Bad(op, "eps", "must be positive");
  if (rows > 0 && !x) return Bad(op, "x", "null");
  return Status::Ok();
}

Status GatedDeltaRuleParams::Check() const {
  const char* op = "GatedDeltaRule";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (k_heads <= 0 || v_heads <= 0 || k_dim <= 0 || v_dim <= 0)
    return Bad(op, "k_heads", "heads and dims must be positive");
  if (v_heads % k_heads != 0) return Bad(op, "v_heads", "must be a multiple of k_heads");
  if (qk_stride < static_cast<int64_t>(k_heads) * k_dim)
    return Bad(op, "qk_stride", "must be at least k_heads * k_dim");
  if (v_stride < static_cast<int64_t>(v_heads) * v_dim)
    return Bad(op, "v_stride", "must be at least v_heads * v_dim");
  if (ab_stride < v_heads) return Bad(op, "ab_stride", "must be at least v_heads");
  if (chunk < 1) return Bad(op, "chunk", "must be positive");
  if (!(scale > 0)) return Bad(op, "scale", "must be positive");
  if (rows > 0 &&
      (!out || !q || !k || !v || !a || !b || !a_log || !dt_bias || !states || !slots || !positions))
    return Bad(op, "out", "null");
  return Status::Ok();
}

Status GatedRmsNormParams::Check() const {
  const char* op = "GatedRmsNorm";
  if (groups < 0) return Bad(op, "groups", "must not be negative");
  if (dim <= 0) return Bad(op, "dim", "must be positive");
  if (!(eps > 0)) return Bad(op, "eps", "must be positive");
  if (groups > 0 && (!out || !x || !z || !weight)) return Bad(op, "out", "null");
  return Status::Ok();
}

Status LayerNormParams::Check() const {
  const char* op = "LayerNorm";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (dim <= 0) return Bad(op, "dim", "must be positive");
  if (!(eps > 0)) return Bad(op, "eps", "must be positive");
  if (rows > 0 && (!out || !x || !weight || !bias)) return Bad(op, "out", "null");
  return Status::Ok();
}

Status GeluParams::Check() const {
  if (n < 0) return Bad("Gelu", "n", "must not be negative");
  if (n > 0 && !x) return Bad("Gelu", "x", "null");
  return Status::Ok();
}

Status EncoderAttentionParams::Check() const {
  const char* op = "EncoderAttention";
  if (rows < 0) return Bad(op, "rows", "must not be negative");
  if (sequences < 0) return Bad(op, "sequences", "must not be negative");
  if (heads <= 0 || head_dim <= 0) return Bad(op, "heads", "must be positive");
  if (!(scale > 0)) return Bad(op, "scale", "must be positive");
  if (rows > 0 && (!out || !q || !k || !v || !starts)) return Bad(op, "out", "null");
  if (rows > 0 && sequences == 0) return Bad(op, "sequences", "rows without a sequence");
  return Status::Ok();
}

Status MeanRowsParams::Check() const {
  const char* op = "MeanRows";
  if (sequences < 0) return Bad(op, "sequences", "must not be negative");
  if (dim <= 0) return Bad(op, "dim", "must be positive");
  if (sequences > 0 && (!out || !x || !starts)) return Bad(op, "out", "null");
  return Status::Ok();
}

Status SampleParams::Check() const {
  if (rows > 0 && (!tokens || !logits || !params)) return Bad("Sample", "tokens", "null");
  if (rows < 0) return Bad("Sample", "rows", "must not be negative");
  if (vocab <= 0 || vocab >= (int64_t{1} << 31)) return Bad("Sample", "vocab", "out of range");
  return Status::Ok();
}

}  // namespace gizllm
