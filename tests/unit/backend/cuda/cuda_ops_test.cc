// Every elementwise, norm, rotary, KV write and matmul op of the CUDA backend against the CPU
// scalar reference on fresh random inputs, sizes that are not tile multiples, outputs poisoned.
#include <algorithm>
#include <iterator>
#include <numeric>
#include <tuple>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

TEST(CudaBackendTest, DeviceCountNeverFails) {
  int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  if (count == 0) {
    auto backend = MakeCudaBackend(CudaOptions{});
    EXPECT_FALSE(backend.ok());
  }
}

TEST(CudaBackendTest, RejectsBadOptions) {
  CudaOptions options;
  options.device = -1;
  EXPECT_FALSE(options.Check().ok());
}

TEST(CudaBackendTest, EmbedBf16AndF32) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(1);
  const int64_t vocab = 77, dim = 300, rows = 9;
  std::vector<float> table_f = RandomFloats(rng, vocab * dim);
  std::vector<int32_t> tokens(rows);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  for (Format format : {Format::kBf16, Format::kF32}) {
    std::vector<uint16_t> table_b = ToBf16(table_f);
    Weight host{format, vocab, dim};
    host.data = format == Format::kBf16 ? static_cast<const void*>(table_b.data())
                                        : static_cast<const void*>(table_f.data());
    std::unique_ptr<Buffer> storage;
    auto dev_table = backend->PrepareWeight(host, &storage);
    ASSERT_TRUE(dev_table.ok()) << dev_table.status().message();
    DeviceArray<int32_t> d_tokens(backend.get(), tokens);
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * dim));
    out.Poison();
    EmbedParams p{out.device(), &*dev_table, d_tokens.device(), rows};
    backend->Embed(p);
    EmbedParams ref{out.host().data(), &host, tokens.data(), rows};
    ReferenceEmbed(ref);
    EXPECT_EQ(RelativeError(out.Read(), out.host()), 0.0);
  }
}

TEST(CudaBackendTest, RmsNormPlainAndFusedResidual) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(2);
  for (auto [rows, dim, offset, fused, in_place] :
       {std::tuple{5, 1000, 0.0f, false, false}, std::tuple{3, 4099, 1.0f, true, false},
        std::tuple{7, 384, 0.0f, true, true}, std::tuple{1, 33, 0.0f, false, true}}) {
    DeviceArray<float> x(backend.get(), RandomFloats(rng, rows * dim));
    DeviceArray<float> residual(backend.get(), RandomFloats(rng, rows * dim));
    DeviceArray<float> weight(backend.get(), RandomFloats(rng, dim));
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * dim));
    if (!in_place) out.Poison();
    RmsNormParams p;
    p.out = in_place ? x.device() : out.device();
    p.x = x.device();
    p.residual = fused ? residual.device() : nullptr;
    p.weight = weight.device();
    p.rows = rows;
    p.dim = dim;
    p.eps = 1e-5f;
    p.offset = offset;
    ASSERT_TRUE(p.Check().ok());
    backend->RmsNorm(p);
    std::vector<float> want(rows * dim);
    RmsNormParams ref = p;
    ref.out = want.data();
    ref.x = x.host().data();
    ref.residual = fused ? residual.host().data() : nullptr;
    ref.weight = weight.host().data();
    ReferenceRmsNorm(ref);
    std::vector<float> got = in_place ? x.Read() : out.Read();
    EXPECT_LT(RelativeError(got, want), 1e-5) << rows << "x" << dim;
    if (fused) {
      EXPECT_LT(RelativeError(residual.Read(), residual.host()), 1e-6);
    }
  }
}

TEST(CudaBackendTest, RopeWithAndWithoutNorm) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(3);
  for (auto [rows, heads, head_dim, rotary_dims, norm] :
       {std::tuple{5, 3, 64, 64, true}, std::tuple{2, 8, 128, 128, false},
        std::tuple{3, 2, 128, 64, true}, std::tuple{1, 5, 256, 256, true}}) {
    DeviceArray<float> x(backend.get(), RandomFloats(rng, rows * heads * head_dim));
    std::vector<int32_t> positions(rows);
    for (auto& p : positions) p = static_cast<int32_t>(rng() % 9000);
    DeviceArray<int32_t> d_positions(backend.get(), positions);
    std::vector<float> inv_freq(rotary_dims / 2);
    for (int i = 0; i < rotary_dims / 2; ++i)
      inv_freq[i] = std::pow(1e6f, -2.0f * i / static_cast<float>(rotary_dims));
    DeviceArray<float> d_inv(backend.get(), inv_freq);
    DeviceArray<float> weight(backend.get(), RandomFloats(rng, head_dim));
    RopeParams p;
    p.x = x.device();
    p.rows = rows;
    p.heads = heads;
    p.head_dim = head_dim;
    p.rotary_dims = rotary_dims;
    p.positions = d_positions.device();
    p.inv_freq = d_inv.device();
    p.norm = norm ? weight.device() : nullptr;
    ASSERT_TRUE(p.Check().ok());
    backend->Rope(p);
    RopeParams ref = p;
    std::vector<float> want = x.host();
    ref.x = want.data();
    ref.positions = positions.data();
    ref.inv_freq = inv_freq.data();
    ref.norm = norm ? weight.host().data() : nullptr;
    ReferenceRope(ref);
    EXPECT_LT(RelativeError(x.Read(), want), 1e-5) << head_dim << " " << rotary_dims;
  }
}

