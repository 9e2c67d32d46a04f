// The CUDA backend over weights in ggml's blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, Q1_0):
// Matmul against the same weights dequantized (formats/ggml_blocks.h, checked against llama.cpp)
// and multiplied in float64, with bias, accumulate, SwiGLU and a plain output beside a ggml one;
// Matmul against the CPU's ggml kernels for decode and batches over inputs of several tiles;
// Embed bit for bit; GGUF models whose matrices stay in their blocks against the same values as
// float32 weights, both on CUDA in exact mode; and the folders convert makes of GGUF files against
// the files. Skipped without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/thread_pool.h"
#include "formats/ggml_blocks.h"
#include "gguf_from_hf.h"
#include "jobs/convert.h"
#include "model/config.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

#define GZ_SKIP_WITHOUT_CUDA()                                             \
  do {                                                                     \
    if (CudaDeviceCount() == 0)                                            \
      GTEST_SKIP() << "no CUDA device was found: CUDA ggml tests skipped"; \
  } while (0)

std::shared_ptr<Backend> Cuda(bool exact) {
  DeviceOptions device;
  device.device = "cuda";
  device.exact = exact;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  return backend.ok() ? *backend : nullptr;
}

// A device buffer of `n` floats holding `v` (or NaN where v is empty).
struct DeviceFloats {
  std::unique_ptr<Buffer> buffer;
  float* data = nullptr;
};
DeviceFloats Upload(Backend& b, const std::vector<float>& v, size_t n) {
  DeviceFloats d;
  auto buffer = b.Allocate(n * 4);
  EXPECT_TRUE(buffer.ok());
  d.buffer = std::move(*buffer);
  d.data = static_cast<float*>(d.buffer->data());
  std::vector<float> host = v.empty() ? std::vector<float>(n, std::nanf("")) : v;
  b.CopyToDevice(d.data, host.data(), n * 4);
  return d;
}
std::vector<float> Download(Backend& b, const float* d, size_t n) {
  std::vector<float> v(n);
  b.CopyToHost(v.data(), d, n * 4);
  return v;
}

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::string blocks;
  std::vector<float> values;  // [rows, cols], dequantized
  Weight host, device;
  std::unique_ptr<Buffer> storage;
};

// `copy`: with the backend's bf16 copy where it keeps one (Backend::AddBf16Copy).
void MakeMatrix(Backend& b, GgmlType type, int64_t rows, int64_t cols, uint32_t seed, Matrix* m,
                bool copy = false) {
  m->rows = rows;
  m->cols = cols;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> like(rows * cols);
  for (float& v : like) v = normal(rng);
  m->blocks = testing::RandomBlocks(type, like, seed);
  m->values.resize(rows * cols);
  ASSERT_TRUE(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(m->blocks.data()),
                               m->blocks.size(), rows * cols, m->values.data(), "m")
                  .ok());
  m->host = Weight{.format = Format::kGgml, .rows = rows, .cols = cols, .data = m->blocks.data()};
  m->host.ggml_type = static_cast<uint32_t>(type);
  auto w = b.PrepareWeight(m->host, &m->storage);
  ASSERT_TRUE(w.ok()) << w.status().message();
  m->device = *w;
  if (copy) b.AddBf16Copy(&m->device, &m->storage);
}

