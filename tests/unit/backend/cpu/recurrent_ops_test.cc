// The recurrent layers' ops on the CPU backend against their float64 references (fresh random
// inputs, NaN-poisoned outputs, 1 and 3 threads), and the gated delta rule's chunked form against
// the row-by-row recurrence over chunk sizes and run lengths that are not multiples of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"

namespace gizllm {
namespace {

class RecurrentOpsTest : public ::testing::Test {
 protected:
  std::mt19937 rng_{2024};
  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& f : v) f = d(rng_);
    return v;
  }
  static std::vector<float> Poison(int64_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
  }
  static double MaxAbs(const std::vector<float>& v) {
    double m = 0.0;
    for (float f : v) m = std::max(m, std::fabs(static_cast<double>(f)));
    return m;
  }
};

// Rows of two slots, each a run at consecutive positions: slot 1 starts at 0 (its state is
// garbage and must be ignored), slot 0 continues from position 5 over a random state. Two steps,
// so the second reads the state the first left.
TEST_F(RecurrentOpsTest, CausalConvMatchesReference) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    for (int kernel : {2, 4}) {
      for (int64_t channels : {5, 70, 131}) {
        const int64_t stride = channels + 3;
        const int tail = kernel - 1;
        std::vector<float> weight = Random(channels * kernel);
        std::vector<float> state = Random(2 * tail * channels);
        std::vector<float> want_state = state;
        int32_t next[2] = {5, 0};
        for (int step = 0; step < 2; ++step) {
          const int64_t runs[2] = {step == 0 ? 3 : 1, step == 0 ? 6 : 2};
          std::vector<int32_t> slots, positions;
          for (int s : {0, 1}) {
            for (int64_t i = 0; i < runs[s]; ++i) {
              slots.push_back(s);
              positions.push_back(next[s]++);
            }
          }
          const int64_t rows = static_cast<int64_t>(slots.size());
          std::vector<float> x = Random(rows * stride);
          std::vector<float> want = x;
          CausalConvParams p{x.data(),      rows,         channels,     stride,          kernel,
                             weight.data(), state.data(), slots.data(), positions.data()};
          ASSERT_TRUE(p.Check().ok()) << p.Check().message();
          CausalConvParams ref = p;
          ref.x = want.data();
          ref.states = want_state.data();
          backend.CausalConv(p);
          ReferenceCausalConv(ref);
          for (int64_t i = 0; i < rows * stride; ++i)
            ASSERT_NEAR(x[i], want[i], 2e-6) << "channels " << channels << " at " << i;
          for (size_t i = 0; i < state.size(); ++i) ASSERT_EQ(state[i], want_state[i]) << i;
        }
      }
    }
  }
}

// A row at position 0 ignores the state: the output is silu of the last weight times the input.
TEST_F(RecurrentOpsTest, CausalConvStartsFromZeroAtPositionZero) {
  ThreadPool pool(1);
  CpuBackend backend(&pool, CpuOptions{});
  std::vector<float> weight = {0.5f, -1.0f, 2.0f, 0.25f}, state(3, 9.0f);
  float x = 0.8f;
  const int32_t slot = 0, position = 0;
  backend.CausalConv({&x, 1, 1, 1, 4, weight.data(), state.data(), &slot, &position});
  const float pre = 0.25f * 0.8f;
  EXPECT_NEAR(x, pre / (1.0f + std::exp(-pre)), 1e-7);
  EXPECT_EQ(state, (std::vector<float>{0.0f, 0.0f, 0.8f}));
}

TEST_F(RecurrentOpsTest, L2NormAndGatedRmsNormMatchReference) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    for (int dim : {1, 16, 33}) {
      const int heads = 3;
      const int64_t rows = 7, stride = heads * dim + 5;
      std::vector<float> x = Random(rows * stride, -3.0f, 3.0f), want = x;
      L2NormParams p{x.data(), rows, heads, dim, stride, 1e-6f};
      ASSERT_TRUE(p.Check().ok());
      L2NormParams ref = p;
      ref.x = want.data();
      backend.L2Norm(p);
      ReferenceL2Norm(ref);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 2e-6) << i;

      const int64_t groups = rows * heads;
      std::vector<float> y = Random(groups * dim, -3.0f, 3.0f), z = Random(groups * dim, -4, 4);
      std::vector<float> w = Random(dim), got = Poison(groups * dim), expect = got;
      GatedRmsNormParams g{got.data(), y.data(), z.data(), w.data(), groups, dim, 1e-6f};
      ASSERT_TRUE(g.Check().ok());
      GatedRmsNormParams gref = g;
      gref.out = expect.data();
      backend.GatedRmsNorm(g);
      ReferenceGatedRmsNorm(gref);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expect[i], 4e-6) << i;
      // In place.
      g.out = y.data();
      backend.GatedRmsNorm(g);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(y[i], got[i]) << i;
    }
  }
}