TEST(CudaBackendTest, KvWriteScattersIntoPages) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(4);
  const int kv_heads = 3, head_dim = 64, slots = 3, max_pages = 5, pages = slots * max_pages;
  const int rows = 11;
  std::vector<int32_t> table(slots * max_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> row_slots(rows), row_positions(rows);
  for (int r = 0; r < rows; ++r) {
    row_slots[r] = r % slots;
    row_positions[r] = static_cast<int32_t>(r / slots * 17 + rng() % 7);
  }
  size_t cache_size = static_cast<size_t>(pages) * kPage * kv_heads * head_dim;
  DeviceArray<float> keys(backend.get(), RandomFloats(rng, cache_size));
  DeviceArray<float> values(backend.get(), RandomFloats(rng, cache_size));
  DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * kv_heads * head_dim));
  DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * kv_heads * head_dim));
  DeviceArray<int32_t> d_table(backend.get(), table), d_slots(backend.get(), row_slots),
      d_positions(backend.get(), row_positions);
  KvWriteParams p;
  p.cache = {keys.device(), values.device()};
  p.table = {d_table.device(), max_pages};
  p.k = k.device();
  p.v = v.device();
  p.slots = d_slots.device();
  p.positions = d_positions.device();
  p.rows = rows;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  ASSERT_TRUE(p.Check().ok());
  backend->KvWrite(p);
  KvWriteParams ref = p;
  ref.cache = {keys.host().data(), values.host().data()};
  ref.table = {table.data(), max_pages};
  ref.k = k.host().data();
  ref.v = v.host().data();
  ref.slots = row_slots.data();
  ref.positions = row_positions.data();
  ReferenceKvWrite(ref);
  EXPECT_EQ(RelativeError(keys.Read(), keys.host()), 0.0);
  EXPECT_EQ(RelativeError(values.Read(), values.host()), 0.0);
}

