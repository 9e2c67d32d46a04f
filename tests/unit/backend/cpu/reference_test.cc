// Known answers for the scalar references, worked out by hand, so that the references the fast
// kernels are tested against are themselves checked.
#include "backend/cpu/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"

namespace gizllm {
namespace {

TEST(Reference, MatmulBf16WithBias) {
  // W = [[1, 2], [3, -4], [0.5, 0]] as bf16, x = [[1, 1], [2, -1]].
  std::vector<uint16_t> w;
  for (float v : {1.0f, 2.0f, 3.0f, -4.0f, 0.5f, 0.0f}) w.push_back(F32ToBf16(v));
  Weight weight{.format = Format::kBf16, .rows = 3, .cols = 2, .data = w.data()};
  std::vector<float> x = {1, 1, 2, -1};
  std::vector<float> bias = {10, 20, 30};
  std::vector<float> out(6, NAN);
  MatmulParams p;
  p.x = x.data();
  p.rows = 2;
  p.w[0] = &weight;
  p.out[0] = out.data();
  p.bias[0] = bias.data();
  ASSERT_TRUE(p.Check().ok());
  ReferenceMatmul(p);
  EXPECT_EQ(out, (std::vector<float>{13, 19, 30.5f, 10, 30, 31}));
}

TEST(Reference, RmsNormFusedResidual) {
  std::vector<float> x = {1, 2}, residual = {2, 2}, weight = {1, 2}, out(2, NAN);
  RmsNormParams p{.out = out.data(),
                  .x = x.data(),
                  .residual = residual.data(),
                  .weight = weight.data(),
                  .rows = 1,
                  .dim = 2,
                  .eps = 0.0f,
                  .offset = 1.0f};
  ReferenceRmsNorm(p);
  // residual = [3, 4]; rms = sqrt(12.5); out = [3, 4] / rms * [2, 3].
  EXPECT_EQ(residual, (std::vector<float>{3, 4}));
  EXPECT_NEAR(out[0], 6 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(out[1], 12 / std::sqrt(12.5), 1e-6);
}

TEST(Reference, RopeRotatesHalfPairs) {
  // head_dim 4, rotary 4: pairs (0, 2) and (1, 3); inv_freq = [1, 0.5]; position 2.
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> inv_freq = {1.0f, 0.5f};
  int32_t position = 2;
  RopeParams p{.x = x.data(),
               .rows = 1,
               .heads = 1,
               .head_dim = 4,
               .rotary_dims = 4,
               .positions = &position,
               .inv_freq = inv_freq.data()};
  ReferenceRope(p);
  double c0 = std::cos(2.0), s0 = std::sin(2.0), c1 = std::cos(1.0), s1 = std::sin(1.0);
  EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);
}

TEST(Reference, AttentionOverPagesWithWindow) {
  // One kv head of dim 1, slot 0's page table points at page 1; two positions with keys 0 and
  // ln 3 (scale 1, q = 1): weights 1/4 and 3/4 over values 4 and 8.
  std::vector<float> keys(2 * kPage), values(2 * kPage);
  keys[kPage + 0] = 0.0f;
  keys[kPage + 1] = std::log(3.0f);
  values[kPage + 0] = 4.0f;
  values[kPage + 1] = 8.0f;
  std::vector<int32_t> pages = {1};
  int32_t slot = 0, position = 1;
  float q = 1.0f, out = NAN;
  AttentionParams p{.out = &out,
                    .q = &q,
                    .cache = {keys.data(), values.data()},
                    .table = {pages.data(), 1},
                    .slots = &slot,
                    .positions = &position,
                    .rows = 1,
                    .heads = 1,
                    .kv_heads = 1,
                    .head_dim = 1,
                    .scale = 1.0f};
  ASSERT_TRUE(p.Check().ok());
  ReferenceAttention(p);
  EXPECT_NEAR(out, 7.0f, 1e-6);
  p.window = 1;  // only its own position
  ReferenceAttention(p);
  EXPECT_NEAR(out, 8.0f, 1e-6);
}

// 8-bit pages: codes in steps of max|x| / 127, ties to even; a zero vector has scale 0, one with
// a NaN or an infinity codes 0 and a NaN scale; attention reads codes times scales.
TEST(Reference, Q8KvWriteAndAttention) {
  const int dim = 6;
  std::vector<int8_t> keys(kPage * 2 * dim, 99), values(kPage * 2 * dim, 99);
  std::vector<float> key_scales(kPage * 2, -1.0f), value_scales(kPage * 2, -1.0f);
  std::vector<int32_t> pages = {0};
  // Row 0: kv head 0 has max 254 (scale 2): 63 -> 31.5 -> 32, 5 -> 2.5 -> 2, -3 -> -1.5 -> -2;
  // kv head 1 is zero. Row 1: a NaN key and an infinite value.
  std::vector<float> k = {254.0f, 63.0f, 5.0f, -3.0f, 1.0f, -254.0f, 0, 0, 0, 0, 0, 0,
                          1.0f,   NAN,   2.0f, 0,     0,    0,       1, 1, 1, 1, 1, 1};
  std::vector<float> v = k;
  v[13] = INFINITY;
  std::vector<int32_t> slots = {0, 0}, positions = {0, 1};
  KvWriteParams w{
      .cache = {keys.data(), values.data(), KvFormat::kQ8, key_scales.data(), value_scales.data()},
      .table = {pages.data(), 1},
      .k = k.data(),
      .v = v.data(),
      .slots = slots.data(),
      .positions = positions.data(),
      .rows = 2,
      .kv_heads = 2,
      .head_dim = dim};
  ASSERT_TRUE(w.Check().ok());
  ReferenceKvWrite(w);
  EXPECT_EQ(std::vector<int8_t>(keys.begin(), keys.begin() + 12),
            (std::vector<int8_t>{127, 32, 2, -2, 0, -127, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(key_scales[0], 2.0f);
  EXPECT_EQ(key_scales[1], 0.0f);
  EXPECT_TRUE(std::isnan(key_scales[2]));
  EXPECT_TRUE(std::isnan(value_scales[2]));
  EXPECT_EQ(std::vector<int8_t>(keys.begin() + 12, keys.begin() + 18), std::vector<int8_t>(6, 0));
  EXPECT_EQ(key_scales[3], 1.0f / 127.0f);
  EXPECT_EQ(keys[18], 127);
  // Row 0 (position 0) attends to itself alone: each head's output is its value as stored.
  std::vector<float> q(2 * dim, 0.1f), out(2 * dim, NAN);
  AttentionParams a{.out = out.data(),
                    .q = q.data(),
                    .cache = w.cache,
                    .table = {pages.data(), 1},
                    .slots = slots.data(),
                    .positions = positions.data(),
                    .rows = 1,
                    .heads = 2,
                    .kv_heads = 2,
                    .head_dim = dim,
                    .scale = 1.0f};
  ASSERT_TRUE(a.Check().ok());
  ReferenceAttention(a);
  const std::vector<float> head0 = {254.0f, 64.0f, 4.0f, -4.0f, 0.0f, -254.0f};
  for (int i = 0; i < dim; ++i) EXPECT_EQ(out[i], head0[i]) << i;
  for (int i = dim; i < 2 * dim; ++i) EXPECT_EQ(out[i], 0.0f) << i;
}

TEST(Reference, SwiGluAddGather) {
  std::vector<float> gate = {0.0f, 2.0f}, up = {5.0f, 3.0f}, out(2, NAN);
  ReferenceGlu({.out = out.data(), .gate = gate.data(), .up = up.data(), .n = 2});
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0 / (1.0 + std::exp(-2.0)) * 3.0, 1e-6);
  ReferenceAdd({.out = gate.data(), .x = up.data(), .n = 2});
  EXPECT_EQ(gate, (std::vector<float>{5, 5}));
  std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> index = {2, 0};
  std::vector<float> gathered(4, NAN);
  ReferenceGatherRows(
      {.out = gathered.data(), .x = rows.data(), .index = index.data(), .count = 2, .dim = 2});
  EXPECT_EQ(gathered, (std::vector<float>{5, 6, 1, 2}));
}

}  // namespace
}  // namespace gizllm