TEST_F(RecurrentOpsTest, SigmoidGlu) {
  ThreadPool pool(2);
  CpuBackend backend(&pool, CpuOptions{});
  std::vector<float> gate = Random(3001, -6, 6), up = Random(3001), got = Poison(3001);
  std::vector<float> want = got;
  backend.Glu({got.data(), gate.data(), up.data(), 3001, Activation::kSigmoid});
  ReferenceGlu({want.data(), gate.data(), up.data(), 3001, Activation::kSigmoid});
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << i;
}

TEST_F(RecurrentOpsTest, GatedDeltaRuleChunkedEqualsRecurrence) {
  struct Shape {
    int k_heads, v_heads, k_dim, v_dim;
  };
  for (const Shape& shape : {Shape{1, 1, 8, 8}, Shape{2, 4, 16, 12}, Shape{1, 3, 7, 5}}) {
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      CpuBackend backend(&pool, CpuOptions{});
      for (int64_t length : {1, 2, 5, 17, 64, 100}) {
        for (int chunk : {1, 3, 16, 64}) {
          // Slot 0: `length` rows from position 0 (over a garbage state); slot 1: 4 rows continuing
          // a random state at position 9.
          const int kd = shape.k_dim, vd = shape.v_dim;
          const int64_t head_state = static_cast<int64_t>(kd) * vd;
          std::vector<int32_t> slots, positions;
          for (int64_t i = 0; i < length; ++i) slots.push_back(0), positions.push_back(i);
          for (int i = 0; i < 4; ++i) slots.push_back(1), positions.push_back(9 + i);
          const int64_t rows = static_cast<int64_t>(slots.size());
          const int64_t qk_dim = static_cast<int64_t>(shape.k_heads) * kd;
          const int64_t stride = 2 * qk_dim + static_cast<int64_t>(shape.v_heads) * vd + 1;
          std::vector<float> qkv = Random(rows * stride);
          ThreadPool one(1);
          CpuBackend plain(&one, CpuOptions{});
          plain.L2Norm({qkv.data(), rows, 2 * shape.k_heads, kd, stride, 1e-6f});
          const int64_t ab_stride = 2 * shape.v_heads;
          std::vector<float> ab = Random(rows * ab_stride, -3.0f, 3.0f);
          std::vector<float> a_log = Random(shape.v_heads, -2.0f, 1.0f);
          std::vector<float> dt_bias = Random(shape.v_heads);
          std::vector<float> state = Random(2 * shape.v_heads * head_state);
          std::vector<float> ref_state = state;
          std::vector<float> got = Poison(rows * shape.v_heads * vd), want = got;
          GatedDeltaRuleParams p;
          p.out = got.data();
          p.q = qkv.data();
          p.k = qkv.data() + qk_dim;
          p.qk_stride = stride;
          p.v = qkv.data() + 2 * qk_dim;
          p.v_stride = stride;
          p.a = ab.data();
          p.b = ab.data() + shape.v_heads;
          p.ab_stride = ab_stride;
          p.a_log = a_log.data();
          p.dt_bias = dt_bias.data();
          p.states = state.data();
          p.slots = slots.data();
          p.positions = positions.data();
          p.rows = rows;
          p.k_heads = shape.k_heads;
          p.v_heads = shape.v_heads;
          p.k_dim = kd;
          p.v_dim = vd;
          p.scale = 1.0f / std::sqrt(static_cast<float>(kd));
          p.chunk = chunk;
          ASSERT_TRUE(p.Check().ok()) << p.Check().message();
          GatedDeltaRuleParams ref = p;
          ref.out = want.data();
          ref.states = ref_state.data();
          backend.GatedDeltaRule(p);
          ReferenceGatedDeltaRule(ref);
          const double out_scale = std::max(1.0, MaxAbs(want));
          const double state_scale = std::max(1.0, MaxAbs(ref_state));
          const std::string what = "shape " + std::to_string(shape.k_heads) + "/" +
                                   std::to_string(shape.v_heads) + " length " +
                                   std::to_string(length) + " chunk " + std::to_string(chunk) +
                                   " threads " + std::to_string(threads);
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], want[i], 2e-5 * out_scale) << what << " out " << i;
          for (size_t i = 0; i < state.size(); ++i)
            ASSERT_NEAR(state[i], ref_state[i], 2e-5 * state_scale) << what << " state " << i;
        }
      }
    }
  }
}

