// Quantization schemes measured without kernels: every linear of a model folder is quantized by a
// scheme and dequantized again (in the rotated basis when --rotate, then rotated back), and the
// folder is written with those values in float32, for `gizllm perplexity --base` to measure the
// KL the scheme would give. Prints the relative squared error of the weights (sum of squared
// errors over sum of squares, per linear kind and in all).
//
// Usage: quant_schemes --model DIR --scheme NAME --out DIR [--rotate yes|no]
// Schemes: q4z128 (the own 4-bit format: groups of 128, scale and zero), q4s128 (the same
//   without zeros), q8 (own 8-bit),
//   u4b32 (16 even levels per 32, f16 scale: Q4_0's layout with a searched scale),
//   nl4b32 (IQ4_NL's 16 levels per 32, f16 scale), nl4b32s8 (IQ4_NL's levels per 32, an 8-bit
//   scale per 32 under an f16 scale per 128), lm4b32 and lm4b32s8 (the Lloyd-Max levels of a
//   Gaussian instead), km4b32 and km4b32s8 (16 levels fitted to each tensor by --iters rounds
//   of k-means), q8b32s8 (int8 per 32, 8-bit scale per 32 under an f16 scale per 128); the suffix
//   l8 instead of s8 makes the 8-bit scale an exponent, S * 2^((m - 255) / STEPS) (environment
//   STEPS, default 16; convert's GZ blocks use 32).
// --weight x2 weights each value's error by its square (llama.cpp's IQ4_NL without an imatrix);
// --only NAME / --skip NAME quantize only the linears whose names hold NAME / all but those.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/safetensors.h"
#include "quant/hadamard.h"
#include "quant/layout.h"
#include "quant/quantize.h"

namespace gizllm {
namespace {

float RoundF16(float x) { return F16ToF32(F32ToF16(x)); }

// The least-squared-error fit of n values to s * grid[q] for a scale s among candidates around
// amax / gmax; returns the error, writes the values.
int g_iters = 8;
std::string g_only, g_skip;
int g_codes[256];
int g_weight = 0;  // 0: plain squared error; 1: weighted by x^2 (llama.cpp's IQ4_NL without an imatrix)
float FitGrid(const float* x, int n, const float* grid, int levels, float* out, float* scale_out,
              bool f16) {
  float w[256];
  for (int i = 0; i < n; ++i) w[i] = g_weight == 1 ? x[i] * x[i] : 1.0f;
  float amax = 0.0f;
  int imax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), imax = i;
  if (amax == 0.0f) {
    std::fill(out, out + n, 0.0f);
    *scale_out = 0.0f;
    return 0.0f;
  }
  float best_err = 1e30f, best_s = 0.0f;
  auto quantize = [&](float s, float* vals) {
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float t = x[i] / s;
      int lo = 0, hi = levels - 1;
      while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        (grid[mid] <= t ? lo : hi) = mid;
      }
      const int q = (t - grid[lo] < grid[hi] - t) ? lo : hi;
      const float v = s * grid[q];
      if (vals) vals[i] = v, g_codes[i] = q;
      err += w[i] * (x[i] - v) * (x[i] - v);
    }
    return err;
  };
  // The largest value maps to either end of the grid (the sign that gives the larger span).
  const float g = x[imax] > 0 ? grid[levels - 1] : grid[0];
  const float base = x[imax] / g;
  for (int k = -16; k <= 16; ++k) {
    float s = base * (1.0f + 0.02f * k);
    // least-squares refit to the codes
    std::vector<float> vals(n);
    quantize(s, vals.data());
    float num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      const float c = vals[i] / s;
      num += w[i] * x[i] * c;
      den += w[i] * c * c;
    }
    for (float cand : {s, den > 0 ? num / den : s}) {
      if (f16) cand = RoundF16(cand);
      if (cand <= 0) continue;
      const float e = quantize(cand, nullptr);
      if (e < best_err) best_err = e, best_s = cand;
    }
  }
  *scale_out = best_s;
  return quantize(best_s, out);
}

