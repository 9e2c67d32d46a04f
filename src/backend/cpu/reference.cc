#include "backend/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/kv_codes.h"

namespace gizllm {

float ReferenceWeightAt(const Weight& w, int64_t row, int64_t col) {
  int64_t i = row * w.cols + col;
  switch (w.format) {
    case Format::kF32:
      return static_cast<const float*>(w.data)[i];
    case Format::kF16:
      return F16ToF32(static_cast<const uint16_t*>(w.data)[i]);
    case Format::kBf16:
      return Bf16ToF32(static_cast<const uint16_t*>(w.data)[i]);
    default:
      break;
  }
  CHECK(false && "ReferenceWeightAt: the weight's format is not plain");
  return 0.0f;
}

void ReferenceEmbed(const EmbedParams& p) {
  const Weight& t = *p.table;
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t token = p.tokens[r];
    CHECK(token >= 0 && token < t.rows);
    for (int64_t c = 0; c < t.cols; ++c)
      p.out[r * t.cols + c] = ReferenceWeightAt(t, token, c) * p.scale;
  }
}

void ReferenceRmsNorm(const RmsNormParams& p) {
  std::vector<double> sum(p.dim);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    float* out = p.out + r * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) {
      if (p.residual) {
        float* res = p.residual + r * p.dim;
        res[i] = res[i] + x[i];
        sum[i] = res[i];
      } else {
        sum[i] = x[i];
      }
    }
    double ss = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) ss += sum[i] * sum[i];
    double inv = 1.0 / std::sqrt(ss / p.dim + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      out[i] = static_cast<float>(sum[i] * inv * (static_cast<double>(p.weight[i]) + p.offset));
    }
  }
}

void ReferenceMatmul(const MatmulParams& p) {
  for (int o = 0; o < p.outputs; ++o) {
    const Weight& w = *p.w[o];
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = p.x + r * w.cols;
      for (int64_t n = 0; n < w.rows; ++n) {
        double acc = p.bias[o] ? p.bias[o][n] : 0.0;
        for (int64_t c = 0; c < w.cols; ++c) {
          acc += static_cast<double>(x[c]) * ReferenceWeightAt(w, n, c);
        }
        p.out[o][r * w.rows + n] = static_cast<float>(acc);
      }
    }
  }
}

void ReferenceRope(const RopeParams& p) {
  const int half = p.rotary_dims / 2;
  std::vector<double> v(p.head_dim);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.heads; ++h) {
      float* x = p.x + (r * p.heads + h) * p.head_dim;
      if (p.norm) {
        double ss = 0.0;
        for (int i = 0; i < p.head_dim; ++i) ss += static_cast<double>(x[i]) * x[i];
        double inv = 1.0 / std::sqrt(ss / p.head_dim + p.norm_eps);
        for (int i = 0; i < p.head_dim; ++i) x[i] = static_cast<float>(x[i] * inv * p.norm[i]);
      }
      for (int i = 0; i < p.head_dim; ++i) v[i] = x[i];
      for (int i = 0; i < half; ++i) {
        float angle = static_cast<float>(p.positions[r]) * p.inv_freq[i];
        double c = std::cos(angle);
        double s = std::sin(angle);
        x[i] = static_cast<float>(v[i] * c - v[i + half] * s);
        x[i + half] = static_cast<float>(v[i + half] * c + v[i] * s);
      }
    }
  }
}