// The chunked form against the backend's own one-row steps (the decode path): the same rows fed
// one per call give the same outputs and states up to float32 rounding.
TEST_F(RecurrentOpsTest, GatedDeltaRuleChunksEqualDecodeSteps) {
  ThreadPool pool(2);
  CpuBackend backend(&pool, CpuOptions{});
  const int k_heads = 2, v_heads = 4, kd = 32, vd = 24;
  const int64_t rows = 150, qk_dim = k_heads * kd, stride = 2 * qk_dim + v_heads * vd;
  std::vector<float> qkv = Random(rows * stride);
  backend.L2Norm({qkv.data(), rows, 2 * k_heads, kd, stride, 1e-6f});
  std::vector<float> ab = Random(rows * 2 * v_heads, -3.0f, 3.0f);
  std::vector<float> a_log = Random(v_heads, -2.0f, 1.0f), dt_bias = Random(v_heads);
  std::vector<int32_t> slots(rows, 0), positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r);
  GatedDeltaRuleParams p;
  p.q = qkv.data(), p.k = qkv.data() + qk_dim, p.qk_stride = stride;
  p.v = qkv.data() + 2 * qk_dim, p.v_stride = stride;
  p.a = ab.data(), p.b = ab.data() + v_heads, p.ab_stride = 2 * v_heads;
  p.a_log = a_log.data(), p.dt_bias = dt_bias.data();
  p.k_heads = k_heads, p.v_heads = v_heads, p.k_dim = kd, p.v_dim = vd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kd));
  std::vector<float> decoded = Poison(rows * v_heads * vd);
  std::vector<float> decode_state = Random(v_heads * kd * vd);
  for (int64_t r = 0; r < rows; ++r) {
    GatedDeltaRuleParams one = p;
    one.out = decoded.data() + r * v_heads * vd;
    one.q += r * stride, one.k += r * stride, one.v += r * stride;
    one.a += r * 2 * v_heads, one.b += r * 2 * v_heads;
    one.states = decode_state.data();
    one.slots = slots.data() + r;
    one.positions = positions.data() + r;
    one.rows = 1;
    backend.GatedDeltaRule(one);
  }
  for (int chunk : {2, 7, 64}) {
    // In pieces of 5 rows, then the rest: chunks continue across calls.
    std::vector<float> out = Poison(rows * v_heads * vd);
    std::vector<float> state = Random(v_heads * kd * vd);
    for (int64_t r0 = 0; r0 < rows;) {
      const int64_t n = r0 == 0 ? 5 : rows - r0;
      GatedDeltaRuleParams piece = p;
      piece.out = out.data() + r0 * v_heads * vd;
      piece.q += r0 * stride, piece.k += r0 * stride, piece.v += r0 * stride;
      piece.a += r0 * 2 * v_heads, piece.b += r0 * 2 * v_heads;
      piece.states = state.data();
      piece.slots = slots.data() + r0;
      piece.positions = positions.data() + r0;
      piece.rows = n;
      piece.chunk = chunk;
      backend.GatedDeltaRule(piece);
      r0 += n;
    }
    const double out_scale = std::max(1.0, MaxAbs(decoded));
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], decoded[i], 2e-5 * out_scale) << "chunk " << chunk << " at " << i;
    const double state_scale = std::max(1.0, MaxAbs(decode_state));
    for (size_t i = 0; i < state.size(); ++i)
      ASSERT_NEAR(state[i], decode_state[i], 2e-5 * state_scale) << "chunk " << chunk << " " << i;
  }
}

