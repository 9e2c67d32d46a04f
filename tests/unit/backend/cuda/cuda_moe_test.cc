// MoeFeedForward on the CUDA backend against the float64 reference (ReferenceMoeFeedForward):
// the decode path (at most kMoeDecodeRows rows) and the grouped path (more), top k 1, 2 and 8,
// with and without norm_topk_prob and accumulation, experts placed one buffer each (one tensor
// per expert) or as views into one stacked buffer (gate_up_proj / down_proj), exact and fast
// mode; experts no row picks are never read; the op records into a CUDA graph and replays.
//
// Tolerances: exact mode, and fast mode wherever float32 activations meet the weights (steps of
// at most gemv_max_rows rows; weights other than bf16), sum in float32 in another order than the
// reference's double: within 2e-5 of the largest output (the CPU op's bound). Fast mode's
// many-row steps round the rows and the hidden units to bf16 (2^-9 relative each; the grouped
// path's tensor cores, the decode kernels alike), sum in float32: within 1e-2 of the output's
// norm.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

// A mixture's weights as the reference reads them (host) and as one backend placed them.
struct Experts {
  int experts = 0;
  int64_t dim = 0, ffn = 0;
  Format format = Format::kBf16;
  std::vector<float> router_values, gate_up_values, down_values;  // values exact in `format`
  std::vector<uint16_t> router_halves, gate_up_halves, down_halves;
  Weight router_host, router;
  std::vector<Weight> gate_host, up_host, down_host, gate, up, down;
  std::vector<std::shared_ptr<Buffer>> storage;  // shared: Experts copy before Place
};

// Values exact in bf16 (or f32 as drawn).
std::vector<float> Exact(std::vector<float> v, Format format) {
  if (format == Format::kBf16)
    for (float& x : v) x = Bf16ToF32(F32ToBf16(x));
  return v;
}

// Random experts stacked on the host as transformers 5 stores them: gate_up [experts, 2 ffn,
// dim] (gate rows first), down [experts, dim, ffn]; the router [experts, dim].
void MakeExperts(std::mt19937& rng, Format format, int experts, int64_t dim, int64_t ffn,
                 Experts* m) {
  m->experts = experts;
  m->dim = dim;
  m->ffn = ffn;
  m->format = format;
  m->router_values = Exact(RandomFloats(rng, experts * dim, 0.1f), format);
  m->gate_up_values = Exact(RandomFloats(rng, experts * 2 * ffn * dim, 0.05f), format);
  m->down_values = Exact(RandomFloats(rng, experts * dim * ffn, 0.05f), format);
}

const void* HostData(const std::vector<float>& values, std::vector<uint16_t>* halves,
                     Format format) {
  if (format == Format::kF32) return values.data();
  *halves = ToBf16(values);
  return halves->data();
}