namespace {
// Offset of (position, kv head 0) of a slot in a KV layer, in floats.
int64_t KvOffset(const PageTable& table, int32_t slot, int32_t position, int kv_heads,
                 int head_dim) {
  int32_t block = position / kPage;
  CHECK(block < table.max_pages);
  int64_t page = table.pages[static_cast<int64_t>(slot) * table.max_pages + block];
  CHECK(page >= 0);
  return ((page * kPage + position % kPage) * kv_heads) * head_dim;
}

// Element i of a KV layer's keys or values (with their scales for q8), as float.
float KvAt(const void* data, const float* scales, KvFormat format, int64_t i, int head_dim) {
  switch (format) {
    case KvFormat::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case KvFormat::kQ8:
      return static_cast<float>(static_cast<const int8_t*>(data)[i]) * scales[i / head_dim];
    default:
      return static_cast<const float*>(data)[i];
  }
}

// q8: one kv head's vector x [n] at element `at` (a multiple of n) as codes round(x * 127 /
// max|x|), ties to even, and scale max|x| / 127; a zero vector has scale 0, one with a NaN or an
// infinity codes 0 and scale NaN.
void KvSetQ8(void* data, float* scales, int64_t at, const float* x, int n) {
  float top = 0.0f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    top = std::max(top, std::fabs(x[i]));
  }
  auto* q = static_cast<int8_t*>(data) + at;
  const float inv = top > 0.0f ? 127.0f / top : 0.0f;
  for (int i = 0; i < n; ++i) {
    q[i] = finite ? static_cast<int8_t>(std::nearbyint(x[i] * inv)) : int8_t{0};
  }
  scales[at / n] = finite ? top / 127.0f : std::numeric_limits<float>::quiet_NaN();
}
// f16: rounded to nearest, saturated at +-65504 (the largest finite float16); a NaN stays NaN.
void KvSet(void* data, KvFormat format, int64_t i, float v) {
  if (format == KvFormat::kF16) {
    static_cast<uint16_t*>(data)[i] = F32ToF16(v > 65504.0f    ? 65504.0f
                                               : v < -65504.0f ? -65504.0f
                                                               : v);
  } else {
    static_cast<float*>(data)[i] = v;
  }
}

// Entry (i, j) of the rotation R of ops/kv_codes.h, from its definition: block diagonal, the
// normalized Walsh-Hadamard matrix (entry (a, b): (-1)^popcount(a & b) / sqrt(block)) times the
// diagonal of signs.
double RotationEntry(int i, int j, int head_dim) {
  const int block = kv::RotationBlock(head_dim);
  if (i / block != j / block) return 0.0;
  const bool odd = __builtin_popcount((i % block) & (j % block)) & 1;
  return ((odd != kv::SignFlipped(j)) ? -1.0 : 1.0) / std::sqrt(static_cast<double>(block));
}

// y = R x, or with `inverse`, y = R^T x.
std::vector<double> RotateExact(const double* x, int n, bool inverse) {
  std::vector<double> y(n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double r = inverse ? RotationEntry(j, i, n) : RotationEntry(i, j, n);
      if (r != 0.0) y[i] += r * x[j];  // (other blocks' NaNs stay there)
    }
  }
  return y;
}

// The 4-bit code of the level (kv::kLevels4) nearest t.
int Nearest4(double t) {
  int best = 0;
  for (int c = 1; c < 16; ++c) {
    if (std::fabs(t - kv::kLevels4[c]) < std::fabs(t - kv::kLevels4[best])) best = c;
  }
  return best;
}

// A group y [n] (finite, not all equal) as 4-bit codes (ops/kv_codes.h Quantize4), in double:
// from each of kv::kStarts4 starts (min the middle of the range, step its half over the top
// level, narrowed by kv::kStartStep4 a start), kv::kFitRounds rounds of (nearest levels;
// least-squares step and min); the pair of least squared error.
void KvSetGroup4(const double* y, int n, uint8_t* codes, float* step_min) {
  const double lo = *std::min_element(y, y + n), hi = *std::max_element(y, y + n);
  double best_error = 0.0, best_step = 0.0, best_min = 0.0;
  for (int k = 0; k < kv::kStarts4; ++k) {
    double step = 0.5 * (hi - lo) / kv::kLevels4[15] * (1.0 - double{kv::kStartStep4} * k);
    double min = 0.5 * (lo + hi);
    for (int round = 0; round < kv::kFitRounds; ++round) {
      double sl = 0.0, sll = 0.0, sy = 0.0, syl = 0.0;
      for (int i = 0; i < n; ++i) {
        const double l = kv::kLevels4[Nearest4((y[i] - min) / step)];
        sl += l;
        sll += l * l;
        sy += y[i];
        syl += y[i] * l;
      }
      const double det = n * sll - sl * sl, s = (n * syl - sl * sy) / det;
      if (!(det > 0.0) || !(s > 0.0)) break;
      step = s;
      min = (sy - s * sl) / n;
    }
    double error = 0.0;
    for (int i = 0; i < n; ++i)
      error += std::pow(min + step * kv::kLevels4[Nearest4((y[i] - min) / step)] - y[i], 2);
    if (k == 0 || error < best_error) {
      best_error = error;
      best_step = step;
      best_min = min;
    }
  }
  for (int i = 0; i < n; ++i) {
    codes[i / 2] |= static_cast<uint8_t>(Nearest4((y[i] - best_min) / best_step) << (i % 2 * 4));
  }
  step_min[0] = static_cast<float>(best_step);
  step_min[1] = static_cast<float>(best_min);
}

