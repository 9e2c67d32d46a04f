#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/check.h"
#include "quant/layout.h"

namespace gizllm::quant {
namespace {

// Candidate scales per search, from the full range down to a clipped one.
constexpr int kSteps = 24;

int Levels(Format f) {
  switch (f) {
    case Format::kQ8:
      return 255;  // codes -127..127 as levels 0..254
    case Format::kQ4:
      return 16;
    case Format::kQ2:
      return 4;
    default:
      return 2;
  }
}

// Smallest fraction of the range the search tries: fewer levels clip more.
float MinFraction(Format f) {
  switch (f) {
    case Format::kQ8:
      return 0.80f;
    case Format::kQ4:
      return 0.45f;
    default:
      return 0.25f;
  }
}

// x rounded to the nearest integer, ties to even (std::nearbyint's rounding, which is a library
// call on baseline x86-64), exactly for |x| < 2^22; larger magnitudes come out beyond every level
// and are clamped after. Adding and taking away 1.5 * 2^23 leaves no fraction bits.
inline float RoundToLevel(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

// A group's squared error in 8 running sums (lanes), added in a fixed order: a loop the compiler
// vectorizes, and the same sum on every machine.
template <typename Term>
[[gnu::always_inline]] inline float LaneSum(Term term) {
  float acc[8] = {};
  for (int i = 0; i < kGroup; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += term(i + j);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Symmetric levels: w ~ s * (k - h), k in [0, L), h = (L - 1) / 2.
struct Symmetric {
  int levels;
  float half;
  [[gnu::always_inline]] float Error(const float* w, float s, int* k) const {
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    const float top = static_cast<float>(levels - 1);
    return LaneSum([&](int i) {
      const float q = std::min(std::max(RoundToLevel(w[i] * inv + half), 0.0f), top);
      k[i] = static_cast<int>(q);
      const float d = w[i] - s * (q - half);
      return d * d;
    });
  }
};

[[gnu::always_inline]] inline float QuantizeSymmetric(Format f, const float* w, int* best_k,
                                                      float* scale) {
  Symmetric sym{Levels(f), (Levels(f) - 1) / 2.0f};
  float amax = 0.0f;
  for (int i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(w[i]));
  int k[kGroup];
  float best = sym.Error(w, 0.0f, best_k);
  *scale = 0.0f;
  if (amax == 0.0f) return best;
  auto consider = [&](float s) {
    float err = sym.Error(w, s, k);
    if (err < best) {
      best = err;
      *scale = s;
      std::memcpy(best_k, k, sizeof(k));
    }
  };
  const float lo = MinFraction(f);
  for (int step = 0; step < kSteps; ++step) {
    float fraction = 1.0f - (1.0f - lo) * step / (kSteps - 1);
    consider(amax / sym.half * fraction);
  }
  // Least-squares scale for the best codes, twice (codes may move after each refit).
  for (int iter = 0; iter < 2; ++iter) {
    double num = 0.0, den = 0.0;
    for (int i = 0; i < kGroup; ++i) {
      double level = best_k[i] - sym.half;
      num += w[i] * level;
      den += level * level;
    }
    if (den <= 0.0) break;
    consider(static_cast<float>(num / den));
  }
  return best;
}

// Asymmetric levels: w ~ s * k + z, k in [0, L).
[[gnu::always_inline]] inline float AsymmetricError(const float* w, int levels, float s, float z,
                                                    int* k) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  const float top = static_cast<float>(levels - 1);
  return LaneSum([&](int i) {
    const float q = std::min(std::max(RoundToLevel((w[i] - z) * inv), 0.0f), top);
    k[i] = static_cast<int>(q);
    const float d = w[i] - (s * q + z);
    return d * d;
  });
}

// The (s, z) that minimize sum (w - s k - z)^2 for fixed codes; false if the codes are all equal.
// `sw`: the sum of w (the same for every fit of a group). The codes' sums are integers (exact);
// the sum of w k runs in 8 lanes of double, added in a fixed order, as LaneSum's.
[[gnu::always_inline]] inline bool FitAffine(const float* w, const int* k, double sw, float* s,
                                             float* z) {
  int32_t sk = 0, skk = 0;
  double acc[8] = {};
  for (int i = 0; i < kGroup; i += 8) {
    for (int j = 0; j < 8; ++j) {
      sk += k[i + j];
      skk += k[i + j] * k[i + j];
      acc[j] += static_cast<double>(w[i + j]) * k[i + j];
    }
  }
  const double swk =
      ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  const double n = kGroup;
  const double det = n * skk - static_cast<double>(sk) * sk;
  if (det <= 0.0) return false;
  double ss = (n * swk - sk * sw) / det;
  if (ss <= 0.0) return false;
  *s = static_cast<float>(ss);
  *z = static_cast<float>((sw - ss * sk) / n);
  return true;
}

[[gnu::always_inline]] inline float QuantizeAsymmetric(Format f, const float* w, int* best_k,
                                                       float* scale, float* zero) {
  const int levels = Levels(f);
  float lo = w[0], hi = w[0];
  for (int i = 1; i < kGroup; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  *scale = 0.0f;
  *zero = lo;
  float best = AsymmetricError(w, levels, 0.0f, lo, best_k);
  if (hi == lo) return best;
  double sw = 0.0;
  for (int i = 0; i < kGroup; ++i) sw += w[i];
  int k[kGroup];
  auto consider = [&](float s, float z) {
    float err = AsymmetricError(w, levels, s, z, k);
    if (err < best) {
      best = err;
      *scale = s;
      *zero = z;
      std::memcpy(best_k, k, sizeof(k));
    }
    return err;
  };
  const float range = hi - lo;
  const float min_fraction = MinFraction(f);
  for (int step = 0; step < kSteps; ++step) {
    float fraction = 1.0f - (1.0f - min_fraction) * step / (kSteps - 1);
    float s = range * fraction / (levels - 1);
    float z = lo + range * (1.0f - fraction) / 2.0f;
    const float err = AsymmetricError(w, levels, s, z, k);
    // Refit scale and zero to these codes, then round again with the fit (consider leaves the
    // fit's codes in k).
    for (int iter = 0; iter < 2; ++iter) {
      float fs, fz;
      if (!FitAffine(w, k, sw, &fs, &fz)) break;
      consider(fs, fz);
    }
    // The step's own scale and zero, weighed after its fits (ties go to what came first).
    if (err < best) {
      best = err;
      *scale = s;
      *zero = z;
      AsymmetricError(w, levels, s, z, best_k);
    }
  }
  return best;
}

}  // namespace

Status QuantizeOptions::Check() const {
  if (!IsQuantized(format)) {
    return InvalidArgument("quantize: format " + FormatName(format) +
                           " is not a quantized format (expected q8, q4, q2 or q1)");
  }
  return Status::Ok();
}

Weight QuantizedLinear::View() const {
  Weight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.data = codes.data();
  w.scales = scales.data();
  w.zeros = zeros.empty() ? nullptr : zeros.data();
  w.group = kGroup;
  w.rotated = rotated;
  w.rotation_seed = seed;
  return w;
}

// Compiled for AVX-512 and AVX2 beside the baseline, picked at load: the search's lanes are the
// same arithmetic on every one (quantize.cc is built without contraction into fused
// multiply-adds), so the codes are too.
__attribute__((target_clones("avx512f", "avx2", "default"))) float QuantizeGroup(
    Format format, const float* w, uint8_t* codes, float* scale, float* zero) {
  int k[kGroup];
  float err = 0.0f;
  std::memset(codes, 0, GroupBytes(format));
  if (format == Format::kQ1) {
    // For sign codes the best scale is the mean magnitude, whatever the data.
    double sum = 0.0;
    for (int i = 0; i < kGroup; ++i) {
      k[i] = w[i] >= 0.0f ? 1 : 0;
      sum += std::fabs(w[i]);
    }
    *scale = static_cast<float>(sum / kGroup);
    for (int i = 0; i < kGroup; ++i) {
      float d = w[i] - (k[i] ? *scale : -*scale);
      err += d * d;
    }
  } else if (zero != nullptr && AllowsZeros(format)) {
    err = QuantizeAsymmetric(format, w, k, scale, zero);
  } else {
    err = QuantizeSymmetric(format, w, k, scale);
    if (format == Format::kQ8) {
      for (int i = 0; i < kGroup; ++i) k[i] -= 127;
    }
  }
  for (int i = 0; i < kGroup; ++i) PutCode(format, codes, i, k[i]);
  return err;
}

QuantizedLinear QuantizedLinear::Empty(const QuantizeOptions& options, int64_t rows,
                                       int64_t cols) {
  QuantizedLinear q;
  q.format = options.format;
  q.rows = rows;
  q.cols = cols;
  q.rotated = options.rotate;
  q.seed = options.rotate ? options.seed : 0;
  const int64_t groups = cols / kGroup;
  q.codes.assign(rows * groups * GroupBytes(options.format), 0);
  q.scales.assign(rows * groups, 0.0f);
  if (options.zeros && AllowsZeros(options.format)) q.zeros.assign(rows * groups, 0.0f);
  return q;
}

Expected<QuantizedLinear> QuantizeLinear(const float* w, int64_t rows, int64_t cols,
                                         const QuantizeOptions& options, ThreadPool* pool) {
  QuantizedLinear q;
  GZ_RETURN_IF_ERROR(QuantizeLinearInto(w, rows, cols, options, pool, &q));
  return q;
}

Status QuantizeLinearInto(const float* w, int64_t rows, int64_t cols,
                          const QuantizeOptions& options, ThreadPool* pool, QuantizedLinear* out) {
  GZ_RETURN_IF_ERROR(options.Check());
  if (rows <= 0 || cols <= 0 || cols % kGroup != 0) {
    return InvalidArgument("quantize: a matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols) + " (expected columns a positive multiple of 128)");
  }
  // Every code, scale and zero is written below: the arrays are only sized (kept memory).
  QuantizedLinear& q = *out;
  q.format = options.format;
  q.rows = rows;
  q.cols = cols;
  q.rotated = options.rotate;
  q.seed = options.rotate ? options.seed : 0;
  const int64_t groups = cols / kGroup;
  q.codes.resize(rows * groups * GroupBytes(options.format));
  q.scales.resize(rows * groups);
  q.zeros.resize(options.zeros && AllowsZeros(options.format) ? rows * groups : 0);
  const int bytes = GroupBytes(options.format);
  const bool zeros = !q.zeros.empty();
  auto quantize_rows = [&](int64_t begin, int64_t end, int /*thread*/) {
    std::vector<float> row(cols);
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(row.data(), w + r * cols, cols * sizeof(float));
      if (options.rotate) RotateRow(row.data(), cols, options.seed);
      for (int64_t g = 0; g < groups; ++g) {
        int64_t i = r * groups + g;
        QuantizeGroup(options.format, row.data() + g * kGroup, q.codes.data() + i * bytes,
                      &q.scales[i], zeros ? &q.zeros[i] : nullptr);
      }
    }
  };
  if (pool) {
    pool->ParallelFor(rows, 1, quantize_rows);
  } else {
    quantize_rows(0, rows, 0);
  }
  return Status::Ok();
}

Status CheckQuantized(const Weight& w) {
  if (!IsQuantized(w.format)) {
    return InvalidArgument("weight format " + FormatName(w.format) + " is not quantized");
  }
  if (w.group != kGroup) {
    return InvalidArgument("weight group " + std::to_string(w.group) + " (expected 128)");
  }
  if (w.rows <= 0 || w.cols <= 0 || w.cols % kGroup != 0) {
    return InvalidArgument("weight shape " + std::to_string(w.rows) + " x " +
                           std::to_string(w.cols) + " (expected columns a multiple of 128)");
  }
  if (!w.data || !w.scales) return InvalidArgument("quantized weight without codes or scales");
  if (w.zeros && !AllowsZeros(w.format)) {
    return InvalidArgument("weight format " + FormatName(w.format) + " has no zero entries");
  }
  return Status::Ok();
}

void DequantizeRows(const Weight& w, int64_t begin, int64_t end, float* out) {
  CHECK(CheckQuantized(w).ok());
  const int64_t groups = w.cols / kGroup;
  const int bytes = GroupBytes(w.format);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      int64_t i = r * groups + g;
      Affine a = GroupAffine(w.format, scales[i], zeros ? zeros + i : nullptr);
      const uint8_t* group = codes + i * bytes;
      float* o = out + (r - begin) * w.cols + g * kGroup;
      for (int e = 0; e < kGroup; ++e) o[e] = a.mul * CodeAt(w.format, group, e) + a.add;
    }
  }
}

void DequantizeOriginal(const Weight& w, float* out) {
  DequantizeRows(w, 0, w.rows, out);
  if (!w.rotated) return;
  for (int64_t r = 0; r < w.rows; ++r) UnrotateRow(out + r * w.cols, w.cols, w.rotation_seed);
}

void ReferenceMatmul(const float* x, int64_t rows, const Weight& w, float* out) {
  std::vector<float> dense(w.rows * w.cols);
  DequantizeRows(w, 0, w.rows, dense.data());
  std::vector<float> xr(x, x + rows * w.cols);
  if (w.rotated) {
    for (int64_t r = 0; r < rows; ++r) RotateRow(xr.data() + r * w.cols, w.cols, w.rotation_seed);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) {
        sum += static_cast<double>(xr[r * w.cols + k]) * dense[n * w.cols + k];
      }
      out[r * w.rows + n] = static_cast<float>(sum);
    }
  }
}

}  // namespace gizllm::quant
