// The CUDA backend's fused ops against the CPU scalar references of the ops they replace:
// RopeKv against Rope, Rope and KvWrite; Matmul's norm, accumulate and swiglu ends against
// RmsNorm, Matmul, Add and SwiGlu. Fresh random inputs, outputs poisoned, the GEMV shapes (fused
// in the kernel) and the shapes it leaves to the other paths (many rows: tiled float32 kernel or
// cuBLASLt).
#include <algorithm>
#include <numeric>
#include <string>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

// KV page bytes (float32 or fp16 elements) as float32 values.
std::vector<float> PagesAsFloats(const std::vector<uint8_t>& bytes, KvFormat format) {
  std::vector<float> out(bytes.size() / KvFormatBytes(format));
  for (size_t i = 0; i < out.size(); ++i) {
    if (format == KvFormat::kF16) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = F16ToF32(h);
    } else {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    }
  }
  return out;
}

TEST(CudaFusedTest, RopeKvEqualsRopeRopeKvWrite) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  ASSERT_TRUE(backend->FusesMatmul());
  std::mt19937 rng(21);
  for (auto [rows, heads, kv_heads, head_dim, rotary_dims, norms, format] :
       {std::tuple{1, 32, 8, 128, 128, true, KvFormat::kF32},
        std::tuple{7, 6, 2, 64, 64, false, KvFormat::kF32},
        std::tuple{5, 4, 4, 96, 64, true, KvFormat::kF32},
        std::tuple{1, 32, 8, 128, 128, true, KvFormat::kF16},
        std::tuple{7, 6, 2, 64, 64, false, KvFormat::kF16},
        std::tuple{40, 4, 4, 96, 64, true, KvFormat::kF16}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " head_dim " + std::to_string(head_dim) +
                 " pages " + KvFormatName(format));
    // Positions reach (rows / slots) * 5 + 4: 69 for 40 rows, block 4 of a slot's pages.
    const int slots = 3, max_pages = 5, pages = slots * max_pages;
    std::vector<int32_t> table(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> row_slots(rows), row_positions(rows), rotary(rows);
    for (int r = 0; r < rows; ++r) {
      row_slots[r] = r % slots;
      row_positions[r] = static_cast<int32_t>(r / slots * 5 + rng() % 5);
      rotary[r] = static_cast<int32_t>(rng() % 9000);
    }
    const size_t cache_size = static_cast<size_t>(pages) * kPage * kv_heads * head_dim;
    // The pages as bytes of float32 or fp16 elements, random where nothing is written.
    const size_t page_bytes = cache_size * KvFormatBytes(format);
    std::vector<uint8_t> random_bytes(page_bytes);
    const std::vector<float> random = RandomFloats(rng, cache_size);
    for (size_t i = 0; i < cache_size; ++i) {
      if (format == KvFormat::kF16) {
        const uint16_t h = F32ToF16(random[i]);
        std::memcpy(random_bytes.data() + 2 * i, &h, 2);
      } else {
        std::memcpy(random_bytes.data() + 4 * i, &random[i], 4);
      }
    }
    DeviceArray<uint8_t> keys(backend.get(), random_bytes);
    DeviceArray<uint8_t> values(backend.get(), random_bytes);
    DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * heads * head_dim));
    DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * kv_heads * head_dim));
    DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * kv_heads * head_dim));
    DeviceArray<int32_t> d_table(backend.get(), table), d_slots(backend.get(), row_slots),
        d_positions(backend.get(), row_positions), d_rotary(backend.get(), rotary);
    std::vector<float> inv_freq(rotary_dims / 2);
    for (int i = 0; i < rotary_dims / 2; ++i)
      inv_freq[i] = std::pow(1e6f, -2.0f * i / static_cast<float>(rotary_dims));
    DeviceArray<float> d_inv(backend.get(), inv_freq);
    DeviceArray<float> q_norm(backend.get(), RandomFloats(rng, head_dim));
    DeviceArray<float> k_norm(backend.get(), RandomFloats(rng, head_dim));

    RopeKvParams p;
    p.q = {q.device(),     rows,
           heads,          head_dim,
           rotary_dims,    d_rotary.device(),
           d_inv.device(), norms ? q_norm.device() : nullptr,
           1e-6f};
    p.k = p.q;
    p.k.x = k.device();
    p.k.heads = kv_heads;
    p.k.norm = norms ? k_norm.device() : nullptr;
    p.kv = {{keys.device(), values.device(), format},
            {d_table.device(), max_pages},
            k.device(),
            v.device(),
            d_slots.device(),
            d_positions.device(),
            rows,
            kv_heads,
            head_dim};
    ASSERT_TRUE(p.Check().ok()) << p.Check().message();
    backend->RopeKv(p);

    RopeKvParams ref = p;
    ref.q.x = q.host().data();
    ref.q.positions = ref.k.positions = rotary.data();
    ref.q.inv_freq = ref.k.inv_freq = inv_freq.data();
    ref.q.norm = norms ? q_norm.host().data() : nullptr;
    ref.k.x = k.host().data();
    ref.k.norm = norms ? k_norm.host().data() : nullptr;
    ref.kv = {{keys.host().data(), values.host().data(), format},
              {table.data(), max_pages},
              k.host().data(),
              v.host().data(),
              row_slots.data(),
              row_positions.data(),
              rows,
              kv_heads,
              head_dim};
    ReferenceRope(ref.q);
    ReferenceRope(ref.k);
    ReferenceKvWrite(ref.kv);
    EXPECT_LT(RelativeError(q.Read(), q.host()), 1e-5);
    EXPECT_LT(RelativeError(k.Read(), k.host()), 1e-5);
    // Keys: rotated to within 1e-5 of the reference (float32 sin and cos computed differently),
    // so an fp16 key may round one step (2^-11 of itself) the other way where the two straddle a
    // rounding edge: a few in a thousand elements, 1e-4 in norm at most. Values: bit for bit.
    EXPECT_LT(RelativeError(PagesAsFloats(keys.Read(), format), PagesAsFloats(keys.host(), format)),
              format == KvFormat::kF16 ? 1e-4 : 1e-5);
    EXPECT_TRUE(values.Read() == values.host());
  }
}