// Rotated pages: one kv head's vector x [n] rotated and coded at `bits` (ops/kv_codes.h) in
// groups of kv::GroupSize(n), the rotation and the codes in double. (A NaN or an infinity in x
// reaches every element of its rotation block, and no other.)
void KvSetRotated(void* data, float* scales, int64_t vector, const float* x, int n, int bits) {
  std::vector<double> xd(x, x + n);
  const std::vector<double> y = RotateExact(xd.data(), n, /*inverse=*/false);
  const int levels = (1 << bits) - 1;
  const int part = kv::GroupSize(n), parts = kv::Groups(n);
  auto code = [&](double v, double lo, double step) {
    return step == 0 ? 0 : std::clamp(static_cast<int>(std::nearbyint((v - lo) / step)), 0, levels);
  };
  const int64_t bytes = (static_cast<int64_t>(n) * bits + 7) / 8;
  auto* codes = static_cast<uint8_t*>(data) + vector * bytes;
  std::fill(codes, codes + bytes, uint8_t{0});
  for (int c = 0; c < parts; ++c) {
    // A group is NaN where a rotation block it draws from holds a NaN or an infinity.
    const int block = kv::RotationBlock(n);
    bool finite = true;
    for (int j = c * part / block * block; j < ((c + 1) * part + block - 1) / block * block; ++j)
      finite = finite && std::isfinite(x[j]);
    const auto begin = y.begin() + c * part, end = begin + part;
    const double min = *std::min_element(begin, end), max = *std::max_element(begin, end);
    if (bits == 4 && finite && max > min) {
      KvSetGroup4(y.data() + c * part, part, codes + c * part / 2,
                  scales + 2 * (vector * parts + c));
      continue;
    }
    // The range of least squared error among [min, max] narrowed by kv::kShrinks factors.
    double best_error = 0.0, lo = min, step = (max - min) / levels;
    for (int k = 0; k < kv::kShrinks; ++k) {
      const double shrink = 1.0 - static_cast<double>(kv::kShrinkStep) * k;
      const double a = 0.5 * (min + max) - shrink * 0.5 * (max - min);
      const double s = shrink * (max - min) / levels;
      double error = 0.0;
      for (auto it = begin; it != end; ++it) error += std::pow(a + s * code(*it, a, s) - *it, 2);
      if (k == 0 || error < best_error) {
        best_error = error;
        lo = a;
        step = s;
      }
    }
    for (int i = c * part; i < (c + 1) * part; ++i) {
      const int q = finite ? code(y[i], lo, step) : 0;
      const int per_byte = 8 / bits;
      codes[i / per_byte] |= static_cast<uint8_t>(q << ((i % per_byte) * bits));
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    scales[2 * (vector * parts + c)] = finite ? static_cast<float>(step) : nan;
    scales[2 * (vector * parts + c) + 1] = finite ? static_cast<float>(lo) : nan;
  }
}

// Rotated pages: vector `vector` read back in the rotated space, [n].
std::vector<double> KvGetRotated(const void* data, const float* scales, int64_t vector, int n,
                                 int bits) {
  const int64_t bytes = (static_cast<int64_t>(n) * bits + 7) / 8;
  const auto* codes = static_cast<const uint8_t*>(data) + vector * bytes;
  const int part = kv::GroupSize(n), parts = kv::Groups(n);
  std::vector<double> y(n);
  for (int i = 0; i < n; ++i) {
    const float* sm = scales + 2 * (vector * parts + i / part);
    y[i] =
        static_cast<double>(sm[1]) +
        static_cast<double>(sm[0]) * static_cast<double>(kv::Level(bits, kv::Code(codes, i, bits)));
  }
  return y;
}
}  // namespace

