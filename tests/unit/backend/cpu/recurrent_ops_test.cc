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

}  // namespace
}  // namespace gizllm