// The CUDA backend's chunk-parallel form (backend/cuda/recurrent.cu: DeltaRuleChunkKernel,
// DeltaRuleStateKernel, DeltaRuleOutputKernel) written out on the CPU in T, its steps in the
// kernels' order: per chunk of 64 rows from its run's start, G, A and P, then [w | u] = (I +
// A)^-1 [beta e^G k | beta v] by forward substitution (four partial sums as the kernel's); per
// run, the chunks in order: delta = u - w S0, out = e^G S0^T (scale q), S = e^G_last S0 +
// sum_t e^(G_last - G_t) k_t delta_t^T; then out += P delta. Every run goes this way (the
// kernels' min_chunked_rows 1), runs found by slot as the kernels find them.
template <typename T>
void ChunkParallelDeltaRule(const GatedDeltaRuleParams& p, std::vector<T>* states,
                            std::vector<T>* out) {
  constexpr int64_t kC = 64;
  const int64_t kd = p.k_dim, vd = p.v_dim, vh = p.v_heads;
  const int group = p.v_heads / p.k_heads;
  out->assign(p.rows * vh * vd, T(0));
  for (int64_t r0 = 0; r0 < p.rows;) {
    int64_t n = 1;
    while (r0 + n < p.rows && p.slots[r0 + n] == p.slots[r0]) ++n;
    for (int h = 0; h < p.v_heads; ++h) {
      T* st = states->data() + (p.slots[r0] * vh + h) * kd * vd;
      if (p.positions[r0] == 0) std::fill(st, st + kd * vd, T(0));
      const int64_t kh = h / group;
      const T a_scale = std::exp(static_cast<T>(p.a_log[h]));
      for (int64_t base = r0; base < r0 + n; base += kC) {
        const int64_t c = std::min(kC, r0 + n - base);
        auto q = [&](int64_t t, int64_t i) {
          return static_cast<T>(p.q[(base + t) * p.qk_stride + kh * kd + i]) * T(p.scale);
        };
        auto k = [&](int64_t t, int64_t i) {
          return static_cast<T>(p.k[(base + t) * p.qk_stride + kh * kd + i]);
        };
        std::vector<T> g(c), beta(c);
        T total = 0;
        for (int64_t t = 0; t < c; ++t) {
          const T x = static_cast<T>(p.a[(base + t) * p.ab_stride + h]) + T(p.dt_bias[h]);
          total += -a_scale * (x > T(20) ? x : std::log1p(std::exp(x)));
          g[t] = total;
          beta[t] = T(1) / (T(1) + std::exp(-static_cast<T>(p.b[(base + t) * p.ab_stride + h])));
        }
        // Step 1: A, P, then w and u.
        std::vector<T> a(c * c, T(0)), pm(c * c, T(0)), x(c * (kd + vd));
        for (int64_t t = 0; t < c; ++t) {
          for (int64_t s = 0; s <= t; ++s) {
            T kk = 0, qk = 0;
            for (int64_t i = 0; i < kd; ++i) kk += k(t, i) * k(s, i), qk += q(t, i) * k(s, i);
            const T decay = std::exp(g[t] - g[s]);
            if (s < t) a[t * c + s] = beta[t] * decay * kk;
            pm[t * c + s] = decay * qk;
          }
        }
        for (int64_t t = 0; t < c; ++t) {
          const T be = beta[t] * std::exp(g[t]);
          for (int64_t i = 0; i < kd; ++i) x[t * (kd + vd) + i] = be * k(t, i);
          for (int64_t j = 0; j < vd; ++j) {
            x[t * (kd + vd) + kd + j] =
                beta[t] * static_cast<T>(p.v[(base + t) * p.v_stride + h * vd + j]);
          }
        }
        for (int64_t col = 0; col < kd + vd; ++col) {
          for (int64_t t = 1; t < c; ++t) {
            T part[4] = {x[t * (kd + vd) + col], 0, 0, 0};
            for (int64_t s = 0; s < t; ++s) part[s % 4] -= a[t * c + s] * x[s * (kd + vd) + col];
            x[t * (kd + vd) + col] = (part[0] + part[1]) + (part[2] + part[3]);
          }
        }
        // Step 2: the deltas and the output's part from the state, then the state.
        std::vector<T> delta(c * vd);
        for (int64_t t = 0; t < c; ++t) {
          const T eq = std::exp(g[t]);
          for (int64_t j = 0; j < vd; ++j) {
            T ws = 0, qs = 0;
            for (int64_t i = 0; i < kd; ++i) {
              ws += x[t * (kd + vd) + i] * st[i * vd + j];
              qs += eq * q(t, i) * st[i * vd + j];
            }
            delta[t * vd + j] = x[t * (kd + vd) + kd + j] - ws;
            (*out)[((base + t) * vh + h) * vd + j] = qs;
          }
        }
        const T last = g[c - 1];
        for (int64_t i = 0; i < kd; ++i) {
          for (int64_t j = 0; j < vd; ++j) {
            T up = 0;
            for (int64_t t = 0; t < c; ++t)
              up += std::exp(last - g[t]) * k(t, i) * delta[t * vd + j];
            st[i * vd + j] = std::exp(last) * st[i * vd + j] + up;
          }
        }
        // Step 3: out += P delta.
        for (int64_t t = 0; t < c; ++t) {
          for (int64_t j = 0; j < vd; ++j) {
            T sum = 0;
            for (int64_t s = 0; s <= t; ++s) sum += pm[t * c + s] * delta[s * vd + j];
            (*out)[((base + t) * vh + h) * vd + j] += sum;
          }
        }
      }
    }
    r0 += n;
  }
}

