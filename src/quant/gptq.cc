#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "quant/hadamard.h"
#include "quant/layout.h"

namespace gizllm::quant {
namespace {

// sum a[i] b[i], i < n, with four partial sums so that the additions overlap.
double Dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Runs fn(begin, end) over [0, n) on the pool when the work is worth splitting.
template <typename Fn>
void Split(ThreadPool* pool, int64_t n, int64_t work, Fn fn) {
  if (!pool || pool->threads() <= 1 || work < (1 << 16) || n < 2) {
    fn(int64_t{0}, n);
    return;
  }
  pool->ParallelFor(n, 1, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
}

// Rounds values to the codes of one group's fixed (scale, zero): value = mul * code + add.
struct GroupCoder {
  float mul = 0.0f, add = 0.0f;
  int lo = 0, hi = 0;
  GroupCoder(Format f, float scale, const float* zero) {
    Affine a = GroupAffine(f, scale, zero);
    mul = a.mul;
    add = a.add;
    lo = f == Format::kQ8 ? -127 : 0;
    hi = f == Format::kQ8 ? 127 : f == Format::kQ4 ? 15 : f == Format::kQ2 ? 3 : 1;
  }
  int Code(float w) const {
    if (!(mul > 0.0f)) return ZeroCode();
    float c = std::nearbyint((w - add) / mul);
    return static_cast<int>(std::clamp(c, static_cast<float>(lo), static_cast<float>(hi)));
  }
  float Value(int code) const { return mul * code + add; }
  int ZeroCode() const { return lo < 0 ? 0 : lo; }  // any code: the group is constant
};

}  // namespace

bool Cholesky(const double* a, int64_t n, double* l, ThreadPool* pool) {
  std::fill(l, l + n * n, 0.0);
  // Column by column: the pivot, then every entry below it (independent of each other).
  for (int64_t j = 0; j < n; ++j) {
    double* lj = l + j * n;
    double pivot = a[j * n + j] - Dot(lj, lj, j);
    if (!(pivot > 0.0)) return false;
    lj[j] = std::sqrt(pivot);
    const double inv = 1.0 / lj[j];
    Split(pool, n - j - 1, (n - j - 1) * j, [&](int64_t begin, int64_t end) {
      for (int64_t i = j + 1 + begin; i < j + 1 + end; ++i) {
        double* li = l + i * n;
        li[j] = (a[i * n + j] - Dot(li, lj, j)) * inv;
      }
    });
  }
  return true;
}

bool InverseCholesky(const double* a, int64_t n, double* u, ThreadPool* pool) {
  // The reversed matrix J a J (J: the exchange matrix) = m m^T, so a = (J m J)(J m J)^T = k k^T
  // with k = J m J upper triangular, and a^-1 = k^-T k^-1 = u^T u with u = k^-1.
  std::vector<double> reversed(n * n), m(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) reversed[i * n + j] = a[(n - 1 - i) * n + (n - 1 - j)];
  }
  if (!Cholesky(reversed.data(), n, m.data(), pool)) return false;
  std::vector<double>& k = reversed;  // reused: k[i][j] = m[n-1-i][n-1-j]
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) k[i * n + j] = m[(n - 1 - i) * n + (n - 1 - j)];
  }
  std::fill(u, u + n * n, 0.0);
  // Column c of u solves k x = e_c by back substitution; x is zero below row c.
  Split(pool, n, n * n * n / 6, [&](int64_t begin, int64_t end) {
    std::vector<double> x(n);
    for (int64_t c = begin; c < end; ++c) {
      x[c] = 1.0 / k[c * n + c];
      for (int64_t i = c - 1; i >= 0; --i) {
        x[i] = -Dot(&k[i * n + i + 1], &x[i + 1], c - i) / k[i * n + i];
      }
      for (int64_t i = 0; i <= c; ++i) u[i * n + c] = x[i];
    }
  });
  return true;
}

void RotateGram(float* gram, int64_t cols, uint64_t seed) {
  // Rows: gram R. Then (gram R)^T = R^T gram, whose rows rotated give R^T gram R.
  for (int64_t i = 0; i < cols; ++i) RotateRow(gram + i * cols, cols, seed);
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = i + 1; j < cols; ++j) std::swap(gram[i * cols + j], gram[j * cols + i]);
  }
  for (int64_t i = 0; i < cols; ++i) RotateRow(gram + i * cols, cols, seed);
}