void ReferenceKvWrite(const KvWriteParams& p) {
  const int64_t width = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t at = KvOffset(p.table, p.slots[r], p.positions[r], p.kv_heads, p.head_dim);
    if (IsRotatedKv(p.cache.format)) {
      for (int h = 0; h < p.kv_heads; ++h) {
        const int64_t vector = at / p.head_dim + h;
        const int64_t i = static_cast<int64_t>(h) * p.head_dim;
        KvSetRotated(p.cache.keys, p.cache.key_scales, vector, p.k + r * width + i, p.head_dim,
                     KvKeyBits(p.cache.format));
        KvSetRotated(p.cache.values, p.cache.value_scales, vector, p.v + r * width + i, p.head_dim,
                     KvValueBits(p.cache.format));
      }
      continue;
    }
    if (p.cache.format == KvFormat::kQ8) {
      for (int h = 0; h < p.kv_heads; ++h) {
        const int64_t i = static_cast<int64_t>(h) * p.head_dim;
        KvSetQ8(p.cache.keys, p.cache.key_scales, at + i, p.k + r * width + i, p.head_dim);
        KvSetQ8(p.cache.values, p.cache.value_scales, at + i, p.v + r * width + i, p.head_dim);
      }
      continue;
    }
    for (int64_t i = 0; i < width; ++i) {
      KvSet(p.cache.keys, p.cache.format, at + i, p.k[r * width + i]);
      KvSet(p.cache.values, p.cache.format, at + i, p.v[r * width + i]);
    }
  }
}

void ReferenceAttention(const AttentionParams& p) {
  const int group = p.heads / p.kv_heads;
  const bool rotated = IsRotatedKv(p.cache.format);
  std::vector<double> scores;
  std::vector<double> acc(p.head_dim);
  // Key or value vector of kv head kvh at `pos` of row r's slot, as double: over rotated pages,
  // in the rotated space.
  auto read = [&](bool keys, int64_t r, int32_t pos, int kvh) {
    const int64_t at = KvOffset(p.table, p.slots[r], pos, p.kv_heads, p.head_dim) +
                       static_cast<int64_t>(kvh) * p.head_dim;
    const void* data = keys ? p.cache.keys : p.cache.values;
    const float* scales = keys ? p.cache.key_scales : p.cache.value_scales;
    if (rotated) {
      return KvGetRotated(data, scales, at / p.head_dim, p.head_dim,
                          keys ? KvKeyBits(p.cache.format) : KvValueBits(p.cache.format));
    }
    std::vector<double> x(p.head_dim);
    for (int i = 0; i < p.head_dim; ++i)
      x[i] = KvAt(data, scales, p.cache.format, at + i, p.head_dim);
    return x;
  };
  for (int64_t r = 0; r < p.rows; ++r) {
    int32_t last = p.positions[r];
    int32_t first = p.window > 0 ? std::max(0, last - p.window + 1) : 0;
    for (int h = 0; h < p.heads; ++h) {
      const int kvh = h / group;
      const float* qf = p.q + (r * p.heads + h) * p.head_dim;
      std::vector<double> q(qf, qf + p.head_dim);
      if (rotated) q = RotateExact(q.data(), p.head_dim, /*inverse=*/false);
      scores.assign(last - first + 1, 0.0);
      double max_score = -INFINITY;
      for (int32_t pos = first; pos <= last; ++pos) {
        const std::vector<double> k = read(/*keys=*/true, r, pos, kvh);
        double dot = 0.0;
        for (int i = 0; i < p.head_dim; ++i) dot += q[i] * k[i];
        double score = dot * p.scale;
        if (p.softcap > 0) score = p.softcap * std::tanh(score / p.softcap);
        scores[pos - first] = score;
        max_score = std::max(max_score, scores[pos - first]);
      }
      double total = 0.0;
      for (double& s : scores) {
        s = std::exp(s - max_score);
        total += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int32_t pos = first; pos <= last; ++pos) {
        const std::vector<double> v = read(/*keys=*/false, r, pos, kvh);
        double weight = scores[pos - first] / total;
        for (int i = 0; i < p.head_dim; ++i) acc[i] += weight * v[i];
      }
      if (rotated) acc = RotateExact(acc.data(), p.head_dim, /*inverse=*/true);
      float* out = p.out + (r * p.heads + h) * p.head_dim;
      for (int i = 0; i < p.head_dim; ++i) out[i] = static_cast<float>(acc[i]);
    }
  }
}