// out[r, n] against base[r, n] + sum_c W[n, c] x[r, c] + bias[n] in float64: a float32 sum in any
// order lies within about cols * 2^-24 * sum |terms|. With `bf16`, W and x were rounded to bf16
// first (the many-row path of fast mode): each product within (1 + 2^-9)^2 - 1 < 2^-8 + 2^-17
// of its own size more.
void ExpectProducts(const Matrix& m, const std::vector<float>& x, int64_t rows,
                    const std::vector<float>& bias, const std::vector<float>& base,
                    const std::vector<float>& out, const std::string& what, bool bf16 = false) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < m.rows; ++n) {
      double exact = 0, magnitude = 0, products = 0;
      auto add = [&](double t) {
        exact += t;
        magnitude += std::fabs(t);
      };
      if (!bias.empty()) add(bias[n]);
      if (!base.empty()) add(base[r * m.rows + n]);
      for (int64_t c = 0; c < m.cols; ++c) {
        const double t = double{m.values[n * m.cols + c]} * x[r * m.cols + c];
        add(t);
        products += std::fabs(t);
      }
      const double bound =
          (m.cols + 3) * std::ldexp(1.0, -24) * magnitude +
          (bf16 ? (std::ldexp(1.0, -8) + std::ldexp(1.0, -17)) * products : 0.0);
      const float got = out[r * m.rows + n];
      if (!(std::fabs(got - exact) <= bound) && bad++ < 5) {
        ADD_FAILURE() << what << " row " << r << " output " << n << ": " << got << " vs " << exact
                      << " (bound " << bound << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0,   GgmlType::kQ4_K, GgmlType::kQ5_K,
                               GgmlType::kQ6_K, GgmlType::kIQ4_XS, GgmlType::kQ1_0};

TEST(CudaGgmlTest, MatmulMatchesTheDequantizedProducts) {
  GZ_SKIP_WITHOUT_CUDA();
  for (bool exact : {true, false}) {
    std::shared_ptr<Backend> b = Cuda(exact);
    ASSERT_NE(b, nullptr);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    uint32_t seed = 1;
    for (GgmlType type : kTypes) {
      ASSERT_TRUE(b->ReadsGgml(static_cast<uint32_t>(type)));
      // Past a warp's first round of loads at 4,352 inputs (kUnroll steps).
      for (int64_t cols : {256, 768, 4352}) {
        for (int64_t rows : {1, 3, 5, 19}) {  // the decode kernels' 1, 4 and 8 rows, and more
          for (bool accumulate : {false, true}) {
            const std::string what = GgmlTypeName(type) + (exact ? " exact" : " fast") + " cols " +
                                     std::to_string(cols) + " rows " + std::to_string(rows) +
                                     (accumulate ? " accumulate" : "");
            Matrix a, c;
            MakeMatrix(*b, type, 37, cols, seed++, &a);  // not a multiple of a block's warps
            MakeMatrix(*b, type, 5, cols, seed++, &c);
            std::vector<float> x(rows * cols), bias(a.rows), base_a(rows * a.rows),
                base_c(rows * c.rows);
            for (float& v : x) v = uniform(rng);
            for (float& v : bias) v = uniform(rng);
            for (float& v : base_a) v = uniform(rng);
            for (float& v : base_c) v = uniform(rng);
            DeviceFloats dx = Upload(*b, x, x.size()), dbias = Upload(*b, bias, bias.size());
            DeviceFloats da =
                accumulate ? Upload(*b, base_a, base_a.size()) : Upload(*b, {}, base_a.size());
            DeviceFloats dc =
                accumulate ? Upload(*b, base_c, base_c.size()) : Upload(*b, {}, base_c.size());
            MatmulParams p;
            p.x = dx.data;
            p.rows = rows;
            // Accumulating products take one output (MatmulParams::Check).
            p.outputs = accumulate ? 1 : 2;
            p.w[0] = &a.device;
            p.w[1] = &c.device;
            p.out[0] = da.data;
            p.out[1] = accumulate ? nullptr : dc.data;
            p.bias[0] = dbias.data;
            p.accumulate = accumulate;
            ASSERT_TRUE(p.Check().ok()) << what;
            b->Matmul(p);
            // Fast mode past 8 rows decodes these types to bf16 for cuBLASLt.
            const bool bf16 = !exact && rows > 8 && type != GgmlType::kQ5_K &&
                              type != GgmlType::kIQ4_XS;
            ExpectProducts(a, x, rows, bias, accumulate ? base_a : std::vector<float>{},
                           Download(*b, da.data, base_a.size()), what + " output 0", bf16);
            if (!accumulate) {
              ExpectProducts(c, x, rows, {}, std::vector<float>{},
                             Download(*b, dc.data, base_c.size()), what + " output 1", bf16);
            }
          }
        }
      }
    }
  }
}

// Fast mode keeps a bf16 copy of each linear whose blocks its many-row path decodes (the device
// has room): products of many rows read it and equal those that decode the blocks each time,
// bit for bit; one row still reads the blocks. Exact mode and --no-bf16-copies keep none.
TEST(CudaGgmlTest, Bf16CopiesGiveTheDecodedProducts) {
  GZ_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Backend> fast = Cuda(/*exact=*/false), exact = Cuda(/*exact=*/true);
  DeviceOptions off;
  off.device = "cuda";
  off.bf16_copies = false;
  auto none = OpenBackend(off);
  ASSERT_TRUE(fast && exact && none.ok());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  uint32_t seed = 100;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K,
                        GgmlType::kQ1_0, GgmlType::kQ5_K}) {
    const std::string name = GgmlTypeName(type);
    const bool decoded = type != GgmlType::kQ5_K;  // Q5_K has no bf16 decode: no copy
    Matrix plain, copied, in_exact, in_none;
    MakeMatrix(*fast, type, 45, 1024, seed, &plain);
    MakeMatrix(*fast, type, 45, 1024, seed, &copied, /*copy=*/true);
    MakeMatrix(*exact, type, 45, 1024, seed, &in_exact, /*copy=*/true);
    MakeMatrix(**none, type, 45, 1024, seed, &in_none, /*copy=*/true);
    ++seed;
    EXPECT_EQ(plain.device.bf16, nullptr) << name;
    EXPECT_EQ(copied.device.bf16 != nullptr, decoded) << name;
    EXPECT_EQ(in_exact.device.bf16, nullptr) << name;
    EXPECT_EQ(in_none.device.bf16, nullptr) << name;
    for (int64_t rows : {1, 19, 64}) {
      std::vector<float> x(rows * 1024);
      for (float& v : x) v = uniform(rng);
      DeviceFloats dx = Upload(*fast, x, x.size());
      std::vector<float> outs[2];
      for (int k = 0; k < 2; ++k) {
        DeviceFloats out = Upload(*fast, {}, rows * 45);
        MatmulParams p;
        p.x = dx.data;
        p.rows = rows;
        p.outputs = 1;
        p.w[0] = k ? &copied.device : &plain.device;
        p.out[0] = out.data;
        ASSERT_TRUE(p.Check().ok());
        fast->Matmul(p);
        outs[k] = Download(*fast, out.data, rows * 45);
        ExpectProducts(plain, x, rows, {}, {}, outs[k], name + " rows " + std::to_string(rows),
                       /*bf16=*/rows > 8 && decoded);
      }
      EXPECT_EQ(outs[0], outs[1]) << name << " rows " << rows;
    }
  }
}