// The host views, and the device weights: `stacked`: views into one device buffer for gate_up
// and one for down (as the fused tensors are laid out); else each expert's gate, up and down
// placed by PrepareWeight (as one tensor per expert is loaded).
void Place(Backend* backend, bool stacked, Experts* m) {
  const int64_t dim = m->dim, ffn = m->ffn;
  const size_t elem = m->format == Format::kF32 ? 4 : 2;
  const char* gu =
      static_cast<const char*>(HostData(m->gate_up_values, &m->gate_up_halves, m->format));
  const char* dn = static_cast<const char*>(HostData(m->down_values, &m->down_halves, m->format));
  m->router_host = Weight{m->format, m->experts, dim};
  m->router_host.data = HostData(m->router_values, &m->router_halves, m->format);
  std::unique_ptr<Buffer> storage;
  auto router = backend->PrepareWeight(m->router_host, &storage);
  ASSERT_TRUE(router.ok()) << router.status().message();
  m->router = *router;
  m->storage.push_back(std::move(storage));
  m->gate_host.clear(), m->up_host.clear(), m->down_host.clear();
  m->gate.clear(), m->up.clear(), m->down.clear();
  for (int e = 0; e < m->experts; ++e) {
    Weight g{m->format, ffn, dim}, u{m->format, ffn, dim}, d{m->format, dim, ffn};
    g.data = gu + (2 * e) * ffn * dim * elem;
    u.data = gu + (2 * e + 1) * ffn * dim * elem;
    d.data = dn + e * dim * ffn * elem;
    m->gate_host.push_back(g), m->up_host.push_back(u), m->down_host.push_back(d);
  }
  if (stacked) {
    const size_t gu_bytes = m->experts * 2 * ffn * dim * elem,
                 d_bytes = m->experts * dim * ffn * elem;
    auto gu_buffer = backend->Allocate(gu_bytes);
    auto d_buffer = backend->Allocate(d_bytes);
    ASSERT_TRUE(gu_buffer.ok() && d_buffer.ok());
    backend->CopyToDevice((*gu_buffer)->data(), gu, gu_bytes);
    backend->CopyToDevice((*d_buffer)->data(), dn, d_bytes);
    const char* gu_dev = static_cast<const char*>((*gu_buffer)->data());
    const char* d_dev = static_cast<const char*>((*d_buffer)->data());
    for (int e = 0; e < m->experts; ++e) {
      Weight g = m->gate_host[e], u = m->up_host[e], d = m->down_host[e];
      g.data = gu_dev + (static_cast<const char*>(g.data) - gu);
      u.data = gu_dev + (static_cast<const char*>(u.data) - gu);
      d.data = d_dev + (static_cast<const char*>(d.data) - dn);
      m->gate.push_back(g), m->up.push_back(u), m->down.push_back(d);
    }
    m->storage.push_back(std::move(gu_buffer).value());
    m->storage.push_back(std::move(d_buffer).value());
    return;
  }
  for (int e = 0; e < m->experts; ++e) {
    for (auto [host, out] :
         {std::pair{&m->gate_host[e], &m->gate}, std::pair{&m->up_host[e], &m->up},
          std::pair{&m->down_host[e], &m->down}}) {
      std::unique_ptr<Buffer> s;
      auto w = backend->PrepareWeight(*host, &s);
      ASSERT_TRUE(w.ok()) << w.status().message();
      out->push_back(*w);
      m->storage.push_back(std::move(s));
    }
  }
}

// Rows of x whose k-th and (k+1)-th router logits are at least 1e-3 apart: the float32 logits
// of the device (another order of sums) then pick the experts the double reference picks.
std::vector<float> SeparatedRows(std::mt19937& rng, const Experts& m, int64_t rows, int k) {
  std::vector<float> x(rows * m.dim);
  std::vector<double> z(m.experts);
  for (int64_t r = 0; r < rows; ++r) {
    for (int attempt = 0;; ++attempt) {
      std::vector<float> row = RandomFloats(rng, m.dim);
      for (int e = 0; e < m.experts; ++e) {
        double s = 0.0;
        for (int64_t c = 0; c < m.dim; ++c) s += double{row[c]} * m.router_values[e * m.dim + c];
        z[e] = s;
      }
      std::sort(z.begin(), z.end(), std::greater<>());
      if (k < m.experts && z[k - 1] - z[k] < 1e-3 && attempt < 1000) continue;
      EXPECT_LT(attempt, 1000) << "no row with separated logits";
      std::copy(row.begin(), row.end(), x.begin() + r * m.dim);
      break;
    }
  }
  return x;
}

MoeFeedForwardParams Params(const Experts& m, bool device, float* out, const float* x, int64_t rows,
                            int k, bool norm, bool accumulate) {
  MoeFeedForwardParams p;
  p.out = out;
  p.x = x;
  p.rows = rows;
  p.dim = m.dim;
  p.ffn = m.ffn;
  p.experts = m.experts;
  p.top_k = k;
  p.norm_topk_prob = norm;
  p.accumulate = accumulate;
  p.router = device ? &m.router : &m.router_host;
  p.gate = device ? m.gate.data() : m.gate_host.data();
  p.up = device ? m.up.data() : m.up_host.data();
  p.down = device ? m.down.data() : m.down_host.data();
  return p;
}

// The largest |got - want| against the largest |want| (tight), or the norm-relative error
// (the fast grouped path).
void ExpectMatches(const std::vector<float>& got, const std::vector<float>& want, bool tight,
                   const std::string& what) {
  if (tight) {
    double scale = 0.0;
    for (float v : want) scale = std::max(scale, std::fabs(double{v}));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
      ASSERT_NEAR(got[i], want[i], 2e-5 * scale) << what << " at " << i;
    }
  } else {
    EXPECT_LT(RelativeError(got, want), 1e-2) << what;
  }
}

struct Shape {
  int experts;
  int64_t dim, ffn;
};