enum class End { kNorm, kNormSwiGlu, kAccumulate, kNormAccumulate };

std::string EndName(End end) {
  switch (end) {
    case End::kNorm:
      return "norm";
    case End::kNormSwiGlu:
      return "norm+swiglu";
    case End::kAccumulate:
      return "accumulate";
    case End::kNormAccumulate:
      return "norm+accumulate";
  }
  return "?";
}

// One fused matmul against the reference ops it stands for.
void CheckFused(Backend* backend, std::mt19937& rng, Format format, End end, int64_t rows,
                int64_t n, int64_t cols, bool bias, double tolerance) {
  SCOPED_TRACE(FormatName(format) + " " + EndName(end) + " rows " + std::to_string(rows) + " n " +
               std::to_string(n) + " cols " + std::to_string(cols));
  const bool norm = end != End::kAccumulate;
  const bool swiglu = end == End::kNormSwiGlu;
  const bool accumulate = end == End::kAccumulate || end == End::kNormAccumulate;
  const int outputs = swiglu ? 2 : end == End::kNorm ? 3 : 1;
  DeviceArray<float> x(backend, RandomFloats(rng, rows * cols, 2.0f));
  DeviceArray<float> gamma(backend, RandomFloats(rng, cols));
  std::vector<PlainWeight> weights(outputs);
  std::vector<std::unique_ptr<DeviceArray<float>>> outs, biases;
  MatmulParams p;
  p.x = x.device();
  p.rows = rows;
  p.outputs = outputs;
  if (norm) {
    p.norm = gamma.device();
    p.norm_eps = 1e-5f;
  }
  p.accumulate = accumulate;
  p.swiglu = swiglu;
  for (int i = 0; i < outputs; ++i) {
    const int64_t ni = swiglu ? n : n + i;
    MakePlainWeight(backend, rng, format, ni, cols, &weights[i]);
    if (::testing::Test::HasFatalFailure()) return;
    // Accumulating outputs start from random values (the residual stream); the others poisoned.
    outs.push_back(std::make_unique<DeviceArray<float>>(backend, RandomFloats(rng, rows * ni)));
    if (!accumulate) outs.back()->Poison();
    biases.push_back(std::make_unique<DeviceArray<float>>(backend, RandomFloats(rng, ni)));
    p.w[i] = &weights[i].device;
    p.out[i] = outs[i]->device();
    p.bias[i] = bias ? biases[i]->device() : nullptr;
  }
  ASSERT_TRUE(p.Check().ok()) << p.Check().message();
  backend->Matmul(p);

  // The reference: RmsNorm, the plain products, then SwiGlu or Add.
  std::vector<float> xn = x.host();
  if (norm) {
    ReferenceRmsNorm(
        RmsNormParams{xn.data(), x.host().data(), nullptr, gamma.host().data(), rows, cols, 1e-5f});
  }
  MatmulParams ref;
  ref.x = xn.data();
  ref.rows = rows;
  ref.outputs = outputs;
  std::vector<std::vector<float>> products(outputs);
  for (int i = 0; i < outputs; ++i) {
    products[i].resize(outs[i]->size());
    ref.w[i] = &weights[i].host;
    ref.out[i] = products[i].data();
    ref.bias[i] = bias ? biases[i]->host().data() : nullptr;
  }
  ReferenceMatmul(ref);
  if (swiglu) {
    std::vector<float> want(products[0].size());
    ReferenceGlu(GluParams{want.data(), products[0].data(), products[1].data(),
                           static_cast<int64_t>(want.size())});
    EXPECT_LT(RelativeError(outs[0]->Read(), want), tolerance);
  } else if (accumulate) {
    std::vector<float> want = outs[0]->host();
    ReferenceAdd(AddParams{want.data(), products[0].data(), static_cast<int64_t>(want.size())});
    EXPECT_LT(RelativeError(outs[0]->Read(), want), tolerance);
  } else {
    for (int i = 0; i < outputs; ++i)
      EXPECT_LT(RelativeError(outs[i]->Read(), products[i]), tolerance) << "output " << i;
  }
}