// fp16 pages: each key and value rounded to the nearest fp16, saturated at +-65504, as the
// reference (and the CPU backend) store them; bit for bit, at an odd head_dim (elements written
// one at a time), with values past fp16's range, at its rounding edges and below its normal range.
TEST(CudaBackendTest, KvWriteF16PagesRoundLikeTheReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(41);
  for (int head_dim : {64, 33}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const int kv_heads = 3, slots = 3, max_pages = 5, pages = slots * max_pages, rows = 11;
    std::vector<int32_t> table(slots * max_pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> row_slots(rows), row_positions(rows);
    for (int r = 0; r < rows; ++r) {
      row_slots[r] = r % slots;
      row_positions[r] = static_cast<int32_t>(r / slots * 17 + rng() % 7);
    }
    const size_t cache_size = static_cast<size_t>(pages) * kPage * kv_heads * head_dim;
    std::vector<uint16_t> old_keys(cache_size), old_values(cache_size);
    for (size_t i = 0; i < cache_size; ++i) {
      old_keys[i] = static_cast<uint16_t>(rng());
      old_values[i] = static_cast<uint16_t>(rng());
    }
    DeviceArray<uint16_t> keys(backend.get(), old_keys), values(backend.get(), old_values);
    std::vector<float> k_host = RandomFloats(rng, rows * kv_heads * head_dim, 4.0f);
    std::vector<float> v_host = RandomFloats(rng, rows * kv_heads * head_dim, 0.01f);
    const float edges[] = {7e4f,  -1e6f,  65519.0f, 65520.0f,           -65504.0f,
                           1e-6f, -3e-8f, 6e-5f,    1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048};
    for (size_t i = 0; i < std::size(edges); ++i) {
      k_host[7 * i] = edges[i];
      v_host[5 * i + 1] = -edges[i];
    }
    DeviceArray<float> k(backend.get(), k_host), v(backend.get(), v_host);
    DeviceArray<int32_t> d_table(backend.get(), table), d_slots(backend.get(), row_slots),
        d_positions(backend.get(), row_positions);
    KvWriteParams p;
    p.cache = {keys.device(), values.device(), KvFormat::kF16};
    p.table = {d_table.device(), max_pages};
    p.k = k.device();
    p.v = v.device();
    p.slots = d_slots.device();
    p.positions = d_positions.device();
    p.rows = rows;
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    ASSERT_TRUE(p.Check().ok());
    backend->KvWrite(p);
    KvWriteParams ref = p;
    ref.cache = {keys.host().data(), values.host().data(), KvFormat::kF16};
    ref.table = {table.data(), max_pages};
    ref.k = k.host().data();
    ref.v = v.host().data();
    ref.slots = row_slots.data();
    ref.positions = row_positions.data();
    ReferenceKvWrite(ref);
    EXPECT_NE(keys.host(), old_keys);
    EXPECT_TRUE(keys.Read() == keys.host());
    EXPECT_TRUE(values.Read() == values.host());
  }
}

TEST(CudaBackendTest, SwiGluAddGather) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(5);
  const int64_t n = 12345;
  DeviceArray<float> gate(backend.get(), RandomFloats(rng, n, 3.0f));
  DeviceArray<float> up(backend.get(), RandomFloats(rng, n));
  DeviceArray<float> out(backend.get(), std::vector<float>(n));
  out.Poison();
  backend->Glu(GluParams{out.device(), gate.device(), up.device(), n});
  std::vector<float> want(n);
  ReferenceGlu(GluParams{want.data(), gate.host().data(), up.host().data(), n});
  EXPECT_LT(RelativeError(out.Read(), want), 1e-6);

  DeviceArray<float> acc(backend.get(), RandomFloats(rng, n));
  backend->Add(AddParams{acc.device(), gate.device(), n});
  ReferenceAdd(AddParams{acc.host().data(), gate.host().data(), n});
  EXPECT_LT(RelativeError(acc.Read(), acc.host()), 1e-7);

  const int64_t rows = 13, dim = 257, count = 6;
  DeviceArray<float> x(backend.get(), RandomFloats(rng, rows * dim));
  std::vector<int32_t> index(count);
  for (auto& i : index) i = static_cast<int32_t>(rng() % rows);
  DeviceArray<int32_t> d_index(backend.get(), index);
  DeviceArray<float> gathered(backend.get(), std::vector<float>(count * dim));
  gathered.Poison();
  backend->GatherRows(
      GatherRowsParams{gathered.device(), x.device(), d_index.device(), count, dim});
  ReferenceGatherRows(
      GatherRowsParams{gathered.host().data(), x.host().data(), index.data(), count, dim});
  EXPECT_EQ(RelativeError(gathered.Read(), gathered.host()), 0.0);
}

// CopyOnDevice copies a part of one buffer into another at odd offsets, in order with the ops
// before and after it: an Add into the source before the copy, and into the target after it.
TEST(CudaBackendTest, CopyOnDeviceInOrderWithTheOps) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(9);
  const int64_t n = 100003, from = 17, to = 5, count = 70001;
  DeviceArray<float> src(backend.get(), RandomFloats(rng, n));
  DeviceArray<float> add(backend.get(), RandomFloats(rng, n));
  DeviceArray<float> dst(backend.get(), std::vector<float>(n));
  dst.Poison();
  backend->Add(AddParams{src.device(), add.device(), n});
  backend->CopyOnDevice(dst.device() + to, src.device() + from, count * sizeof(float));
  backend->Add(AddParams{dst.device() + to, add.device(), count});
  const std::vector<float> got = dst.Read();
  std::vector<float> want(count);
  for (int64_t i = 0; i < count; ++i)
    want[i] = (src.host()[from + i] + add.host()[from + i]) + add.host()[i];
  EXPECT_EQ(RelativeError(std::vector<float>(got.begin() + to, got.begin() + to + count), want),
            0.0);
  // The bytes around the copy stay as they were (poison).
  EXPECT_TRUE(std::isnan(got[to - 1]));
  EXPECT_TRUE(std::isnan(got[to + count]));
}