// CUDA's products against the CPU's ggml kernels over the same blocks: decode (1 row) and batches
// (7 and 64 rows), inputs of one to several of Q1_0's tiles (8,192 inputs for decode, 1,024 for
// batches), 45 outputs (not a multiple of a block's rows). Each lies within cols * 2^-24 * sum |w
// x| of the exact sum, so the two within twice that.
TEST(CudaGgmlTest, MatmulMatchesTheCpuKernels) {
  GZ_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Backend> b = Cuda(/*exact=*/true);
  ASSERT_NE(b, nullptr);
  ThreadPool pool(2);
  CpuBackend cpu(&pool, CpuOptions{});
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  uint32_t seed = 100;
  for (GgmlType type : kTypes) {
    GgmlBlock block;
    ASSERT_TRUE(GgmlBlockOf(type, &block));
    for (int64_t cols : {3 * block.elements, int64_t{2304}, int64_t{8448}}) {
      Matrix m;
      MakeMatrix(*b, type, 45, cols, seed++, &m);
      for (int64_t rows : {1, 7, 64}) {
        const std::string what =
            GgmlTypeName(type) + " cols " + std::to_string(cols) + " rows " + std::to_string(rows);
        std::vector<float> x(rows * cols);
        for (float& v : x) v = uniform(rng);
        std::vector<float> want(rows * m.rows, std::nanf(""));
        MatmulParams p;
        p.x = x.data();
        p.rows = rows;
        p.outputs = 1;
        p.w[0] = &m.host;
        p.out[0] = want.data();
        cpu.Matmul(p);
        DeviceFloats dx = Upload(*b, x, x.size()), dout = Upload(*b, {}, want.size());
        p.x = dx.data;
        p.w[0] = &m.device;
        p.out[0] = dout.data;
        b->Matmul(p);
        const std::vector<float> got = Download(*b, dout.data, want.size());
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t n = 0; n < m.rows; ++n) {
            double magnitude = 0;
            for (int64_t c = 0; c < cols; ++c)
              magnitude += std::fabs(double{m.values[n * cols + c]} * x[r * cols + c]);
            const double bound = 2 * (cols + 2) * std::ldexp(1.0, -24) * magnitude;
            const float g = got[r * m.rows + n], w = want[r * m.rows + n];
            if (!(std::fabs(double{g} - w) <= bound) && bad++ < 5) {
              ADD_FAILURE() << what << " row " << r << " output " << n << ": cuda " << g << " cpu "
                            << w << " (bound " << bound << ")";
            }
          }
        }
        EXPECT_EQ(bad, 0) << what;
      }
    }
  }
}

