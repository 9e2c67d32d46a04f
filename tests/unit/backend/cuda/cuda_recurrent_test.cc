// The recurrent layers' ops on the CUDA backend against their float64 references
// (backend/cpu/reference.h): a step's rows in runs of three slots (one continuing a random state
// from position 5, one starting at position 0 over a garbage state that must be ignored, one
// single decode row), then a second step that must read the states the first left; outputs
// NaN-poisoned. Tolerances: float32 sums in another order than the references' double, within
// 1e-5 of the largest output for the convolution and the norms; the delta rule carries its state
// through up to 70 rows of rank-one updates: within 1e-4 of the largest output and state.
//
// The chunked delta rule (runs of kDeltaRuleChunkedRows rows or more), in both chunked forms
// (the chunk-parallel kernels the backend uses and the serial one-block-a-run kernel), against
// the row-by-row kernel and the reference on runs of 1 to 1,000 rows, whole and continued from a
// random state, several long runs in one step beside decode rows and short runs, in float32
// (1e-4); the serial kernel's tf32 products within bf16's bound of the fast-mode matmuls (1e-2
// of the largest output and state); and one recorded step replayed over other run layouts.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/reference.h"
#include "backend/cuda/kernels.cuh"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

double MaxAbs(const std::vector<float>& v) {
  double m = 0.0;
  for (float f : v) m = std::max(m, std::fabs(static_cast<double>(f)));
  return m;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tolerance,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double bound = tolerance * std::max(MaxAbs(want), 1e-30);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], want[i], bound) << what << " at " << i;
  }
}

// The rows of one step: runs of (slot, first position, rows).
struct Run {
  int32_t slot;
  int32_t position;
  int64_t rows;
};

void RowsOf(const std::vector<Run>& runs, std::vector<int32_t>* slots,
            std::vector<int32_t>* positions) {
  slots->clear(), positions->clear();
  for (const Run& run : runs) {
    for (int64_t i = 0; i < run.rows; ++i) {
      slots->push_back(run.slot);
      positions->push_back(run.position + static_cast<int32_t>(i));
    }
  }
}

// Two steps: the first's runs, then the second's continuing them.
std::vector<std::vector<Run>> Steps(int64_t long_run) {
  return {{{2, 5, long_run}, {0, 0, 7}, {3, 9, 1}},
          {{0, 7, 3}, {3, 10, 1}, {2, 5 + static_cast<int32_t>(long_run), 2}}};
}

constexpr int kSlots = 4;

TEST(CudaRecurrentTest, SupportsRecurrentAndRefusesShapesWithoutKernels) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  EXPECT_TRUE(backend->SupportsRecurrent());
  EXPECT_TRUE(backend->CheckRecurrentShape(128, 128, 4).ok());
  EXPECT_TRUE(backend->CheckRecurrentShape(16, 12, 4).ok());
  EXPECT_FALSE(backend->CheckRecurrentShape(96, 128, 4).ok());
  EXPECT_FALSE(backend->CheckRecurrentShape(128, 128, 9).ok());
}