// One matmul case: `outputs` linears of `n + i` outputs over `cols` inputs, `rows` rows; the
// biases `bias_offset` floats into their buffers (1: not 16-byte aligned).
void CheckMatmul(Backend* backend, std::mt19937& rng, Format format, int64_t rows, int64_t n,
                 int64_t cols, int outputs, bool bias, double tolerance, int bias_offset = 0) {
  SCOPED_TRACE(FormatName(format) + " rows " + std::to_string(rows) + " n " + std::to_string(n) +
               " cols " + std::to_string(cols));
  DeviceArray<float> x(backend, RandomFloats(rng, rows * cols));
  std::vector<PlainWeight> weights(outputs);
  std::vector<std::unique_ptr<DeviceArray<float>>> outs, biases;
  MatmulParams p, ref;
  p.x = x.device();
  ref.x = x.host().data();
  p.rows = ref.rows = rows;
  p.outputs = ref.outputs = outputs;
  for (int i = 0; i < outputs; ++i) {
    int64_t ni = n + i;
    MakePlainWeight(backend, rng, format, ni, cols, &weights[i]);
    if (::testing::Test::HasFatalFailure()) return;
    outs.push_back(std::make_unique<DeviceArray<float>>(backend, std::vector<float>(rows * ni)));
    outs.back()->Poison();
    biases.push_back(
        std::make_unique<DeviceArray<float>>(backend, RandomFloats(rng, ni + bias_offset)));
    p.w[i] = &weights[i].device;
    ref.w[i] = &weights[i].host;
    p.out[i] = outs[i]->device();
    ref.out[i] = outs[i]->host().data();
    p.bias[i] = bias ? biases[i]->device() + bias_offset : nullptr;
    ref.bias[i] = bias ? biases[i]->host().data() + bias_offset : nullptr;
  }
  ASSERT_TRUE(p.Check().ok());
  backend->Matmul(p);
  ReferenceMatmul(ref);
  for (int i = 0; i < outputs; ++i)
    EXPECT_LT(RelativeError(outs[i]->Read(), outs[i]->host()), tolerance) << "output " << i;
}

TEST(CudaBackendTest, MatmulGemvRowsAreExact) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::mt19937 rng(6);
  // Float32 activations with exact weights: only the order of the sums differs.
  for (Format format : {Format::kBf16, Format::kF16, Format::kF32}) {
    for (int64_t rows : {1, 3, 8}) {
      CheckMatmul(backend.get(), rng, format, rows, 67, 1000, 1, false, 1e-5);
      CheckMatmul(backend.get(), rng, format, rows, 1030, 203, 3, true, 1e-5);
    }
  }
  // More rows than the GEMV kernel holds at once (pieces of 8).
  auto gemv_all = MakeBackend(false, /*gemv_max_rows=*/100);
  CheckMatmul(gemv_all.get(), rng, Format::kBf16, 19, 130, 4096, 2, true, 1e-5);
}

TEST(CudaBackendTest, MatmulExactModeManyRows) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/true);
  std::mt19937 rng(7);
  for (Format format : {Format::kBf16, Format::kF16, Format::kF32}) {
    CheckMatmul(backend.get(), rng, format, 9, 67, 1000, 1, true, 1e-4);
    CheckMatmul(backend.get(), rng, format, 130, 200, 77, 3, false, 1e-4);
  }
}

TEST(CudaBackendTest, MatmulFastModeManyRowsBf16) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(8);
  // bf16 activations into cuBLASLt: bf16 operands.
  CheckMatmul(backend.get(), rng, Format::kBf16, 9, 67, 1000, 1, true, 1e-2);
  CheckMatmul(backend.get(), rng, Format::kBf16, 130, 1030, 4096, 3, false, 1e-2);
  CheckMatmul(backend.get(), rng, Format::kBf16, 517, 300, 264, 2, true, 1e-2);
  // Biases in cuBLASLt's epilogue where 16-byte aligned, added after it where not.
  CheckMatmul(backend.get(), rng, Format::kBf16, 300, 64, 128, 3, true, 1e-2, /*bias_offset=*/1);
  CheckMatmul(backend.get(), rng, Format::kBf16, 1000, 768, 768, 1, true, 1e-2);
  // Other plain formats take the float32 kernel in fast mode too.
  CheckMatmul(backend.get(), rng, Format::kF32, 70, 33, 100, 1, false, 1e-4);
}

TEST(CudaBackendTest, QuantizedWeightsAreRefused) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::vector<uint8_t> codes(64 * 128);
  Weight w{Format::kQ4, 64, 128};
  w.data = codes.data();
  w.group = 128;
  std::unique_ptr<Buffer> storage;
  EXPECT_FALSE(backend->PrepareWeight(w, &storage).ok());
}

}  // namespace
}  // namespace gizllm::testing