void ReferenceGlu(const GluParams& p) {
  for (int64_t i = 0; i < p.n; ++i) {
    double g = p.gate[i];
    double a =
        p.act == Activation::kSilu ? g / (1.0 + std::exp(-g))
        : p.act == Activation::kSigmoid
            ? 1.0 / (1.0 + std::exp(-g))
            : 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
    p.out[i] = static_cast<float>(a * p.up[i]);
  }
}

void ReferenceSoftcap(const SoftcapParams& p) {
  for (int64_t i = 0; i < p.n; ++i)
    p.x[i] = static_cast<float>(p.cap * std::tanh(static_cast<double>(p.x[i]) / p.cap));
}

void ReferenceAdd(const AddParams& p) {
  for (int64_t i = 0; i < p.n; ++i) p.out[i] += p.x[i];
}

void ReferenceGatherRows(const GatherRowsParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    std::memcpy(p.out + i * p.dim, p.x + static_cast<int64_t>(p.index[i]) * p.dim,
                sizeof(float) * p.dim);
  }
}

}  // namespace gizllm

namespace gizllm {

void ReferenceMoeFeedForward(const MoeFeedForwardParams& p) {
  const int64_t dim = p.dim, ffn = p.ffn;
  std::vector<double> prob(p.experts), h(ffn), sum(dim);
  std::vector<int> picked;
  std::vector<double> weight;
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * dim;
    double max = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < p.experts; ++e) {
      double z = 0.0;
      for (int64_t c = 0; c < dim; ++c)
        z += static_cast<double>(x[c]) * ReferenceWeightAt(*p.router, e, c);
      prob[e] = z;
      max = std::max(max, z);
    }
    double total = 0.0;
    for (int e = 0; e < p.experts; ++e) total += prob[e] = std::exp(prob[e] - max);
    for (int e = 0; e < p.experts; ++e) prob[e] /= total;
    picked.clear();
    weight.clear();
    for (int j = 0; j < p.top_k; ++j) {
      int best = -1;
      for (int e = 0; e < p.experts; ++e) {
        if (std::find(picked.begin(), picked.end(), e) != picked.end()) continue;
        if (best < 0 || prob[e] > prob[best]) best = e;
      }
      picked.push_back(best);
      weight.push_back(prob[best]);
    }
    if (p.norm_topk_prob) {
      double s = 0.0;
      for (double w : weight) s += w;
      for (double& w : weight) w /= s;
    }
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int j = 0; j < p.top_k; ++j) {
      const int e = picked[j];
      for (int64_t i = 0; i < ffn; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t c = 0; c < dim; ++c) {
          g += static_cast<double>(x[c]) * ReferenceWeightAt(p.gate[e], i, c);
          u += static_cast<double>(x[c]) * ReferenceWeightAt(p.up[e], i, c);
        }
        h[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < dim; ++c) {
        double y = 0.0;
        for (int64_t i = 0; i < ffn; ++i) y += h[i] * ReferenceWeightAt(p.down[e], c, i);
        sum[c] += weight[j] * y;
      }
    }
    if (p.shared_ffn > 0) {
      double scale = 1.0;
      if (p.shared_scale) {
        double s = 0.0;
        for (int64_t c = 0; c < dim; ++c)
          s += static_cast<double>(x[c]) * ReferenceWeightAt(*p.shared_scale, 0, c);
        scale = 1.0 / (1.0 + std::exp(-s));
      }
      std::vector<double> hs(p.shared_ffn);
      for (int64_t i = 0; i < p.shared_ffn; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t c = 0; c < dim; ++c) {
          g += static_cast<double>(x[c]) * ReferenceWeightAt(*p.shared_gate, i, c);
          u += static_cast<double>(x[c]) * ReferenceWeightAt(*p.shared_up, i, c);
        }
        hs[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < dim; ++c) {
        double y = 0.0;
        for (int64_t i = 0; i < p.shared_ffn; ++i)
          y += hs[i] * ReferenceWeightAt(*p.shared_down, c, i);
        sum[c] += scale * y;
      }
    }
    float* out = p.out + r * dim;
    for (int64_t c = 0; c < dim; ++c) {
      out[c] = static_cast<float>((p.accumulate ? out[c] : 0.0) + sum[c]);
    }
  }
}