// gate and up in blocks with the SwiGLU end: silu(gate) * up of the products.
TEST(CudaGgmlTest, SwiGluEnd) {
  GZ_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Backend> b = Cuda(/*exact=*/true);
  ASSERT_NE(b, nullptr);
  if (!b->FusesSwiGlu()) GTEST_SKIP() << "the backend leaves SwiGLU to the Glu op";
  Matrix gate, up;
  MakeMatrix(*b, GgmlType::kQ4_K, 40, 512, 5, &gate);
  MakeMatrix(*b, GgmlType::kQ4_K, 40, 512, 6, &up);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t rows = 3;
  std::vector<float> x(rows * 512);
  for (float& v : x) v = uniform(rng);
  DeviceFloats dx = Upload(*b, x, x.size()), dg = Upload(*b, {}, rows * 40),
               du = Upload(*b, {}, rows * 40);
  MatmulParams p;
  p.x = dx.data;
  p.rows = rows;
  p.outputs = 2;
  p.w[0] = &gate.device;
  p.w[1] = &up.device;
  p.out[0] = dg.data;
  p.out[1] = du.data;
  p.swiglu = true;
  b->Matmul(p);
  const std::vector<float> got = Download(*b, dg.data, rows * 40);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < 40; ++n) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < 512; ++c) {
        g += double{gate.values[n * 512 + c]} * x[r * 512 + c];
        u += double{up.values[n * 512 + c]} * x[r * 512 + c];
      }
      const double want = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(got[r * 40 + n], want, 1e-5 * (1 + std::fabs(want))) << r << " " << n;
    }
  }
}

// Embed decodes the looked-up rows: exactly the dequantized values times the scale.
TEST(CudaGgmlTest, EmbedReadsRowsFromBlocks) {
  GZ_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Backend> b = Cuda(/*exact=*/false);
  ASSERT_NE(b, nullptr);
  for (GgmlType type : kTypes) {
    Matrix table;
    MakeMatrix(*b, type, 50, 768, 9, &table);
    const std::vector<int32_t> tokens = {49, 0, 7, 7, 23, 1, 48};
    auto tb = b->Allocate(tokens.size() * 4);
    ASSERT_TRUE(tb.ok());
    b->CopyToDevice((*tb)->data(), tokens.data(), tokens.size() * 4);
    for (float scale : {1.0f, 1.5f}) {
      DeviceFloats out = Upload(*b, {}, tokens.size() * 768);
      b->Embed({.out = out.data,
                .table = &table.device,
                .tokens = static_cast<const int32_t*>((*tb)->data()),
                .rows = static_cast<int64_t>(tokens.size()),
                .scale = scale});
      const std::vector<float> got = Download(*b, out.data, tokens.size() * 768);
      for (size_t r = 0; r < tokens.size(); ++r) {
        for (int64_t c = 0; c < 768; ++c) {
          const float v = table.values[tokens[r] * 768 + c];
          ASSERT_EQ(got[r * 768 + c], scale != 1.0f ? v * scale : v)
              << GgmlTypeName(type) << " row " << r << " col " << c;
        }
      }
    }
  }
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("gizllm_cuda_ggml_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

std::vector<float> Logits(const std::string& path, std::span<const int32_t> ids) {
  std::shared_ptr<Backend> b = Cuda(/*exact=*/true);
  if (!b) return {};
  auto model = Model::Load(path, b);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  auto logits = SequenceLogits(**model, ids);
  EXPECT_TRUE(logits.ok()) << logits.status().message();
  return logits.ok() ? *logits : std::vector<float>{};
}

// The logits of `dir` written as a GGUF file with `linears` (kBlocks: blocks of `type` with random
// codes), its matrices kept in their blocks on CUDA, against a float32 folder of the same values,
// both on CUDA in exact mode: within 1e-4 of the largest logit (and at least 1e-4; the golden
// tests' measure). Random 1-bit codes give tiny-chat logits near 80, where the two sums' orders
// differ by 6.4e-4 (8e-6 of the largest).
void ExpectSameLogits(const std::string& dir, testing::GgufLinears linears,
                      GgmlType type = GgmlType::kQ8_0) {
  SCOPED_TRACE(dir + " " + GgmlTypeName(type));
  TempDir tmp;
  const std::string gguf = tmp.File("m.gguf"), folder = tmp.File("dequantized");
  const Status written = testing::WriteGgufFromHf(dir, gguf, linears, "qwen2", folder, type);
  ASSERT_TRUE(written.ok()) << written.message();
  auto arch = ReadArch(folder);
  ASSERT_TRUE(arch.ok()) << arch.status().message();
  std::mt19937 rng(11);
  std::vector<int32_t> ids(37);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % arch->vocab);
  const std::vector<float> want = Logits(folder, ids);
  const std::vector<float> got = Logits(gguf, ids);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  float most = 0.0f, peak = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    most = std::max(most, std::fabs(got[i] - want[i]));
    peak = std::max(peak, std::fabs(want[i]));
  }
  EXPECT_LE(most, 1e-4f * std::max(1.0f, peak)) << "the largest logit's size " << peak;
}