const float kIq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// Lloyd-Max levels of a unit Gaussian, 16 levels (Max 1960).
const float kLm4[16] = {-2.733f, -2.069f, -1.618f, -1.256f, -0.9424f, -0.6568f, -0.3881f, -0.1284f,
                        0.1284f, 0.3881f,  0.6568f,  0.9424f,  1.256f,  1.618f,  2.069f,  2.733f};

struct Scheme {
  std::string name;
  double bits;
};

// Quantizes one rotated row in place by `scheme`.
float g_fitted[16];
void QuantizeRow(const std::string& scheme, float* row, int64_t cols) {
  using namespace quant;
  if (scheme == "q4z128" || scheme == "q8" || scheme == "q4s128") {
    const Format f = scheme == "q8" ? Format::kQ8 : Format::kQ4;
    const bool zeros = scheme == "q4z128";
    for (int64_t g = 0; g < cols / kGroup; ++g) {
      uint8_t codes[128] = {};
      float s = 0, z = 0;
      QuantizeGroup(f, row + g * kGroup, codes, &s, zeros ? &z : nullptr);
      const Affine a = GroupAffine(f, s, zeros ? &z : nullptr);
      for (int e = 0; e < kGroup; ++e) row[g * kGroup + e] = a.mul * CodeAt(f, codes, e) + a.add;
    }
    return;
  }
  float u4[16], q8g[255];
  for (int i = 0; i < 16; ++i) u4[i] = i - 7.5f;
  for (int i = 0; i < 255; ++i) q8g[i] = i - 127;
  const float* grid = nullptr;
  int levels = 16;
  if (scheme.rfind("u4", 0) == 0) grid = u4;
  if (scheme.rfind("nl4", 0) == 0) grid = kIq4;
  if (scheme.rfind("lm4", 0) == 0) grid = kLm4;
  if (scheme.rfind("km4", 0) == 0) grid = g_fitted;
  if (scheme.rfind("q8", 0) == 0) grid = q8g, levels = 255;
  const bool l8 = scheme.size() > 2 && scheme.substr(scheme.size() - 2) == "l8";
  const float kSteps = std::getenv("STEPS") ? std::atof(std::getenv("STEPS")) : 16.0f;
  const bool s8 = l8 || (scheme.size() > 2 && scheme.substr(scheme.size() - 2) == "s8");
  const int block = 32;
  if (!s8) {
    for (int64_t b = 0; b < cols / block; ++b) {
      float s;
      FitGrid(row + b * block, block, grid, levels, row + b * block, &s, true);
    }
    return;
  }
  // Sub-scales: per 128, the best scale of each block of 32, then one f16 scale S = max / 255
  // and 8-bit multipliers m in [1, 255]; each block refit at the scales m * S nearby.
  for (int64_t g = 0; g < cols / 128; ++g) {
    float* v = row + g * 128;
    float s[4], tmp[32];
    float smax = 0;
    for (int j = 0; j < 4; ++j) {
      FitGrid(v + j * 32, 32, grid, levels, tmp, &s[j], false);
      smax = std::max(smax, s[j]);
    }
    // l8: the 8-bit scale is an exponent, S * 2^((m - 255) / 16) (steps of 4.4% at any size,
    // down to 2^-16 of the block's largest); s8: a multiple, m * S with S = max / 255.
    const float S = RoundF16(l8 ? smax * 1.0001f : smax / 255.0f);
    for (int j = 0; j < 4; ++j) {
      float best = 1e30f;
      std::vector<float> bestv(32);
      int m0 = S > 0 ? static_cast<int>(std::lround(s[j] / S)) : 0;
      if (l8 && S > 0 && s[j] > 0) m0 = 255 + static_cast<int>(std::lround(kSteps * std::log2(s[j] / S)));
      for (int m = std::max(1, m0 - 2); m <= std::min(255, m0 + 2); ++m) {
        const float sc = l8 ? S * std::exp2((m - 255) / kSteps) : m * S;
        float err = 0;
        for (int i = 0; i < 32; ++i) {
          const float t = v[j * 32 + i] / sc;
          int q = 0;
          float bd = 1e30f;
          for (int l = 0; l < levels; ++l) {
            const float d = std::fabs(t - grid[l]);
            if (d < bd) bd = d, q = l;
          }
          tmp[i] = sc * grid[q];
          const float wi = g_weight == 1 ? v[j * 32 + i] * v[j * 32 + i] : 1.0f;
          err += wi * (v[j * 32 + i] - tmp[i]) * (v[j * 32 + i] - tmp[i]);
        }
        if (err < best) best = err, std::copy(tmp, tmp + 32, bestv.begin());
      }
      if (S == 0) std::fill(bestv.begin(), bestv.end(), 0.0f);
      std::copy(bestv.begin(), bestv.end(), v + j * 32);
    }
  }
}