namespace {
double Silu(double x) { return x / (1.0 + std::exp(-x)); }
double Softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
}  // namespace

void ReferenceCausalConv(const CausalConvParams& p) {
  const int64_t c_n = p.channels;
  const int tail = p.kernel - 1;
  std::vector<float> in(p.x, p.x + (p.rows > 0 ? (p.rows - 1) * p.row_stride + c_n : 0));
  for (int64_t r = 0; r < p.rows; ++r) {
    float* state = p.states + static_cast<int64_t>(p.slots[r]) * tail * c_n;
    if (p.positions[r] == 0) std::fill(state, state + tail * c_n, 0.0f);
    for (int64_t c = 0; c < c_n; ++c) {
      const float now = in[r * p.row_stride + c];
      double sum = 0.0;
      for (int j = 0; j < tail; ++j)
        sum += static_cast<double>(p.weight[c * p.kernel + j]) * state[j * c_n + c];
      sum += static_cast<double>(p.weight[c * p.kernel + tail]) * now;
      p.x[r * p.row_stride + c] = static_cast<float>(Silu(sum));
      for (int j = 0; j + 1 < tail; ++j) state[j * c_n + c] = state[(j + 1) * c_n + c];
      state[(tail - 1) * c_n + c] = now;
    }
  }
}

void ReferenceL2Norm(const L2NormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.heads; ++h) {
      float* x = p.x + r * p.row_stride + static_cast<int64_t>(h) * p.dim;
      double ss = 0.0;
      for (int i = 0; i < p.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
      const double inv = 1.0 / std::sqrt(ss + p.eps);
      for (int i = 0; i < p.dim; ++i) x[i] = static_cast<float>(x[i] * inv);
    }
  }
}

// Row by row, the recurrence itself, with the state in double between rows of a step (stored
// back as float32 after each row, as a step's state is).
void ReferenceGatedDeltaRule(const GatedDeltaRuleParams& p) {
  const int group = p.v_heads / p.k_heads;
  const int64_t kd = p.k_dim, vd = p.v_dim;
  std::vector<double> s(kd * vd), kv(vd);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* states = p.states + static_cast<int64_t>(p.slots[r]) * p.v_heads * kd * vd;
    if (p.positions[r] == 0) std::fill(states, states + p.v_heads * kd * vd, 0.0f);
    for (int h = 0; h < p.v_heads; ++h) {
      float* st = states + static_cast<int64_t>(h) * kd * vd;
      const float* q = p.q + r * p.qk_stride + static_cast<int64_t>(h / group) * kd;
      const float* k = p.k + r * p.qk_stride + static_cast<int64_t>(h / group) * kd;
      const float* v = p.v + r * p.v_stride + static_cast<int64_t>(h) * vd;
      const double g = -std::exp(static_cast<double>(p.a_log[h])) *
                       Softplus(static_cast<double>(p.a[r * p.ab_stride + h]) + p.dt_bias[h]);
      const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(p.b[r * p.ab_stride + h])));
      const double decay = std::exp(g);
      for (int64_t i = 0; i < kd * vd; ++i) s[i] = st[i] * decay;
      std::fill(kv.begin(), kv.end(), 0.0);
      for (int64_t i = 0; i < kd; ++i)
        for (int64_t j = 0; j < vd; ++j) kv[j] += s[i * vd + j] * k[i];
      for (int64_t j = 0; j < vd; ++j) kv[j] = beta * (v[j] - kv[j]);
      float* out = p.out + (r * p.v_heads + h) * vd;
      for (int64_t j = 0; j < vd; ++j) {
        double o = 0.0;
        for (int64_t i = 0; i < kd; ++i) {
          s[i * vd + j] += k[i] * kv[j];
          o += s[i * vd + j] * p.scale * q[i];
        }
        out[j] = static_cast<float>(o);
      }
      for (int64_t i = 0; i < kd * vd; ++i) st[i] = static_cast<float>(s[i]);
    }
  }
}