TEST(CudaMoeTest, SupportsMoeAndRefusesTooManyExperts) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  EXPECT_TRUE(backend->SupportsMoe());
  EXPECT_TRUE(backend->CheckMoeShape(128, 8).ok());
  EXPECT_TRUE(backend->CheckMoeShape(512, 10).ok());
  EXPECT_FALSE(backend->CheckMoeShape(513, 8).ok());
}

// Every path against the reference: rows 1, 3 and 4 (decode), 5, 64 and 300 (grouped), top k
// 1, 2, 8, the variants of norm_topk_prob and accumulate, both placements, both modes, bf16
// and f32 weights, a shape of vector widths and one that is not (scalar loads, unaligned views).
TEST(CudaMoeTest, MatchesReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto exact = MakeBackend(true);
  auto fast = MakeBackend(false, /*gemv_max_rows=*/1);
  std::mt19937 rng(20);
  for (Shape shape : {Shape{16, 256, 96}, Shape{9, 37, 21}}) {
    for (Format format : {Format::kBf16, Format::kF32}) {
      Experts m;
      MakeExperts(rng, format, shape.experts, shape.dim, shape.ffn, &m);
      // [backend][stacked]
      Experts placed[2][2] = {{m, m}, {m, m}};
      Backend* backends[2] = {exact.get(), fast.get()};
      for (int b = 0; b < 2; ++b)
        for (int s = 0; s < 2; ++s) Place(backends[b], s == 1, &placed[b][s]);
      Experts host = m;
      Place(exact.get(), false, &host);  // host views for the reference
      for (int64_t rows : {1, 3, 4, 5, 64, 300}) {
        for (int k : {1, 2, 8}) {
          for (int variant = 0; variant < 4; ++variant) {
            const bool norm = variant & 1, accumulate = variant & 2;
            if (rows == 300 && variant % 3 == 0) continue;  // (norm, no add), (add, no norm)
            const std::string what =
                std::string(FormatName(format)) + " experts " + std::to_string(shape.experts) +
                " dim " + std::to_string(shape.dim) + " rows " + std::to_string(rows) + " top_k " +
                std::to_string(k) + " norm " + std::to_string(norm) + " accumulate " +
                std::to_string(accumulate);
            std::vector<float> x = SeparatedRows(rng, m, rows, k);
            std::vector<float> start =
                accumulate ? RandomFloats(rng, rows * m.dim) : std::vector<float>(rows * m.dim);
            std::vector<float> want = start;
            ReferenceMoeFeedForward(
                Params(host, false, want.data(), x.data(), rows, k, norm, accumulate));
            for (int b = 0; b < 2; ++b) {
              for (int s = 0; s < 2; ++s) {
                Backend* be = backends[b];
                DeviceArray<float> xd(be, x), out(be, start);
                if (!accumulate) out.Poison();
                MoeFeedForwardParams p = Params(placed[b][s], true, out.device(), xd.device(), rows,
                                                k, norm, accumulate);
                ASSERT_TRUE(p.Check().ok()) << p.Check().message();
                be->MoeFeedForward(p);
                const bool tight = b == 0 || rows <= 1 || format != Format::kBf16;
                ExpectMatches(
                    out.Read(), want, tight,
                    what + (b == 0 ? " exact" : " fast") + (s == 1 ? " stacked" : " per expert"));
                if (::testing::Test::HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// Routing over more experts than a warp has lanes (each lane holds several; up to the 512 the
// kernels take) on wider rows: 128 experts of 256 over 1024, top 8 (Qwen3-30B-A3B's counts), and
// 512 experts, top 10 (Qwen3-Next's counts), in both modes and on both paths.
TEST(CudaMoeTest, ManyExpertsMatchReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto exact = MakeBackend(true);
  auto fast = MakeBackend(false, /*gemv_max_rows=*/1);
  std::mt19937 rng(24);
  struct Case {
    Shape shape;
    int k;
    std::vector<int64_t> rows;
  };
  for (const Case& c :
       {Case{{128, 1024, 256}, 8, {1, 3, 64}}, Case{{512, 64, 32}, 10, {1, 5, 300}}}) {
    Experts m;
    MakeExperts(rng, Format::kBf16, c.shape.experts, c.shape.dim, c.shape.ffn, &m);
    Experts host = m, on_exact = m, on_fast = m;
    Place(exact.get(), false, &host);
    Place(exact.get(), false, &on_exact);
    Place(fast.get(), true, &on_fast);
    for (int64_t rows : c.rows) {
      const std::string what =
          "experts " + std::to_string(c.shape.experts) + " rows " + std::to_string(rows);
      std::vector<float> x = SeparatedRows(rng, m, rows, c.k);
      std::vector<float> want(rows * m.dim);
      ReferenceMoeFeedForward(Params(host, false, want.data(), x.data(), rows, c.k, true, false));
      for (bool is_exact : {true, false}) {
        Backend* be = is_exact ? exact.get() : fast.get();
        DeviceArray<float> xd(be, x), out(be, want);
        out.Poison();
        be->MoeFeedForward(Params(is_exact ? on_exact : on_fast, true, out.device(), xd.device(),
                                  rows, c.k, true, false));
        ExpectMatches(out.Read(), want, is_exact || rows <= 1,
                      what + (is_exact ? " exact" : " fast"));
      }
    }
  }
}

// The shared expert of Qwen3-Next and Qwen3.5-MoE after the routed ones, gated per row by
// sigmoid(x G^T) and ungated, with and without accumulation, on the decode and grouped paths.
TEST(CudaMoeTest, SharedExpertMatchesReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto exact = MakeBackend(true);
  auto fast = MakeBackend(false, /*gemv_max_rows=*/1);
  std::mt19937 rng(25);
  Experts m;
  MakeExperts(rng, Format::kBf16, 8, 64, 32, &m);
  Experts host = m, on_exact = m, on_fast = m;
  Place(exact.get(), false, &host);
  Place(exact.get(), false, &on_exact);
  Place(fast.get(), true, &on_fast);
  constexpr int64_t kSharedFfn = 48;
  // [exact, fast]: each backend places its own copy; the host views are the exact one's.
  PlainWeight gate[2], up[2], down[2], scale[2];
  Backend* backends[2] = {exact.get(), fast.get()};
  for (int b = 0; b < 2; ++b) {
    std::mt19937 same(26);  // both backends' weights from the same draws
    MakePlainWeight(backends[b], same, Format::kBf16, kSharedFfn, m.dim, &gate[b]);
    MakePlainWeight(backends[b], same, Format::kBf16, kSharedFfn, m.dim, &up[b]);
    MakePlainWeight(backends[b], same, Format::kBf16, m.dim, kSharedFfn, &down[b]);
    MakePlainWeight(backends[b], same, Format::kBf16, 1, m.dim, &scale[b]);
    if (::testing::Test::HasFatalFailure()) return;
  }
  auto with_shared = [&](MoeFeedForwardParams p, int b, bool device, bool gated) {
    p.shared_ffn = kSharedFfn;
    p.shared_gate = device ? &gate[b].device : &gate[0].host;
    p.shared_up = device ? &up[b].device : &up[0].host;
    p.shared_down = device ? &down[b].device : &down[0].host;
    p.shared_scale = gated ? (device ? &scale[b].device : &scale[0].host) : nullptr;
    return p;
  };
  for (int64_t rows : {1, 3, 64}) {
    for (bool gated : {true, false}) {
      for (bool accumulate : {false, true}) {
        const std::string what = "rows " + std::to_string(rows) + " gated " +
                                 std::to_string(gated) + " accumulate " +
                                 std::to_string(accumulate);
        std::vector<float> x = SeparatedRows(rng, m, rows, 2);
        std::vector<float> start =
            accumulate ? RandomFloats(rng, rows * m.dim) : std::vector<float>(rows * m.dim);
        std::vector<float> want = start;
        ReferenceMoeFeedForward(with_shared(
            Params(host, false, want.data(), x.data(), rows, 2, true, accumulate), 0, false,
            gated));
        for (int b = 0; b < 2; ++b) {
          Backend* be = backends[b];
          DeviceArray<float> xd(be, x), out(be, start);
          if (!accumulate) out.Poison();
          MoeFeedForwardParams p = with_shared(
              Params(b == 0 ? on_exact : on_fast, true, out.device(), xd.device(), rows, 2, true,
                     accumulate),
              b, true, gated);
          ASSERT_TRUE(p.Check().ok()) << p.Check().message();
          be->MoeFeedForward(p);
          ExpectMatches(out.Read(), want, b == 0 || rows <= 1, what + (b == 0 ? " exact" : " fast"));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// A zero router: every probability equal, the lowest indices win (weights 1/experts, or 1/k
// renormalized), on both paths.
TEST(CudaMoeTest, TiesGoToLowestIndices) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(21);
  for (bool is_exact : {true, false}) {
    auto backend = MakeBackend(is_exact, 1);
    Experts m;
    MakeExperts(rng, Format::kBf16, 8, 64, 32, &m);
    std::fill(m.router_values.begin(), m.router_values.end(), 0.0f);
    Experts host = m;
    Place(backend.get(), false, &m);
    Place(backend.get(), false, &host);
    for (int64_t rows : {1, 40}) {
      for (bool norm : {false, true}) {
        std::vector<float> x = RandomFloats(rng, rows * m.dim);
        std::vector<float> want(rows * m.dim);
        ReferenceMoeFeedForward(Params(host, false, want.data(), x.data(), rows, 3, norm, false));
        DeviceArray<float> xd(backend.get(), x), out(backend.get(), want);
        out.Poison();
        backend->MoeFeedForward(Params(m, true, out.device(), xd.device(), rows, 3, norm, false));
        ExpectMatches(out.Read(), want, is_exact || rows <= 1,
                      "rows " + std::to_string(rows) + " norm " + std::to_string(norm));
      }
    }
  }
}

// Experts no row picks hold NaN weights: the output stays finite and right, so neither path
// reads (uses) them. x > 0; experts 4 and up have router rows of -0.5 (logits near -dim / 2, a
// probability of 0), the first four positive ones.
TEST(CudaMoeTest, UnpickedExpertsAreNotRead) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(22);
  constexpr int kExperts = 16, kPicked = 4;
  for (bool is_exact : {true, false}) {
    auto backend = MakeBackend(is_exact, 1);
    Experts m;
    MakeExperts(rng, Format::kBf16, kExperts, 256, 96, &m);
    for (int e = 0; e < kExperts; ++e) {
      for (int64_t c = 0; c < m.dim; ++c) {
        float& v = m.router_values[e * m.dim + c];
        v = e < kPicked ? Bf16ToF32(F32ToBf16(std::fabs(v) + 0.01f)) : -0.5f;
      }
    }
    Experts host = m;
    Place(backend.get(), false, &host);
    const int64_t per = 2 * m.ffn * m.dim;
    std::fill(m.gate_up_values.begin() + kPicked * per, m.gate_up_values.end(), NAN);
    std::fill(m.down_values.begin() + kPicked * m.dim * m.ffn, m.down_values.end(), NAN);
    Place(backend.get(), false, &m);
    std::uniform_real_distribution<float> positive(0.5f, 1.5f);
    for (int64_t rows : {1, 3, 300}) {
      std::vector<float> x(rows * m.dim);
      for (float& v : x) v = positive(rng);
      std::vector<float> want(rows * m.dim);
      ReferenceMoeFeedForward(Params(host, false, want.data(), x.data(), rows, 2, true, false));
      DeviceArray<float> xd(backend.get(), x), out(backend.get(), want);
      out.Poison();
      backend->MoeFeedForward(Params(m, true, out.device(), xd.device(), rows, 2, true, false));
      ExpectMatches(out.Read(), want, is_exact || rows <= 1,
                    std::string(is_exact ? "exact" : "fast") + " rows " + std::to_string(rows));
    }
  }
}

// The op recorded as a step (its expert table uploaded while recording), replayed on new
// inputs: what the op issued directly gives.
TEST(CudaMoeTest, RecordsAndReplays) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(23);
  for (int64_t rows : {1, 300}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    auto backend = MakeBackend(false, 1);
    Experts m;
    MakeExperts(rng, Format::kBf16, 16, 256, 96, &m);
    Place(backend.get(), false, &m);
    DeviceArray<float> xd(backend.get(), RandomFloats(rng, rows * m.dim));
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * m.dim));
    const MoeFeedForwardParams p = Params(m, true, out.device(), xd.device(), rows, 8, true, false);
    backend->BeginStep(11);
    backend->MoeFeedForward(p);
    backend->EndStep();
    const std::vector<float> recorded = out.Read();
    for (float v : recorded) ASSERT_TRUE(std::isfinite(v));
    std::vector<float> x = RandomFloats(rng, rows * m.dim);
    backend->CopyToDevice(xd.device(), x.data(), x.size() * 4);
    out.Poison();
    ASSERT_TRUE(backend->ReplayStep(11));
    const std::vector<float> replayed = out.Read();
    EXPECT_GT(RelativeError(replayed, recorded), 1e-2) << "the replay read the old inputs";
    out.Poison();
    backend->MoeFeedForward(p);
    EXPECT_LT(RelativeError(out.Read(), replayed), 1e-6);
  }
}

}  // namespace
}  // namespace gizllm::testing