TEST(CudaRecurrentTest, CausalConvMatchesReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  std::mt19937 rng(30);
  for (int kernel : {2, 4}) {
    for (int64_t channels : {40, 600}) {
      const int64_t stride = channels + 3;
      const int tail = kernel - 1;
      std::vector<float> weight = RandomFloats(rng, channels * kernel, 0.5f);
      std::vector<float> states = RandomFloats(rng, kSlots * tail * channels);
      DeviceArray<float> w(backend.get(), weight), st(backend.get(), states);
      std::vector<float> want_states = states;
      for (const auto& runs : Steps(70)) {
        std::vector<int32_t> slots, positions;
        RowsOf(runs, &slots, &positions);
        const int64_t rows = static_cast<int64_t>(slots.size());
        std::vector<float> x = RandomFloats(rng, rows * stride);
        DeviceArray<float> xd(backend.get(), x);
        DeviceArray<int32_t> sd(backend.get(), slots), pd(backend.get(), positions);
        CausalConvParams p{xd.device(), rows,           channels,     stride,     kernel,
                           w.device(),  st.device(),    sd.device(),  pd.device()};
        ASSERT_TRUE(p.Check().ok()) << p.Check().message();
        backend->CausalConv(p);
        CausalConvParams ref{x.data(),  rows,           channels,       stride,          kernel,
                             weight.data(), want_states.data(), slots.data(), positions.data()};
        ReferenceCausalConv(ref);
        const std::string what =
            "kernel " + std::to_string(kernel) + " channels " + std::to_string(channels);
        ExpectNear(xd.Read(), x, 1e-5, what + " out");
        ExpectNear(st.Read(), want_states, 1e-5, what + " states");
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaRecurrentTest, L2NormAndGatedRmsNormMatchReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  std::mt19937 rng(31);
  for (int dim : {16, 128, 200}) {
    const int64_t rows = 37, heads = 6, stride = heads * dim + 5;
    std::vector<float> x = RandomFloats(rng, rows * stride);
    DeviceArray<float> xd(backend.get(), x);
    L2NormParams p{xd.device(), rows, static_cast<int>(heads), dim, stride, 1e-6f};
    ASSERT_TRUE(p.Check().ok()) << p.Check().message();
    backend->L2Norm(p);
    L2NormParams ref = p;
    ref.x = x.data();
    ReferenceL2Norm(ref);
    ExpectNear(xd.Read(), x, 1e-5, "l2 norm dim " + std::to_string(dim));

    const int64_t groups = rows * heads;
    std::vector<float> g = RandomFloats(rng, groups * dim), z = RandomFloats(rng, groups * dim);
    std::vector<float> weight = RandomFloats(rng, dim, 0.3f);
    for (float& v : weight) v += 1.0f;
    std::vector<float> want(groups * dim);
    DeviceArray<float> gd(backend.get(), g), zd(backend.get(), z), wd(backend.get(), weight),
        out(backend.get(), want);
    out.Poison();
    GatedRmsNormParams n{out.device(), gd.device(), zd.device(), wd.device(), groups, dim, 1e-6f};
    ASSERT_TRUE(n.Check().ok()) << n.Check().message();
    backend->GatedRmsNorm(n);
    ReferenceGatedRmsNorm({want.data(), g.data(), z.data(), weight.data(), groups, dim, 1e-6f});
    ExpectNear(out.Read(), want, 1e-5, "gated rms norm dim " + std::to_string(dim));
    // In place (out = x), as the recurrent block runs it.
    GatedRmsNormParams in_place = n;
    in_place.out = gd.device();
    backend->GatedRmsNorm(in_place);
    ExpectNear(gd.Read(), want, 1e-5, "gated rms norm in place dim " + std::to_string(dim));
  }
}


// The gated delta rule's parameters over a mix of [rows, qk_stride] (q, k, v side by side) and
// [rows, 2 * v_heads] gates (a, b).
GatedDeltaRuleParams DeltaRuleParams(int k_heads, int v_heads, int k_dim, int v_dim,
                                     int64_t qk_stride, int64_t rows, float* o, const float* m,
                                     const float* a, float* s, const float* alog, const float* dtb,
                                     const int32_t* sl, const int32_t* po) {
  GatedDeltaRuleParams p;
  p.out = o;
  p.q = m;
  p.k = m + k_heads * k_dim;
  p.qk_stride = qk_stride;
  p.v = m + 2 * k_heads * k_dim;
  p.v_stride = qk_stride;
  p.a = a;
  p.b = a + v_heads;
  p.ab_stride = 2 * v_heads;
  p.a_log = alog;
  p.dt_bias = dtb;
  p.states = s;
  p.slots = sl;
  p.positions = po;
  p.rows = rows;
  p.k_heads = k_heads;
  p.v_heads = v_heads;
  p.k_dim = k_dim;
  p.v_dim = v_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(k_dim));
  return p;
}
TEST(CudaRecurrentTest, GatedDeltaRuleMatchesTheRecurrence) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  std::mt19937 rng(32);
  struct Shape {
    int k_heads, v_heads, k_dim, v_dim;
  };
  for (Shape sh : {Shape{2, 4, 16, 12}, Shape{1, 2, 128, 128}, Shape{2, 2, 64, 40}}) {
    const int64_t qk_stride = 2 * sh.k_heads * sh.k_dim + sh.v_heads * sh.v_dim;
    const int64_t state = static_cast<int64_t>(sh.v_heads) * sh.k_dim * sh.v_dim;
    std::vector<float> a_log(sh.v_heads), dt_bias = RandomFloats(rng, sh.v_heads, 0.5f);
    std::uniform_real_distribution<float> decay(0.02f, 0.25f);
    for (float& v : a_log) v = std::log(decay(rng));
    std::vector<float> states = RandomFloats(rng, kSlots * state, 0.3f);
    DeviceArray<float> al(backend.get(), a_log), dt(backend.get(), dt_bias),
        st(backend.get(), states);
    std::vector<float> want_states = states;
    for (const auto& runs : Steps(70)) {
      std::vector<int32_t> slots, positions;
      RowsOf(runs, &slots, &positions);
      const int64_t rows = static_cast<int64_t>(slots.size());
      // q and k L2-normalized (as the block's L2Norm leaves them), v after them in the row.
      std::vector<float> mix = RandomFloats(rng, rows * qk_stride);
      L2NormParams norm{mix.data(), rows, 2 * sh.k_heads, sh.k_dim, qk_stride, 1e-6f};
      ReferenceL2Norm(norm);
      std::vector<float> ab = RandomFloats(rng, rows * sh.v_heads * 2);
      std::vector<float> want(rows * sh.v_heads * sh.v_dim);
      DeviceArray<float> md(backend.get(), mix), abd(backend.get(), ab), out(backend.get(), want);
      DeviceArray<int32_t> sd(backend.get(), slots), pd(backend.get(), positions);
      out.Poison();
      auto params = [&](float* o, const float* m, const float* a, float* s, const float* alog,
                        const float* dtb, const int32_t* sl, const int32_t* po) {
        return DeltaRuleParams(sh.k_heads, sh.v_heads, sh.k_dim, sh.v_dim, qk_stride, rows, o, m,
                               a, s, alog, dtb, sl, po);
      };
      GatedDeltaRuleParams p = params(out.device(), md.device(), abd.device(), st.device(),
                                      al.device(), dt.device(), sd.device(), pd.device());
      ASSERT_TRUE(p.Check().ok()) << p.Check().message();
      backend->GatedDeltaRule(p);
      ReferenceGatedDeltaRule(params(want.data(), mix.data(), ab.data(), want_states.data(),
                                     a_log.data(), dt_bias.data(), slots.data(),
                                     positions.data()));
      const std::string what = "k_dim " + std::to_string(sh.k_dim) + " v_dim " +
                               std::to_string(sh.v_dim) + " rows " + std::to_string(rows);
      ExpectNear(out.Read(), want, 1e-4, what + " out");
      ExpectNear(st.Read(), want_states, 1e-4, what + " states");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Runs of the delta rule over one shape's random inputs: the float64 reference, the row-by-row
// kernel (min_chunked_rows 0) and a chunked form (min_chunked_rows 1: every run, one row too;
// or kDeltaRuleChunkedRows beside shorter runs in the same step), each from the same states.
class DeltaRuleCase {
 public:
  struct Shape {
    int k_heads, v_heads, k_dim, v_dim;
  };
  DeltaRuleCase(Backend* backend, std::mt19937& rng, Shape sh, const std::vector<Run>& runs)
      : backend_(backend), sh_(sh) {
    RowsOf(runs, &slots_, &positions_);
    rows_ = static_cast<int64_t>(slots_.size());
    qk_stride_ = 2 * sh.k_heads * sh.k_dim + sh.v_heads * sh.v_dim;
    a_log_.resize(sh.v_heads);
    dt_bias_ = RandomFloats(rng, sh.v_heads, 0.5f);
    std::uniform_real_distribution<float> decay(0.02f, 0.25f);
    for (float& v : a_log_) v = std::log(decay(rng));
    states_ =
        RandomFloats(rng, kSlots * static_cast<int64_t>(sh.v_heads) * sh.k_dim * sh.v_dim, 0.3f);
    mix_ = RandomFloats(rng, rows_ * qk_stride_);
    ReferenceL2Norm({mix_.data(), rows_, 2 * sh.k_heads, sh.k_dim, qk_stride_, 1e-6f});
    ab_ = RandomFloats(rng, rows_ * sh.v_heads * 2);
  }

  // The reference's outputs and states.
  void Reference(std::vector<float>* out, std::vector<float>* states) const {
    out->assign(rows_ * sh_.v_heads * sh_.v_dim, 0.0f);
    *states = states_;
    ReferenceGatedDeltaRule(Params(out->data(), mix_.data(), ab_.data(), states->data(),
                                   a_log_.data(), dt_bias_.data(), slots_.data(),
                                   positions_.data()));
  }

  // The kernel's: min_chunked_rows and form as LaunchGatedDeltaRule takes them; fast: through a
  // fast-mode backend's GatedDeltaRule instead (its own choice of runs to chunk and form).
  void Device(int min_chunked_rows, bool fast, std::vector<float>* out, std::vector<float>* states,
              cuda::DeltaRuleForm form = cuda::DeltaRuleForm::kParallel) const {
    DeviceArray<float> md(backend_, mix_), abd(backend_, ab_), st(backend_, states_),
        al(backend_, a_log_), dt(backend_, dt_bias_),
        od(backend_, std::vector<float>(rows_ * sh_.v_heads * sh_.v_dim));
    DeviceArray<int32_t> sd(backend_, slots_), pd(backend_, positions_);
    od.Poison();
    GatedDeltaRuleParams p = Params(od.device(), md.device(), abd.device(), st.device(),
                                    al.device(), dt.device(), sd.device(), pd.device());
    ASSERT_TRUE(p.Check().ok()) << p.Check().message();
    if (fast) {
      auto backend = MakeBackend(/*exact=*/false);
      ASSERT_NE(backend, nullptr);
      backend_->Synchronize();
      backend->GatedDeltaRule(p);
      backend->Synchronize();
    } else {
      backend_->Synchronize();
      cuda::Scratch scratch;
      cuda::LaunchGatedDeltaRule(p, min_chunked_rows, form, &scratch, /*stream=*/nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    *out = od.Read();
    *states = st.Read();
  }

 private:
  GatedDeltaRuleParams Params(float* o, const float* m, const float* a, float* s, const float* alog,
                              const float* dtb, const int32_t* sl, const int32_t* po) const {
    return DeltaRuleParams(sh_.k_heads, sh_.v_heads, sh_.k_dim, sh_.v_dim, qk_stride_, rows_, o, m,
                           a, s, alog, dtb, sl, po);
  }

  Backend* backend_;
  Shape sh_;
  std::vector<int32_t> slots_, positions_;
  int64_t rows_ = 0, qk_stride_ = 0;
  std::vector<float> a_log_, dt_bias_, states_, mix_, ab_;
};

// Qwen3-Next's and Qwen3.5's heads (16 key heads, 32 value heads of 128), the golden models'
// (2, 4, 16, 12), tiny-hybrid's (2, 4, 32, 32), one of 64 by 40, one of 64 by 64 and one of 128
// by 200 (more key and value columns than the chunk kernel's 256 threads, and value columns
// past the output kernel's tiles of 64).
std::vector<DeltaRuleCase::Shape> DeltaRuleShapes() {
  return {{16, 32, 128, 128}, {2, 4, 16, 12}, {2, 4, 32, 32},
          {1, 2, 64, 40},     {2, 4, 64, 64}, {1, 2, 128, 200}};
}

// Each length alone from position 0 (slot 1), then mid-sequence (slot 2 from position 77 over a
// random state) beside a decode row and a run of 5 rows from position 0 over a garbage state;
// then several long runs in one step (lengths of 16, 17, 33, 65, 77 and 130, some from position 0
// over a garbage state, some continuing a random state) beside decode rows and short runs.
std::vector<std::vector<Run>> DeltaRuleSteps() {
  std::vector<std::vector<Run>> steps;
  for (int64_t n : {1, 63, 64, 65, 200, 1000}) steps.push_back({{1, 0, n}});
  steps.push_back({{0, 9, 1}, {2, 77, 200}, {3, 0, 5}});
  steps.push_back({{1, 0, 130}, {0, 9, 1}, {2, 40, 17}, {3, 0, 77}});
  steps.push_back({{3, 100, 16}, {1, 0, 65}, {0, 3, 15}, {2, 3, 33}});
  return steps;
}

TEST(CudaRecurrentTest, ChunkedGatedDeltaRuleMatchesRowByRowAndTheReference) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  std::mt19937 rng(33);
  for (DeltaRuleCase::Shape sh : DeltaRuleShapes()) {
    for (const auto& runs : DeltaRuleSteps()) {
      DeltaRuleCase c(backend.get(), rng, sh, runs);
      std::vector<float> want, want_states, rows_out, rows_states;
      c.Reference(&want, &want_states);
      c.Device(/*min_chunked_rows=*/0, /*fast=*/false, &rows_out, &rows_states);
      int64_t n = 0;
      for (const auto& run : runs) n += run.rows;
      const std::string what = "k_dim " + std::to_string(sh.k_dim) + " v_dim " +
                               std::to_string(sh.v_dim) + " v_heads " + std::to_string(sh.v_heads) +
                               " rows " + std::to_string(n) +
                               (runs.size() > 1 ? " mid-sequence" : "");
      for (auto form : {cuda::DeltaRuleForm::kParallel, cuda::DeltaRuleForm::kSerial}) {
        for (int min_rows : {1, cuda::kDeltaRuleChunkedRows}) {
          std::vector<float> out, states;
          c.Device(min_rows, /*fast=*/false, &out, &states, form);
          const std::string how =
              what + (form == cuda::DeltaRuleForm::kParallel ? " parallel" : " serial") +
              " min_chunked_rows " + std::to_string(min_rows);
          ExpectNear(out, want, 1e-4, how + " out");
          ExpectNear(states, want_states, 1e-4, how + " states");
          ExpectNear(out, rows_out, 1e-4, how + " out against the row kernel");
          ExpectNear(states, rows_states, 1e-4, how + " states against the row kernel");
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CudaRecurrentTest, ChunkedGatedDeltaRuleOnTensorCoresWithinBf16Bound) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(true);
  std::mt19937 rng(34);
  for (DeltaRuleCase::Shape sh : DeltaRuleShapes()) {
    for (const auto& runs : DeltaRuleSteps()) {
      DeltaRuleCase c(backend.get(), rng, sh, runs);
      std::vector<float> want, want_states, out, states, fast_out, fast_states;
      c.Reference(&want, &want_states);
      c.Device(cuda::kDeltaRuleChunkedRows, /*fast=*/false, &out, &states,
               cuda::DeltaRuleForm::kSerialTf32);
      c.Device(0, /*fast=*/true, &fast_out, &fast_states);
      int64_t n = 0;
      for (const auto& run : runs) n += run.rows;
      const std::string what = "k_dim " + std::to_string(sh.k_dim) + " v_dim " +
                               std::to_string(sh.v_dim) + " rows " + std::to_string(n) +
                               (runs.size() > 1 ? " mid-sequence" : "");
      ExpectNear(out, want, 1e-2, what + " tf32 out");
      ExpectNear(states, want_states, 1e-2, what + " tf32 states");
      // The fast-mode backend: the chunk-parallel form in float32, as exact mode.
      ExpectNear(fast_out, want, 1e-4, what + " fast backend out");
      ExpectNear(fast_states, want_states, 1e-4, what + " fast backend states");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Run by another name: inside a TEST, Run is the test's own method.
using RowRun = Run;

// A step recorded once (CUDA graph) and replayed over other run layouts of as many rows: the
// kernels find the runs in device memory, so one recording serves a whole prompt piece (chunked),
// a piece continuing it beside a decode row and a short run, and 80 decode rows of 80 slots.
TEST(CudaRecurrentTest, RecordedGatedDeltaRuleReplaysOtherRunLayouts) {
  GZ_SKIP_WITHOUT_CUDA();
  constexpr int kKeyHeads = 2, kValueHeads = 4, kDim = 32, kGraphSlots = 80;
  constexpr int64_t kRows = 80;
  constexpr int64_t kStride = 2 * kKeyHeads * kDim + kValueHeads * kDim;
  std::vector<RowRun> decode;
  for (int32_t s = 0; s < kGraphSlots; ++s) decode.push_back({s, 5, 1});
  const std::vector<std::vector<RowRun>> layouts = {
      {{1, 0, kRows}}, {{0, 3, 1}, {1, static_cast<int32_t>(kRows), 40}, {2, 10, 39}}, decode};
  for (bool exact : {true, false}) {
    auto backend = MakeBackend(exact);
    std::mt19937 rng(35);
    std::vector<float> a_log(kValueHeads);
    std::uniform_real_distribution<float> decay(0.02f, 0.25f);
    for (float& v : a_log) v = std::log(decay(rng));
    DeviceArray<float> al(backend.get(), a_log),
        dt(backend.get(), RandomFloats(rng, kValueHeads, 0.5f)),
        st(backend.get(), RandomFloats(rng, kGraphSlots * kValueHeads * kDim * kDim, 0.3f)),
        md(backend.get(), std::vector<float>(kRows * kStride)),
        abd(backend.get(), std::vector<float>(kRows * 2 * kValueHeads)),
        od(backend.get(), std::vector<float>(kRows * kValueHeads * kDim));
    DeviceArray<int32_t> sd(backend.get(), std::vector<int32_t>(kRows)),
        pd(backend.get(), std::vector<int32_t>(kRows));
    std::vector<float> want_states = st.host();
    GatedDeltaRuleParams p;
    p.out = od.device();
    p.q = md.device();
    p.k = md.device() + kKeyHeads * kDim;
    p.qk_stride = kStride;
    p.v = md.device() + 2 * kKeyHeads * kDim;
    p.v_stride = kStride;
    p.a = abd.device();
    p.b = abd.device() + kValueHeads;
    p.ab_stride = 2 * kValueHeads;
    p.a_log = al.device();
    p.dt_bias = dt.device();
    p.states = st.device();
    p.slots = sd.device();
    p.positions = pd.device();
    p.rows = kRows;
    p.k_heads = kKeyHeads;
    p.v_heads = kValueHeads;
    p.k_dim = kDim;
    p.v_dim = kDim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    ASSERT_TRUE(p.Check().ok()) << p.Check().message();
    const uint64_t key = 0x64656c7461;
    for (size_t i = 0; i < layouts.size(); ++i) {
      RowsOf(layouts[i], &sd.host(), &pd.host());
      ASSERT_EQ(static_cast<int64_t>(sd.size()), kRows);
      md.host() = RandomFloats(rng, kRows * kStride);
      ReferenceL2Norm({md.host().data(), kRows, 2 * kKeyHeads, kDim, kStride, 1e-6f});
      abd.host() = RandomFloats(rng, kRows * 2 * kValueHeads);
      for (auto* a : {&md, &abd})
        backend->CopyToDevice(a->device(), a->host().data(), a->size() * sizeof(float));
      for (auto* a : {&sd, &pd})
        backend->CopyToDevice(a->device(), a->host().data(), a->size() * sizeof(int32_t));
      od.Poison();
      if (i == 0) {
        ASSERT_FALSE(backend->ReplayStep(key));
        backend->BeginStep(key);
        backend->GatedDeltaRule(p);
        backend->EndStep();  // runs the recording
      } else {
        ASSERT_TRUE(backend->ReplayStep(key));
      }
      std::vector<float> want(kRows * kValueHeads * kDim);
      GatedDeltaRuleParams ref = p;
      ref.out = want.data();
      ref.q = md.host().data();
      ref.k = md.host().data() + kKeyHeads * kDim;
      ref.v = md.host().data() + 2 * kKeyHeads * kDim;
      ref.a = abd.host().data();
      ref.b = abd.host().data() + kValueHeads;
      ref.a_log = a_log.data();
      ref.dt_bias = dt.host().data();
      ref.states = want_states.data();
      ref.slots = sd.host().data();
      ref.positions = pd.host().data();
      ReferenceGatedDeltaRule(ref);
      const double tolerance = exact ? 1e-4 : 1e-2;
      const std::string what =
          std::string(exact ? "exact" : "fast") + " layout " + std::to_string(i);
      ExpectNear(od.Read(), want, tolerance, what + " out");
      ExpectNear(st.Read(), want_states, tolerance, what + " states");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace gizllm::testing