void ReferenceGatedRmsNorm(const GatedRmsNormParams& p) {
  for (int64_t g = 0; g < p.groups; ++g) {
    const float* x = p.x + g * p.dim;
    const float* z = p.z + g * p.dim;
    double ss = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / p.dim + p.eps);
    float* out = p.out + g * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) {
      out[i] = static_cast<float>(x[i] * inv * p.weight[i] * Silu(z[i]));
    }
  }
}

void ReferenceLayerNorm(const LayerNormParams& p) {
  std::vector<double> y(p.dim);
  for (int64_t r = 0; r < p.rows; ++r) {
    double mean = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) {
      y[i] = static_cast<double>(p.x[r * p.dim + i]) + (p.residual ? p.residual[r * p.dim + i] : 0);
      mean += y[i];
    }
    mean /= p.dim;
    double var = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) var += (y[i] - mean) * (y[i] - mean);
    const double inv = 1.0 / std::sqrt(var / p.dim + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      p.out[r * p.dim + i] = static_cast<float>((y[i] - mean) * inv * p.weight[i] + p.bias[i]);
    }
  }
}

void ReferenceGelu(const GeluParams& p) {
  for (int64_t i = 0; i < p.n; ++i) {
    const double x = p.x[i];
    p.x[i] = static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
  }
}

void ReferenceMeanRows(const MeanRowsParams& p) {
  for (int s = 0; s < p.sequences; ++s) {
    const int64_t first = p.starts[s], end = p.starts[s + 1];
    for (int64_t i = 0; i < p.dim; ++i) {
      double sum = 0.0;
      for (int64_t r = first; r < end; ++r) sum += p.x[r * p.dim + i];
      p.out[s * p.dim + i] = static_cast<float>(sum / static_cast<double>(end - first));
    }
  }
}

void ReferenceEncoderAttention(const EncoderAttentionParams& p) {
  const int64_t width = static_cast<int64_t>(p.heads) * p.head_dim;
  for (int s = 0; s < p.sequences; ++s) {
    const int64_t first = p.starts[s], end = p.starts[s + 1];
    std::vector<double> scores(end - first);
    for (int64_t r = first; r < end; ++r) {
      for (int h = 0; h < p.heads; ++h) {
        const float* q = p.q + r * width + h * p.head_dim;
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j < end; ++j) {
          const float* k = p.k + j * width + h * p.head_dim;
          double dot = 0.0;
          for (int d = 0; d < p.head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
          scores[j - first] = p.scale * dot;
          max = std::max(max, scores[j - first]);
        }
        double sum = 0.0;
        for (double& e : scores) sum += (e = std::exp(e - max));
        for (int d = 0; d < p.head_dim; ++d) {
          double acc = 0.0;
          for (int64_t j = first; j < end; ++j)
            acc += scores[j - first] * p.v[j * width + h * p.head_dim + d];
          p.out[r * width + h * p.head_dim + d] = static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace gizllm
