// MoeFeedForward with quantized experts (q8, q4 with and without zeros, q2, q1; rotated and not)
// on the CUDA backend against the float64 reference (ReferenceMoeFeedForward) over the values the
// quantized weights stand for (quant::DequantizeOriginal, float32 in the inputs' basis): the
// decode kernels (1, 3 and 4 rows) and the grouped path (5 and 37 rows), top k 1 and 3, with and
// without accumulation, in exact and fast mode (quantized experts run in float32 in both), over
// group counts that are odd (a padding group) and even. Within 1e-4 of the largest output: sums
// in float32 in another order, the activations rotated in float32. The op records into a CUDA
// graph and replays.
#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"
#include "quant/quantize.h"

namespace gizllm::testing {
namespace {

// One expert weight quantized: its own arrays, its dequantized float32 values (the reference's
// weight) and the weight the backend placed.
struct QuantExpertWeight {
  quant::QuantizedLinear linear;
  std::vector<float> values;  // [rows, cols] in the original basis
  Weight reference, device;
  std::unique_ptr<Buffer> storage;
};

void MakeQuantWeight(Backend* backend, std::mt19937& rng, const quant::QuantizeOptions& options,
                     int64_t rows, int64_t cols, QuantExpertWeight* w) {
  auto q = quant::QuantizeLinear(RandomFloats(rng, rows * cols, 0.05f).data(), rows, cols, options);
  ASSERT_TRUE(q.ok()) << q.status().message();
  w->linear = std::move(*q);
  w->values.resize(rows * cols);
  quant::DequantizeOriginal(w->linear.View(), w->values.data());
  w->reference = Weight{Format::kF32, rows, cols};
  w->reference.data = w->values.data();
  auto prepared = backend->PrepareWeight(w->linear.View(), &w->storage);
  ASSERT_TRUE(prepared.ok()) << prepared.status().message();
  w->device = *prepared;
}

// Rows of x whose k-th and (k+1)-th router logits are at least 1e-3 apart, so that the device's
// float32 logits pick the experts the reference picks.
std::vector<float> SeparatedRows(std::mt19937& rng, const std::vector<float>& router, int experts,
                                 int64_t dim, int64_t rows, int k) {
  std::vector<float> x(rows * dim);
  std::vector<double> z(experts);
  for (int64_t r = 0; r < rows; ++r) {
    for (int attempt = 0;; ++attempt) {
      std::vector<float> row = RandomFloats(rng, dim);
      for (int e = 0; e < experts; ++e) {
        double s = 0.0;
        for (int64_t c = 0; c < dim; ++c) s += double{row[c]} * router[e * dim + c];
        z[e] = s;
      }
      std::sort(z.begin(), z.end(), std::greater<>());
      if (k < experts && z[k - 1] - z[k] < 1e-3 && attempt < 1000) continue;
      EXPECT_LT(attempt, 1000) << "no row with separated logits";
      std::copy(row.begin(), row.end(), x.begin() + r * dim);
      break;
    }
  }
  return x;
}

TEST(CudaMoeQuantTest, QuantizedExpertsMatchReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto exact = MakeBackend(true);
  auto fast = MakeBackend(false, /*gemv_max_rows=*/1);
  Backend* backends[2] = {exact.get(), fast.get()};
  std::mt19937 rng(31);
  struct Shape {
    int experts;
    int64_t dim, ffn;
  };
  const quant::QuantizeOptions formats[] = {{Format::kQ8, false, true},
                                            {Format::kQ4, true, true},
                                            {Format::kQ4, false, false},
                                            {Format::kQ2, true, true},
                                            {Format::kQ1, false, true}};
  for (Shape shape : {Shape{7, 384, 128}, Shape{4, 256, 256}}) {
    for (const quant::QuantizeOptions& options : formats) {
      const int experts = shape.experts;
      const int64_t dim = shape.dim, ffn = shape.ffn;
      PlainWeight router[2];
      for (int b = 0; b < 2; ++b) {
        std::mt19937 same(32);  // both backends' routers from the same draws
        MakePlainWeight(backends[b], same, Format::kF32, experts, dim, &router[b]);
      }
      // [backend][expert]; the reference reads backend 0's dequantized values.
      std::vector<QuantExpertWeight> gate[2], up[2], down[2];
      for (int b = 0; b < 2; ++b) {
        std::mt19937 same(33);
        for (auto* set : {&gate[b], &up[b], &down[b]}) set->resize(experts);
        for (int e = 0; e < experts; ++e) {
          MakeQuantWeight(backends[b], same, options, ffn, dim, &gate[b][e]);
          MakeQuantWeight(backends[b], same, options, ffn, dim, &up[b][e]);
          MakeQuantWeight(backends[b], same, options, dim, ffn, &down[b][e]);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      auto weights = [&](std::vector<QuantExpertWeight>& set, bool device) {
        std::vector<Weight> out;
        for (auto& w : set) out.push_back(device ? w.device : w.reference);
        return out;
      };
      for (int64_t rows : {1, 3, 4, 5, 37}) {
        for (int k : {1, 3}) {
          for (bool accumulate : {false, true}) {
            const std::string what = FormatName(options.format) + (options.zeros ? " zeros" : "") +
                                     (options.rotate ? " rotated" : "") + " dim " +
                                     std::to_string(dim) + " rows " + std::to_string(rows) +
                                     " top_k " + std::to_string(k) + " accumulate " +
                                     std::to_string(accumulate);
            std::vector<float> x = SeparatedRows(rng, router[0].values, experts, dim, rows, k);
            std::vector<float> start =
                accumulate ? RandomFloats(rng, rows * dim) : std::vector<float>(rows * dim);
            std::vector<float> want = start;
            MoeFeedForwardParams p;
            p.rows = rows;
            p.dim = dim;
            p.ffn = ffn;
            p.experts = experts;
            p.top_k = k;
            p.norm_topk_prob = true;
            p.accumulate = accumulate;
            {
              std::vector<Weight> g = weights(gate[0], false), u = weights(up[0], false),
                                  d = weights(down[0], false);
              MoeFeedForwardParams r = p;
              r.out = want.data();
              r.x = x.data();
              r.router = &router[0].host;
              r.gate = g.data(), r.up = u.data(), r.down = d.data();
              ReferenceMoeFeedForward(r);
            }
            double scale = 0.0;
            for (float v : want) scale = std::max(scale, std::fabs(double{v}));
            for (int b = 0; b < 2; ++b) {
              std::vector<Weight> g = weights(gate[b], true), u = weights(up[b], true),
                                  d = weights(down[b], true);
              DeviceArray<float> xd(backends[b], x), out(backends[b], start);
              if (!accumulate) out.Poison();
              MoeFeedForwardParams q = p;
              q.out = out.device();
              q.x = xd.device();
              q.router = &router[b].device;
              q.gate = g.data(), q.up = u.data(), q.down = d.data();
              ASSERT_TRUE(q.Check().ok()) << q.Check().message();
              backends[b]->MoeFeedForward(q);
              const std::vector<float> got = out.Read();
              for (size_t i = 0; i < want.size(); ++i) {
                ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
                ASSERT_NEAR(got[i], want[i], 1e-4 * scale)
                    << what << (b == 0 ? " exact" : " fast") << " at " << i;
              }
            }
          }
        }
      }
    }
  }
}

// The op with q4 experts records into a CUDA graph (the rotations, the decode kernels or the
// plan and grouped GEMMs) and replays on new inputs as it runs without recording.
TEST(CudaMoeQuantTest, RecordsAndReplays) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(34);
  constexpr int kExperts = 6;
  constexpr int64_t kDim = 256, kFfn = 128;
  for (int64_t rows : {1, 40}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    auto backend = MakeBackend(false, 1);
    PlainWeight router;
    MakePlainWeight(backend.get(), rng, Format::kF32, kExperts, kDim, &router);
    std::vector<QuantExpertWeight> gate(kExperts), up(kExperts), down(kExperts);
    std::vector<Weight> g, u, d;
    const quant::QuantizeOptions options{Format::kQ4, true, true};
    for (int e = 0; e < kExperts; ++e) {
      MakeQuantWeight(backend.get(), rng, options, kFfn, kDim, &gate[e]);
      MakeQuantWeight(backend.get(), rng, options, kFfn, kDim, &up[e]);
      MakeQuantWeight(backend.get(), rng, options, kDim, kFfn, &down[e]);
      if (::testing::Test::HasFatalFailure()) return;
      g.push_back(gate[e].device), u.push_back(up[e].device), d.push_back(down[e].device);
    }
    DeviceArray<float> xd(backend.get(), RandomFloats(rng, rows * kDim));
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * kDim));
    MoeFeedForwardParams p;
    p.out = out.device();
    p.x = xd.device();
    p.rows = rows;
    p.dim = kDim;
    p.ffn = kFfn;
    p.experts = kExperts;
    p.top_k = 2;
    p.norm_topk_prob = true;
    p.router = &router.device;
    p.gate = g.data(), p.up = u.data(), p.down = d.data();
    backend->BeginStep(12);
    backend->MoeFeedForward(p);
    backend->EndStep();
    const std::vector<float> recorded = out.Read();
    for (float v : recorded) ASSERT_TRUE(std::isfinite(v));
    std::vector<float> x = RandomFloats(rng, rows * kDim);
    backend->CopyToDevice(xd.device(), x.data(), x.size() * 4);
    out.Poison();
    ASSERT_TRUE(backend->ReplayStep(12));
    const std::vector<float> replayed = out.Read();
    EXPECT_GT(RelativeError(replayed, recorded), 1e-2) << "the replay read the old inputs";
    out.Poison();
    backend->MoeFeedForward(p);
    EXPECT_LT(RelativeError(out.Read(), replayed), 1e-6);
  }
}

// Fast mode with bf16 copies of the quantized experts (AddBf16Copy, as the loader makes them):
// steps of more than kMoeDecodeRows rows multiply the copies on the bf16 grouped path (few rows
// an expert and the tensor-core tiles), within the fast mode's 2e-2 of the largest output of the
// reference over the quantized values; with the experts' codes overwritten after the copies
// were made, so a step that read the codes instead would be far off. Exact mode makes no copies.
TEST(CudaMoeQuantTest, ManyRowsReadTheExpertsBf16Copies) {
  GZ_SKIP_WITHOUT_CUDA();
  auto fast = MakeBackend(false, /*gemv_max_rows=*/1);
  auto exact = MakeBackend(true);
  std::mt19937 rng(35);
  constexpr int kExperts = 6;
  constexpr int64_t kDim = 256, kFfn = 384;
  for (const quant::QuantizeOptions& options :
       {quant::QuantizeOptions{Format::kQ4, true, true},
        quant::QuantizeOptions{Format::kQ8, false, true},
        quant::QuantizeOptions{Format::kQ4, false, false}}) {
    const std::string format = FormatName(options.format) + (options.zeros ? " zeros" : "") +
                               (options.rotate ? " rotated" : "");
    PlainWeight router;
    MakePlainWeight(fast.get(), rng, Format::kF32, kExperts, kDim, &router);
    std::vector<QuantExpertWeight> gate(kExperts), up(kExperts), down(kExperts), other(1);
    std::vector<Weight> g, u, d, gr, ur, dr;
    for (int e = 0; e < kExperts; ++e) {
      MakeQuantWeight(fast.get(), rng, options, kFfn, kDim, &gate[e]);
      MakeQuantWeight(fast.get(), rng, options, kFfn, kDim, &up[e]);
      MakeQuantWeight(fast.get(), rng, options, kDim, kFfn, &down[e]);
      if (::testing::Test::HasFatalFailure()) return;
      for (QuantExpertWeight* w : {&gate[e], &up[e], &down[e]}) {
        fast->AddBf16Copy(&w->device, &w->storage);
        ASSERT_NE(w->device.bf16, nullptr) << format;
        // The codes overwritten: only the copies still hold the weight.
        const std::vector<uint8_t> ones(
            w->device.rows * w->device.cols * 2 / (options.format == Format::kQ8 ? 2 : 4), 0x5b);
        fast->CopyToDevice(const_cast<void*>(w->device.data), ones.data(), ones.size());
      }
      g.push_back(gate[e].device), u.push_back(up[e].device), d.push_back(down[e].device);
      gr.push_back(gate[e].reference), ur.push_back(up[e].reference);
      dr.push_back(down[e].reference);
    }
    MakeQuantWeight(exact.get(), rng, options, kFfn, kDim, &other[0]);
    if (::testing::Test::HasFatalFailure()) return;
    exact->AddBf16Copy(&other[0].device, &other[0].storage);
    EXPECT_EQ(other[0].device.bf16, nullptr) << format << ": exact mode made a copy";
    for (int64_t rows : {5, 37, 300}) {
      for (int k : {1, 3}) {
        const std::string what =
            format + " rows " + std::to_string(rows) + " top_k " + std::to_string(k);
        std::vector<float> x = SeparatedRows(rng, router.values, kExperts, kDim, rows, k);
        std::vector<float> want(rows * kDim);
        MoeFeedForwardParams p;
        p.rows = rows;
        p.dim = kDim;
        p.ffn = kFfn;
        p.experts = kExperts;
        p.top_k = k;
        p.norm_topk_prob = true;
        {
          MoeFeedForwardParams r = p;
          r.out = want.data();
          r.x = x.data();
          r.router = &router.host;
          r.gate = gr.data(), r.up = ur.data(), r.down = dr.data();
          ReferenceMoeFeedForward(r);
        }
        double scale = 0.0;
        for (float v : want) scale = std::max(scale, std::fabs(double{v}));
        DeviceArray<float> xd(fast.get(), x), out(fast.get(), std::vector<float>(rows * kDim));
        out.Poison();
        MoeFeedForwardParams q = p;
        q.out = out.device();
        q.x = xd.device();
        q.router = &router.device;
        q.gate = g.data(), q.up = u.data(), q.down = d.data();
        ASSERT_TRUE(q.Check().ok()) << q.Check().message();
        fast->MoeFeedForward(q);
        const std::vector<float> got = out.Read();
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
          ASSERT_NEAR(got[i], want[i], 2e-2 * scale) << what << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gizllm::testing