Status GptqOptions::Check() const {
  if (!(damp >= 0.0 && damp <= 1.0)) {
    return InvalidArgument("gptq: damp " + std::to_string(damp) + " (expected 0 to 1)");
  }
  return Status::Ok();
}

Expected<QuantizedLinear> GptqQuantizeLinear(const float* w, int64_t rows, int64_t cols,
                                             const float* gram, const QuantizeOptions& options,
                                             const GptqOptions& gptq, ThreadPool* pool) {
  GZ_RETURN_IF_ERROR(options.Check());
  GZ_RETURN_IF_ERROR(gptq.Check());
  if (rows <= 0 || cols <= 0 || cols % kGroup != 0) {
    return InvalidArgument("gptq: a matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols) + " (expected columns a positive multiple of 128)");
  }
  // W and H in the stored basis.
  std::vector<float> wr(w, w + rows * cols);
  std::vector<float> hf(gram, gram + cols * cols);
  if (options.rotate) {
    Split(pool, rows, rows * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) RotateRow(wr.data() + r * cols, cols, options.seed);
    });
    RotateGram(hf.data(), cols, options.seed);
  }
  std::vector<double> h(hf.begin(), hf.end());
  // An input that is always zero: its weights never matter; a unit diagonal keeps H invertible.
  double mean = 0.0;
  for (int64_t j = 0; j < cols; ++j) mean += h[j * cols + j];
  mean /= cols;
  for (int64_t j = 0; j < cols; ++j) {
    if (h[j * cols + j] <= 0.0) {
      h[j * cols + j] = mean > 0.0 ? mean : 1.0;
      for (int64_t r = 0; r < rows; ++r) wr[r * cols + j] = 0.0f;
    }
  }
  std::vector<double> u(cols * cols);
  bool factored = false;
  for (double damp = gptq.damp; !factored && damp <= 10.0; damp = damp > 0 ? damp * 10 : 1e-4) {
    std::vector<double> hd = h;
    for (int64_t j = 0; j < cols; ++j) hd[j * cols + j] += damp * (mean > 0.0 ? mean : 1.0);
    factored = InverseCholesky(hd.data(), cols, u.data(), pool);
  }
  if (!factored) return InvalidArgument("gptq: the inputs' Gram matrix is not positive definite");
  std::vector<float> uf(u.begin(), u.end());

  QuantizedLinear q = QuantizedLinear::Empty(options, rows, cols);
  const int64_t groups = cols / kGroup;
  const int bytes = GroupBytes(options.format);
  const bool zeros = !q.zeros.empty();

  // Rows are independent given U; a tile of rows shares each row of U while it is in cache.
  constexpr int64_t kTile = 8;
  const int64_t tiles = (rows + kTile - 1) / kTile;
  auto run_tiles = [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> scratch(bytes);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * kTile, r1 = std::min(rows, r0 + kTile);
      std::vector<GroupCoder> coders;
      float err[kTile];
      for (int64_t g = 0; g < groups; ++g) {
        coders.clear();
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i = r * groups + g;
          QuantizeGroup(options.format, wr.data() + r * cols + g * kGroup, scratch.data(),
                        &q.scales[i], zeros ? &q.zeros[i] : nullptr);
          coders.emplace_back(options.format, q.scales[i], zeros ? &q.zeros[i] : nullptr);
        }
        for (int64_t j = g * kGroup; j < (g + 1) * kGroup; ++j) {
          const float* uj = uf.data() + j * cols;
          for (int64_t r = r0; r < r1; ++r) {
            const GroupCoder& coder = coders[r - r0];
            float value = wr[r * cols + j];
            int code = coder.Code(value);
            PutCode(options.format, q.codes.data() + (r * groups + g) * bytes, j % kGroup, code);
            err[r - r0] = (value - coder.Value(code)) / uj[j];
          }
          // The columns after j make up for its error.
          for (int64_t r = r0; r < r1; ++r) {
            float* row = wr.data() + r * cols;
            const float e = err[r - r0];
            for (int64_t k = j + 1; k < cols; ++k) row[k] -= e * uj[k];
          }
        }
      }
    }
  };
  Split(pool, tiles, rows * cols * cols / 2, run_tiles);
  return q;
}

}  // namespace gizllm::quant