// The recurrence in double throughout (the state never rounded to float32 between rows).
void DoubleRecurrence(const GatedDeltaRuleParams& p, std::vector<double>* states,
                      std::vector<double>* out) {
  const int64_t kd = p.k_dim, vd = p.v_dim, vh = p.v_heads;
  const int group = p.v_heads / p.k_heads;
  out->assign(p.rows * vh * vd, 0.0);
  std::vector<double> kv(vd);
  for (int64_t r = 0; r < p.rows; ++r) {
    double* slot = states->data() + p.slots[r] * vh * kd * vd;
    if (p.positions[r] == 0) std::fill(slot, slot + vh * kd * vd, 0.0);
    for (int h = 0; h < p.v_heads; ++h) {
      double* s = slot + h * kd * vd;
      const float* q = p.q + r * p.qk_stride + (h / group) * kd;
      const float* k = p.k + r * p.qk_stride + (h / group) * kd;
      const float* v = p.v + r * p.v_stride + h * vd;
      const double x = static_cast<double>(p.a[r * p.ab_stride + h]) + p.dt_bias[h];
      const double decay = std::exp(-std::exp(static_cast<double>(p.a_log[h])) *
                                    (x > 20 ? x : std::log1p(std::exp(x))));
      const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(p.b[r * p.ab_stride + h])));
      std::fill(kv.begin(), kv.end(), 0.0);
      for (int64_t i = 0; i < kd; ++i) {
        for (int64_t j = 0; j < vd; ++j) {
          s[i * vd + j] *= decay;
          kv[j] += s[i * vd + j] * k[i];
        }
      }
      for (int64_t j = 0; j < vd; ++j) kv[j] = beta * (v[j] - kv[j]);
      for (int64_t i = 0; i < kd; ++i) {
        for (int64_t j = 0; j < vd; ++j) {
          s[i * vd + j] += k[i] * kv[j];
          (*out)[(r * vh + h) * vd + j] += s[i * vd + j] * p.scale * q[i];
        }
      }
    }
  }
}