// tiny-chat quantized as llama.cpp quantizes to Q8_0 and Q4_0 (embedding and linears kept in
// their blocks on CUDA).
TEST(CudaGgmlTest, GgufLogitsMatchTheDequantizedFolders) {
  GZ_SKIP_WITHOUT_CUDA();
  ExpectSameLogits("models/tiny-chat", testing::GgufLinears::kQ8_0);
  ExpectSameLogits("models/tiny-chat", testing::GgufLinears::kQ4_0, GgmlType::kQ4_0);
}

// Blocks of random codes: Q1_0 in tiny-chat, Q5_K, IQ4_XS and Q1_0 in a small random Qwen3 (tied
// head) and Llama whose rows are 256 and 512 inputs.
TEST(CudaGgmlTest, GgufLogitsInBlockTypesMatchTheDequantizedFolders) {
  GZ_SKIP_WITHOUT_CUDA();
  ExpectSameLogits("models/tiny-chat", testing::GgufLinears::kBlocks, GgmlType::kQ1_0);
  TempDir tmp;
  for (const char* family : {"qwen3", "llama"}) {
    const Status s = testing::WriteWideHf(tmp.File(family), family);
    ASSERT_TRUE(s.ok()) << s.message();
    for (GgmlType type : {GgmlType::kQ5_K, GgmlType::kIQ4_XS, GgmlType::kQ1_0}) {
      ExpectSameLogits(tmp.File(family), testing::GgufLinears::kBlocks, type);
    }
  }
}

// Qwen3-MoE GGUF files on CUDA: experts as stored (BF16) and in F32 run (within 1e-4 of the
// folder of the values written); experts in a block type the grouped expert kernels do not read
// (Q8_0) are refused at load, naming the experts and the way out.
TEST(CudaGgmlTest, Qwen3MoeGgufExperts) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::string dir = "tests/golden/models/qwen3_moe";
  ExpectSameLogits(dir, testing::GgufLinears::kAsStored);
  ExpectSameLogits(dir, testing::GgufLinears::kF32);
  TempDir tmp;
  const std::string gguf = tmp.File("q8.gguf");
  ASSERT_TRUE(testing::WriteGgufFromHf(dir, gguf, testing::GgufLinears::kQ8_0).ok());
  std::shared_ptr<Backend> b = Cuda(/*exact=*/true);
  ASSERT_TRUE(b);
  auto model = Model::Load(gguf, b);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("experts are in Q8_0"), std::string::npos)
      << model.status().message();
  EXPECT_NE(model.status().message().find("--device cpu"), std::string::npos);
}

// Folders made from GGUF files by convert (jobs/convert.h) read the same blocks with the same
// kernels, so on CUDA they give the file's logits bit for bit: the own format with the block types
// kept (Q4_0), and a bitgpu folder of a Q1_0 file (convert's manifest).
TEST(CudaGgmlTest, ConvertedFoldersGiveTheGgufLogits) {
  GZ_SKIP_WITHOUT_CUDA();
  TempDir tmp;
  struct Case {
    testing::GgufLinears linears;
    GgmlType type;
    bool manifest;
  };
  for (const Case& c : {Case{testing::GgufLinears::kQ4_0, GgmlType::kQ4_0, false},
                        Case{testing::GgufLinears::kBlocks, GgmlType::kQ1_0, true}}) {
    SCOPED_TRACE(GgmlTypeName(c.type));
    const std::string gguf = tmp.File(GgmlTypeName(c.type) + ".gguf");
    const std::string dir = tmp.File(GgmlTypeName(c.type));
    ASSERT_TRUE(
        testing::WriteGgufFromHf("models/tiny-chat", gguf, c.linears, "qwen2", "", c.type).ok());
    quant::ConvertOptions options;
    options.from = gguf;
    options.to = dir;
    options.keep_types = true;
    options.manifest = c.manifest;
    auto summary = quant::Convert(options);
    ASSERT_TRUE(summary.ok()) << summary.status().message();
    std::mt19937 rng(7);
    std::vector<int32_t> ids(31);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 1000);
    const std::vector<float> want = Logits(gguf, ids);
    const std::vector<float> got = Logits(dir, ids);
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits";
  }
}

}  // namespace
}  // namespace gizllm