TEST(CudaFusedTest, GemvRunsTheEndsExactly) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(22);
  for (Format format : {Format::kBf16, Format::kF16, Format::kF32}) {
    for (End end : {End::kNorm, End::kNormSwiGlu, End::kAccumulate, End::kNormAccumulate}) {
      for (int64_t rows : {1, 2, 5, 8}) {
        CheckFused(backend.get(), rng, format, end, rows, 67, 1024, true, 1e-5);
        CheckFused(backend.get(), rng, format, end, rows, 1030, 4096, false, 1e-5);
      }
      // Inputs that are not a multiple of the vector pack: the scalar-load GEMV.
      CheckFused(backend.get(), rng, format, end, 3, 45, 203, true, 1e-5);
    }
  }
  // More rows than the GEMV holds at once (pieces of 8), fused in each piece.
  auto gemv_all = MakeBackend(false, /*gemv_max_rows=*/100);
  for (End end : {End::kNorm, End::kNormSwiGlu, End::kAccumulate})
    CheckFused(gemv_all.get(), rng, Format::kBf16, end, 19, 130, 2048, true, 1e-5);
}

TEST(CudaFusedTest, ManyRowsRunTheEnds) {
  GZ_SKIP_WITHOUT_CUDA();
  auto exact = MakeBackend(/*exact=*/true);
  auto fast = MakeBackend(/*exact=*/false, /*gemv_max_rows=*/1);
  std::mt19937 rng(23);
  for (End end : {End::kNorm, End::kNormSwiGlu, End::kAccumulate, End::kNormAccumulate}) {
    CheckFused(exact.get(), rng, Format::kBf16, end, 9, 67, 1000, true, 1e-4);
    CheckFused(exact.get(), rng, Format::kF32, end, 40, 130, 256, false, 1e-4);
    // Fast mode: bf16 activations into cuBLASLt; two rows already leave the GEMV.
    CheckFused(fast.get(), rng, Format::kBf16, end, 2, 300, 512, true, 1e-2);
    CheckFused(fast.get(), rng, Format::kBf16, end, 130, 1030, 4096, false, 1e-2);
  }
}