template <typename T>
double MaxAbsOf(const std::vector<T>& v) {
  double m = 0.0;
  for (T x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// The chunk-parallel form's math: in double it equals the double recurrence to 1e-10 of the
// largest output and state (so the split is exact algebra); in float32 it stays within 2e-5 of
// the float64 reference (about 5e-7 seen; the CUDA tests allow 1e-4). Several runs a step (from
// position 0 over a garbage state and continuing a random one, lengths of 1, 5, 16, 17, 64, 65,
// 77, 130 and 200), key heads fewer than value heads, dims 16 to 128; two steps, the second
// continuing the first.
TEST_F(RecurrentOpsTest, GatedDeltaRuleChunkParallelFormEqualsRecurrence) {
  struct Shape {
    int k_heads, v_heads, k_dim, v_dim;
  };
  struct Run {
    int32_t slot, position;
    int64_t rows;
  };
  const std::vector<std::vector<Run>> steps = {
      {{1, 0, 130}, {0, 9, 1}, {2, 40, 17}, {3, 0, 77}, {4, 12, 5}},
      {{3, 77, 16}, {1, 130, 65}, {0, 10, 1}, {2, 57, 200}, {4, 17, 64}}};
  constexpr int kSlots = 5;
  for (const Shape& sh :
       {Shape{2, 4, 16, 12}, Shape{1, 2, 64, 40}, Shape{2, 4, 32, 32}, Shape{1, 2, 128, 64}}) {
    const int64_t kd = sh.k_dim, vd = sh.v_dim, head_state = kd * vd;
    std::vector<float> a_log(sh.v_heads), dt_bias = Random(sh.v_heads, -0.5f, 0.5f);
    std::uniform_real_distribution<float> decay(0.02f, 0.25f);
    for (float& v : a_log) v = std::log(decay(rng_));
    const std::vector<float> start = Random(kSlots * sh.v_heads * head_state, -0.3f, 0.3f);
    std::vector<float> ref_states = start, f_states = start;
    std::vector<double> d_states(start.begin(), start.end()), exact_states = d_states;
    for (const auto& runs : steps) {
      std::vector<int32_t> slots, positions;
      for (const Run& run : runs) {
        for (int64_t i = 0; i < run.rows; ++i) {
          slots.push_back(run.slot), positions.push_back(run.position + static_cast<int32_t>(i));
        }
      }
      const int64_t rows = static_cast<int64_t>(slots.size());
      const int64_t qk_dim = static_cast<int64_t>(sh.k_heads) * kd;
      const int64_t stride = 2 * qk_dim + sh.v_heads * vd + 3;
      std::vector<float> qkv = Random(rows * stride);
      ReferenceL2Norm({qkv.data(), rows, 2 * sh.k_heads, sh.k_dim, stride, 1e-6f});
      std::vector<float> ab = Random(rows * 2 * sh.v_heads);
      std::vector<float> want = Poison(rows * sh.v_heads * vd);
      GatedDeltaRuleParams p;
      p.out = want.data();
      p.q = qkv.data(), p.k = qkv.data() + qk_dim, p.qk_stride = stride;
      p.v = qkv.data() + 2 * qk_dim, p.v_stride = stride;
      p.a = ab.data(), p.b = ab.data() + sh.v_heads, p.ab_stride = 2 * sh.v_heads;
      p.a_log = a_log.data(), p.dt_bias = dt_bias.data();
      p.states = ref_states.data();
      p.slots = slots.data(), p.positions = positions.data(), p.rows = rows;
      p.k_heads = sh.k_heads, p.v_heads = sh.v_heads, p.k_dim = sh.k_dim, p.v_dim = sh.v_dim;
      p.scale = 1.0f / std::sqrt(static_cast<float>(kd));
      ASSERT_TRUE(p.Check().ok()) << p.Check().message();
      ReferenceGatedDeltaRule(p);
      std::vector<double> exact, d_out;
      std::vector<float> f_out;
      DoubleRecurrence(p, &exact_states, &exact);
      ChunkParallelDeltaRule(p, &d_states, &d_out);
      ChunkParallelDeltaRule(p, &f_states, &f_out);
      const std::string what = "k_dim " + std::to_string(kd) + " v_dim " + std::to_string(vd) +
                               " rows " + std::to_string(rows);
      const double out_bound = MaxAbsOf(exact), state_bound = MaxAbsOf(exact_states);
      for (size_t i = 0; i < exact.size(); ++i) {
        ASSERT_NEAR(d_out[i], exact[i], 1e-10 * out_bound) << what << " double out " << i;
        ASSERT_NEAR(f_out[i], want[i], 2e-5 * out_bound) << what << " float out " << i;
      }
      for (size_t i = 0; i < exact_states.size(); ++i) {
        ASSERT_NEAR(d_states[i], exact_states[i], 1e-10 * state_bound) << what << " double state";
        ASSERT_NEAR(f_states[i], ref_states[i], 2e-5 * state_bound) << what << " float state";
      }
    }
  }
}

}  // namespace
}  // namespace gizllm