int Main(int argc, char** argv) {
  std::string model = "models/tiny-chat", scheme, out;
  bool rotate = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--scheme") scheme = v;
    else if (a == "--out") out = v;
    else if (a == "--rotate") rotate = v == "yes";
    else if (a == "--only") g_only = v;
    else if (a == "--skip") g_skip = v;
    else if (a == "--iters") g_iters = std::stoi(v);
    else if (a == "--weight") g_weight = v == "x2" ? 1 : 0;
  }
  auto ck = Checkpoint::Open(model);
  if (!ck.ok()) {
    std::fprintf(stderr, "%s\n", ck.status().message().c_str());
    return 1;
  }
  std::filesystem::create_directories(out);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"}) {
    std::filesystem::copy_file(model + "/" + f, out + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::pair<double, double>> errs;  // kind -> (err, norm)
  for (const TensorInfo* t : ck->All()) {
    std::vector<float> v(t->Elements());
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      v[i] = t->dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
    }
    const bool linear = t->shape.size() == 2 && t->name.find("layers.") != std::string::npos &&
                        t->name.find("_proj.weight") != std::string::npos &&
                        (g_only.empty() || t->name.find(g_only) != std::string::npos) &&
                        (g_skip.empty() || t->name.find(g_skip) == std::string::npos);
    if (linear) {
      const int64_t rows = t->shape[0], cols = t->shape[1];
      std::vector<float> orig = v;
      if (scheme.rfind("km4", 0) == 0) {
        std::vector<float> r = v;
        for (int64_t i = 0; i < rows; ++i)
          if (rotate) quant::RotateRow(r.data() + i * cols, cols, quant::kDefaultRotationSeed);
        std::copy(kLm4, kLm4 + 16, g_fitted);
        for (int it = 0; it < g_iters; ++it) {
          double num[16] = {}, den[16] = {};
          std::vector<float> vals(32);
          for (int64_t b = 0; b < rows * cols / 32; ++b) {
            float sc;
            FitGrid(r.data() + b * 32, 32, g_fitted, 16, vals.data(), &sc, true);
            if (sc == 0) continue;
            for (int i = 0; i < 32; ++i) {
              const int l = g_codes[i];
              num[l] += sc * r[b * 32 + i];
              den[l] += double(sc) * sc;
            }
          }
          for (int l = 0; l < 16; ++l)
            if (den[l] > 0) g_fitted[l] = num[l] / den[l];
          std::sort(g_fitted, g_fitted + 16);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* row = v.data() + r * cols;
        if (rotate) quant::RotateRow(row, cols, quant::kDefaultRotationSeed);
        QuantizeRow(scheme, row, cols);
        if (rotate) quant::UnrotateRow(row, cols, quant::kDefaultRotationSeed);
      }
      std::string kind = t->name.substr(t->name.rfind('.', t->name.size() - 8) + 1);
      double e = 0, n = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        e += (v[i] - orig[i]) * (v[i] - orig[i]);
        n += orig[i] * orig[i];
      }
      errs[kind].first += e;
      errs[kind].second += n;
      errs["all"].first += e;
      errs["all"].second += n;
    }
    keep.push_back(std::move(v));
    tensors.push_back({t->name, DType::kF32, t->shape, keep.back().data(), keep.back().size() * 4});
  }
  for (auto& [k, en] : errs) std::printf("%s %-18s rel err %.3e\n", scheme.c_str(), k.c_str(), en.first / en.second);
  Status s = WriteSafetensors(out + "/model.safetensors", tensors, {{"format", "pt"}});
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