// Fast mode: the gate/up product's SwiGLU leaves a bf16 copy of its result that the down
// projection right after it reads; an op that writes that result in between (here an Add) must
// be seen by the down projection.
TEST(CudaFusedTest, SwiGluResultFeedsTheNextMatmul) {
  GZ_SKIP_WITHOUT_CUDA();
  auto fast = MakeBackend(/*exact=*/false, /*gemv_max_rows=*/1);
  std::mt19937 rng(24);
  const int64_t rows = 70, cols = 256, ffn = 384;
  for (bool add_between : {false, true}) {
    SCOPED_TRACE(add_between ? "add between" : "straight");
    DeviceArray<float> x(fast.get(), RandomFloats(rng, rows * cols));
    PlainWeight gate, up, down;
    MakePlainWeight(fast.get(), rng, Format::kBf16, ffn, cols, &gate);
    MakePlainWeight(fast.get(), rng, Format::kBf16, ffn, cols, &up);
    MakePlainWeight(fast.get(), rng, Format::kBf16, cols, ffn, &down);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    DeviceArray<float> h(fast.get(), std::vector<float>(rows * ffn)), u(fast.get(), h.host());
    DeviceArray<float> extra(fast.get(), RandomFloats(rng, rows * ffn));
    DeviceArray<float> y(fast.get(), std::vector<float>(rows * cols));
    h.Poison();
    y.Poison();
    MatmulParams mlp;
    mlp.x = x.device();
    mlp.rows = rows;
    mlp.outputs = 2;
    mlp.w[0] = &gate.device, mlp.w[1] = &up.device;
    mlp.out[0] = h.device(), mlp.out[1] = u.device();
    mlp.swiglu = true;
    fast->Matmul(mlp);
    if (add_between) fast->Add(AddParams{h.device(), extra.device(), rows * ffn});
    MatmulParams proj;
    proj.x = h.device();
    proj.rows = rows;
    proj.w[0] = &down.device;
    proj.out[0] = y.device();
    fast->Matmul(proj);

    std::vector<float> g(rows * ffn), v(rows * ffn), hh(rows * ffn), want(rows * cols);
    MatmulParams ref;
    ref.x = x.host().data();
    ref.rows = rows;
    ref.outputs = 2;
    ref.w[0] = &gate.host, ref.w[1] = &up.host;
    ref.out[0] = g.data(), ref.out[1] = v.data();
    ReferenceMatmul(ref);
    ReferenceGlu(GluParams{hh.data(), g.data(), v.data(), rows * ffn});
    if (add_between) ReferenceAdd(AddParams{hh.data(), extra.host().data(), rows * ffn});
    MatmulParams ref_down;
    ref_down.x = hh.data();
    ref_down.rows = rows;
    ref_down.w[0] = &down.host;
    ref_down.out[0] = want.data();
    ReferenceMatmul(ref_down);
    EXPECT_LT(RelativeError(h.Read(), hh), 1e-2);
    EXPECT_LT(RelativeError(y.Read(), want), 1e-2);
  }
}

}  // namespace
}  // namespace gizllm::testing
