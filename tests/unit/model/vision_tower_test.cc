// The Qwen3-VL vision tower on the CPU backend, on a small random tower written here: its rows
// and deepstack features against a plain float64 reference of transformers' Qwen3VLVisionModel
// written out in this file (patch embedding, the position table interpolated bilinearly, the
// 2-D rotation by rotate-half over each head's natural layout, attention within each frame,
// the mergers), pictures run together against each alone, the interpolation taps and rotary
// positions on hand-worked grids, and the errors a caller can cause.
#include "model/vision_tower.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "ops/device.h"
#include "tests/unit/model/cuda_or_null.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
constexpr int kDepth = 3, kDim = 16, kHeads = 2, kFfn = 24, kPatch = 2, kTemporal = 2,
              kChannels = 3, kMerge = 2, kSide = 3, kOut = 12;
constexpr int kPatchFloats = kChannels * kTemporal * kPatch * kPatch;  // 24
constexpr int kHeadDim = kDim / kHeads;                                // 8
constexpr int kMerged = kDim * kMerge * kMerge;                        // 64
const std::vector<int> kDeepstack = {0, 2};

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

std::shared_ptr<Backend> Cpu() {
  auto be = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  EXPECT_TRUE(be.ok()) << be.status().message();
  return std::move(be).value();
}

class VisionTowerTest : public ::testing::Test {
 protected:
  void Add(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& f : v) f = d(rng_);
    tensors_[name] = {std::move(shape), std::move(v)};
  }
  const std::vector<float>& T(const std::string& name) { return tensors_.at(name).second; }

  // A Qwen3-VL folder holding only the tower (what VisionTower reads).
  std::string Write(const std::string& act = "gelu_pytorch_tanh") {
    tensors_.clear();
    const std::string p = "model.visual.";
    Add(p + "patch_embed.proj.weight", {kDim, kChannels, kTemporal, kPatch, kPatch}, 0.3f);
    Add(p + "patch_embed.proj.bias", {kDim}, 0.2f);
    Add(p + "pos_embed.weight", {kSide * kSide, kDim}, 0.5f);
    for (int l = 0; l < kDepth; ++l) {
      const std::string b = p + "blocks." + std::to_string(l) + ".";
      for (const char* n : {"norm1", "norm2"}) {
        Add(b + n + ".weight", {kDim}, 0.2f, 1.0f);
        Add(b + n + ".bias", {kDim}, 0.2f);
      }
      Add(b + "attn.qkv.weight", {3 * kDim, kDim}, 0.4f);
      Add(b + "attn.qkv.bias", {3 * kDim}, 0.2f);
      Add(b + "attn.proj.weight", {kDim, kDim}, 0.3f);
      Add(b + "attn.proj.bias", {kDim}, 0.2f);
      Add(b + "mlp.linear_fc1.weight", {kFfn, kDim}, 0.3f);
      Add(b + "mlp.linear_fc1.bias", {kFfn}, 0.2f);
      Add(b + "mlp.linear_fc2.weight", {kDim, kFfn}, 0.3f);
      Add(b + "mlp.linear_fc2.bias", {kDim}, 0.2f);
    }
    auto merger = [&](const std::string& m, int64_t norm_dim) {
      Add(m + "norm.weight", {norm_dim}, 0.2f, 1.0f);
      Add(m + "norm.bias", {norm_dim}, 0.2f);
      Add(m + "linear_fc1.weight", {kMerged, kMerged}, 0.2f);
      Add(m + "linear_fc1.bias", {kMerged}, 0.2f);
      Add(m + "linear_fc2.weight", {kOut, kMerged}, 0.2f);
      Add(m + "linear_fc2.bias", {kOut}, 0.2f);
    };
    merger(p + "merger.", kDim);
    for (size_t i = 0; i < kDeepstack.size(); ++i)
      merger(p + "deepstack_merger_list." + std::to_string(i) + ".", kMerged);
    const std::string dir =
        (fs::path(::testing::TempDir()) / ("vision_tower_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<TensorToWrite> out;
    for (const auto& [n, t] : tensors_)
      out.push_back({n, DType::kF32, t.first, t.second.data(), t.second.size() * sizeof(float)});
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", out, {}).ok());
    nlohmann::json config = {{"architectures", {"Qwen3VLForConditionalGeneration"}},
                             {"model_type", "qwen3_vl"},
                             {"image_token_id", 40},
                             {"vision_start_token_id", 41},
                             {"video_token_id", 42},
                             {"vision_config",
                              {{"depth", kDepth},
                               {"hidden_size", kDim},
                               {"intermediate_size", kFfn},
                               {"num_heads", kHeads},
                               {"in_channels", kChannels},
                               {"patch_size", kPatch},
                               {"temporal_patch_size", kTemporal},
                               {"spatial_merge_size", kMerge},
                               {"out_hidden_size", kOut},
                               {"num_position_embeddings", kSide * kSide},
                               {"deepstack_visual_indexes", kDeepstack},
                               {"hidden_act", act}}}};
    std::ofstream(dir + "/config.json") << config.dump();
    return dir;
  }

  std::vector<float> Pixels(int64_t patches) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(patches * kPatchFloats);
    for (float& f : v) f = d(rng_);
    return v;
  }

  // transformers' Qwen3VLVisionModel in float64: the rows (merger) and the deepstack features.
  void Reference(const std::vector<float>& pixels, const std::vector<VisionGrid>& grids,
                 bool gelu_tanh, std::vector<double>* rows,
                 std::vector<std::vector<double>>* deepstack) {
    const std::string p = "model.visual.";
    int64_t n = 0;
    for (const VisionGrid& g : grids) n += g.Patches();
    std::vector<double> x(n * kDim);
    auto linear = [&](const std::vector<double>& in, int64_t count, int64_t cols,
                      const std::string& name, int64_t outs) {
      std::vector<double> out(count * outs);
      const std::vector<float>& w = T(name + ".weight");
      const std::vector<float>& b = T(name + ".bias");
      for (int64_t r = 0; r < count; ++r)
        for (int64_t o = 0; o < outs; ++o) {
          double s = b[o];
          for (int64_t c = 0; c < cols; ++c) s += in[r * cols + c] * w[o * cols + c];
          out[r * outs + o] = s;
        }
      return out;
    };
    auto layer_norm = [&](std::vector<double> v, int64_t width, const std::string& name) {
      for (size_t r = 0; r < v.size() / width; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < width; ++i) mean += v[r * width + i] / width;
        for (int64_t i = 0; i < width; ++i) var += std::pow(v[r * width + i] - mean, 2) / width;
        for (int64_t i = 0; i < width; ++i)
          v[r * width + i] =
              (v[r * width + i] - mean) / std::sqrt(var + 1e-6) * T(name + ".weight")[i] +
              T(name + ".bias")[i];
      }
      return v;
    };
    std::vector<double> pix(pixels.begin(), pixels.end());
    x = linear(pix, n, kPatchFloats, p + "patch_embed.proj", kDim);
    // Positions: each picture's table rows interpolated in row-major order, then each frame
    // laid out in merge windows; the (row, column) of each patch likewise.
    std::vector<int> row_of, col_of;
    int64_t at = 0;
    for (const VisionGrid& g : grids) {
      std::vector<double> grid(g.h * g.w * kDim);
      for (int64_t y = 0; y < g.h; ++y) {
        for (int64_t xx = 0; xx < g.w; ++xx) {
          const double fy = g.h == 1 ? 0 : y * double(kSide - 1) / double(g.h - 1);
          const double fx = g.w == 1 ? 0 : xx * double(kSide - 1) / double(g.w - 1);
          const int y0 = int(fy), x0 = int(fx);
          const int y1 = std::min(y0 + 1, kSide - 1), x1 = std::min(x0 + 1, kSide - 1);
          const double dy = fy - y0, dx = fx - x0;
          const int idx[4] = {y0 * kSide + x0, y0 * kSide + x1, y1 * kSide + x0, y1 * kSide + x1};
          const double wt[4] = {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx};
          for (int j = 0; j < 4; ++j)
            for (int c = 0; c < kDim; ++c)
              grid[(y * g.w + xx) * kDim + c] +=
                  wt[j] * T(p + "pos_embed.weight")[idx[j] * kDim + c];
        }
      }
      for (int64_t t = 0; t < g.t; ++t)
        for (int64_t by = 0; by < g.h / kMerge; ++by)
          for (int64_t bx = 0; bx < g.w / kMerge; ++bx)
            for (int iy = 0; iy < kMerge; ++iy)
              for (int ix = 0; ix < kMerge; ++ix, ++at) {
                const int64_t y = by * kMerge + iy, xx = bx * kMerge + ix;
                for (int c = 0; c < kDim; ++c) x[at * kDim + c] += grid[(y * g.w + xx) * kDim + c];
                row_of.push_back(static_cast<int>(y));
                col_of.push_back(static_cast<int>(xx));
              }
    }
    // The rotation over a head's natural layout: freqs = [row * inv, col * inv], emb = cat(freqs,
    // freqs), q * cos(emb) + rotate_half(q) * sin(emb).
    auto rotate = [&](std::vector<double>& q) {
      for (int64_t r = 0; r < n; ++r)
        for (int h = 0; h < kHeads; ++h) {
          double* v = q.data() + r * kDim + h * kHeadDim;
          double emb[kHeadDim];
          for (int i = 0; i < kHeadDim / 4; ++i) {
            const double inv = 1.0 / std::pow(10000.0, 2.0 * i / (kHeadDim / 2));
            emb[i] = emb[i + kHeadDim / 2] = row_of[r] * inv;
            emb[i + kHeadDim / 4] = emb[i + kHeadDim / 4 + kHeadDim / 2] = col_of[r] * inv;
          }
          double out[kHeadDim];
          for (int i = 0; i < kHeadDim; ++i) {
            const double half = i < kHeadDim / 2 ? -v[i + kHeadDim / 2] : v[i - kHeadDim / 2];
            out[i] = v[i] * std::cos(emb[i]) + half * std::sin(emb[i]);
          }
          std::copy(out, out + kHeadDim, v);
        }
    };
    std::vector<int64_t> starts = {0};
    for (const VisionGrid& g : grids)
      for (int64_t t = 0; t < g.t; ++t) starts.push_back(starts.back() + g.h * g.w);
    const int64_t merged = n / (kMerge * kMerge);
    auto run_merger = [&](const std::string& m, bool norm_merged) {
      std::vector<double> h =
          norm_merged ? layer_norm(x, kMerged, m + "norm") : layer_norm(x, kDim, m + "norm");
      std::vector<double> f = linear(h, merged, kMerged, m + "linear_fc1", kMerged);
      for (double& v : f) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      return linear(f, merged, kMerged, m + "linear_fc2", kOut);
    };
    deepstack->clear();
    for (int l = 0; l < kDepth; ++l) {
      const std::string b = p + "blocks." + std::to_string(l) + ".";
      std::vector<double> h = layer_norm(x, kDim, b + "norm1");
      std::vector<double> qkv = linear(h, n, kDim, b + "attn.qkv", 3 * kDim);
      std::vector<double> q(n * kDim), k(n * kDim), v(n * kDim);
      for (int64_t r = 0; r < n; ++r)
        for (int c = 0; c < kDim; ++c) {
          q[r * kDim + c] = qkv[r * 3 * kDim + c];
          k[r * kDim + c] = qkv[r * 3 * kDim + kDim + c];
          v[r * kDim + c] = qkv[r * 3 * kDim + 2 * kDim + c];
        }
      rotate(q);
      rotate(k);
      std::vector<double> attn(n * kDim);
      for (size_t s = 0; s + 1 < starts.size(); ++s)
        for (int64_t r = starts[s]; r < starts[s + 1]; ++r)
          for (int hd = 0; hd < kHeads; ++hd) {
            std::vector<double> score;
            double top = -1e300;
            for (int64_t j = starts[s]; j < starts[s + 1]; ++j) {
              double d = 0;
              for (int i = 0; i < kHeadDim; ++i)
                d += q[r * kDim + hd * kHeadDim + i] * k[j * kDim + hd * kHeadDim + i];
              score.push_back(d / std::sqrt(double(kHeadDim)));
              top = std::max(top, score.back());
            }
            double sum = 0;
            for (double& e : score) sum += (e = std::exp(e - top));
            for (int i = 0; i < kHeadDim; ++i) {
              double o = 0;
              for (int64_t j = starts[s]; j < starts[s + 1]; ++j)
                o += score[j - starts[s]] / sum * v[j * kDim + hd * kHeadDim + i];
              attn[r * kDim + hd * kHeadDim + i] = o;
            }
          }
      std::vector<double> o = linear(attn, n, kDim, b + "attn.proj", kDim);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      h = layer_norm(x, kDim, b + "norm2");
      std::vector<double> f = linear(h, n, kDim, b + "mlp.linear_fc1", kFfn);
      for (double& e : f) {
        e = gelu_tanh ? 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)))
                      : 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
      }
      o = linear(f, n, kFfn, b + "mlp.linear_fc2", kDim);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      for (size_t i = 0; i < kDeepstack.size(); ++i) {
        if (kDeepstack[i] == l)
          deepstack->push_back(
              run_merger(p + "deepstack_merger_list." + std::to_string(i) + ".", true));
      }
    }
    *rows = run_merger(p + "merger.", false);
  }

  std::mt19937 rng_{7};
  Tensors tensors_;
};

void ExpectNear(const std::vector<float>& ours, const std::vector<double>& ref, double tolerance,
                const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double top = 0, diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    top = std::max(top, std::fabs(ref[i]));
    const double d = std::fabs(ours[i] - ref[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
  }
  EXPECT_GT(top, 0.0) << what;
  EXPECT_LE(diff, tolerance * top) << what << ": max diff " << diff << ", max |ref| " << top;
}

TEST_F(VisionTowerTest, MatchesTheFloat64Reference) {
  for (const char* act : {"gelu_pytorch_tanh", "gelu"}) {
    const std::string dir = Write(act);
    auto tower = VisionTower::Load(dir, Cpu());
    ASSERT_TRUE(tower.ok()) << tower.status().message();
    // A picture, and a two-frame video whose frames attend each within itself.
    const std::vector<VisionGrid> grids = {{1, 4, 6}, {2, 2, 4}, {1, 6, 2}};
    const std::vector<float> pixels = Pixels(24 + 16 + 12);
    VisionOutput out;
    ASSERT_TRUE((*tower)->Run(pixels, grids, &out).ok());
    EXPECT_EQ(out.rows, (24 + 16 + 12) / 4);
    std::vector<double> rows;
    std::vector<std::vector<double>> deepstack;
    Reference(pixels, grids, std::string(act) == "gelu_pytorch_tanh", &rows, &deepstack);
    ExpectNear(out.embeddings, rows, 1e-5, std::string(act) + " rows");
    ASSERT_EQ(out.deepstack.size(), 2u);
    for (int i = 0; i < 2; ++i)
      ExpectNear(out.deepstack[i], deepstack[i], 1e-5,
                 std::string(act) + " deepstack " + std::to_string(i));
  }
}

// A run large enough that its position rows are computed on several threads (1,088 patches),
// and the same run with its rows kept in the backend's memory: the float64 reference, and the
// kept rows equal to the copied ones bit for bit.
TEST_F(VisionTowerTest, LargeRunsAndKeptRowsMatchTheReference) {
  auto tower = VisionTower::Load(Write(), Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  const std::vector<VisionGrid> grids = {{1, 32, 34}, {1, 2, 4}};
  const std::vector<float> pixels = Pixels(32 * 34 + 8);
  VisionOutput out, kept;
  ASSERT_TRUE((*tower)->Run(pixels, grids, &out).ok());
  ASSERT_TRUE((*tower)->Run(pixels, grids, &kept, /*keep_on_device=*/true).ok());
  std::vector<double> rows;
  std::vector<std::vector<double>> deepstack;
  Reference(pixels, grids, /*gelu_tanh=*/true, &rows, &deepstack);
  ExpectNear(out.embeddings, rows, 1e-5, "rows");
  ASSERT_EQ(out.deepstack.size(), 2u);
  for (int i = 0; i < 2; ++i) ExpectNear(out.deepstack[i], deepstack[i], 1e-5, "deepstack");
  ASSERT_NE(kept.device, nullptr);
  EXPECT_TRUE(kept.embeddings.empty() && kept.deepstack.empty());
  EXPECT_EQ(kept.rows, out.rows);
  const size_t plane = out.embeddings.size();
  ASSERT_EQ(kept.device->bytes(), 3 * plane * sizeof(float));
  const float* d = kept.device->as<float>();  // the CPU backend's memory is the host's
  EXPECT_TRUE(std::equal(out.embeddings.begin(), out.embeddings.end(), d));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::equal(out.deepstack[i].begin(), out.deepstack[i].end(), d + (1 + i) * plane))
        << "deepstack " << i;
  }
}

// The same on the CUDA backend: exact mode (float32) within 1e-3 of the largest value, fast mode
// within 2e-2. Skips without a CUDA device.
TEST_F(VisionTowerTest, CudaMatchesTheFloat64Reference) {
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    auto tower = VisionTower::Load(Write(), cuda);
    ASSERT_TRUE(tower.ok()) << tower.status().message();
    const std::vector<VisionGrid> grids = {{1, 4, 6}, {2, 2, 4}, {1, 6, 2}};
    const std::vector<float> pixels = Pixels(24 + 16 + 12);
    VisionOutput out;
    ASSERT_TRUE((*tower)->Run(pixels, grids, &out).ok());
    std::vector<double> rows;
    std::vector<std::vector<double>> deepstack;
    Reference(pixels, grids, /*gelu_tanh=*/true, &rows, &deepstack);
    const double tolerance = exact ? 1e-3 : 2e-2;
    const std::string mode = exact ? "exact" : "fast";
    ExpectNear(out.embeddings, rows, tolerance, mode + " rows");
    ASSERT_EQ(out.deepstack.size(), 2u);
    for (int i = 0; i < 2; ++i)
      ExpectNear(out.deepstack[i], deepstack[i], tolerance, mode + " deepstack");
  }
}

TEST_F(VisionTowerTest, PicturesTogetherEqualEachAlone) {
  auto tower = VisionTower::Load(Write(), Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  const std::vector<VisionGrid> grids = {{1, 4, 6}, {1, 6, 4}};
  const std::vector<float> pixels = Pixels(48);
  VisionOutput both, first, second;
  ASSERT_TRUE((*tower)->Run(pixels, grids, &both).ok());
  const std::span<const float> all(pixels);
  ASSERT_TRUE((*tower)->Run(all.first(24 * kPatchFloats), {&grids[0], 1}, &first).ok());
  ASSERT_TRUE((*tower)->Run(all.subspan(24 * kPatchFloats), {&grids[1], 1}, &second).ok());
  std::vector<float> joined = first.embeddings;
  joined.insert(joined.end(), second.embeddings.begin(), second.embeddings.end());
  std::vector<double> ref(joined.begin(), joined.end());
  ExpectNear(both.embeddings, ref, 1e-6, "rows");
  // The second picture alone differs from the first: the pictures do not share rows.
  EXPECT_NE(first.embeddings,
            std::vector<float>(second.embeddings.begin(), second.embeddings.end()));
}

TEST_F(VisionTowerTest, ErrorsNameTheProblem) {
  const std::string dir = Write();
  auto tower = VisionTower::Load(dir, Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  VisionOutput out;
  const std::vector<VisionGrid> odd = {{1, 4, 6}, {1, 3, 4}};
  Status s = (*tower)->Run(Pixels(36), odd, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("picture 1"), std::string::npos) << s.message();
  const std::vector<VisionGrid> one = {{1, 4, 6}};
  s = (*tower)->Run(Pixels(23), one, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pixel_values"), std::string::npos) << s.message();
  s = (*tower)->Run({}, {}, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // A checkpoint without the tower's tensors.
  fs::remove(dir + "/model.safetensors");
  const std::vector<TensorToWrite> none;
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", none, {}).ok());
  auto missing = VisionTower::Load(dir, Cpu());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.visual.patch_embed.proj.weight"),
            std::string::npos)
      << missing.status().message();
}

TEST(VisionTaps, HandWorkedGrid) {
  VisionArch a;
  a.merge = 2;
  a.grid_side = 5;
  const std::vector<VisionGrid> grids = {{1, 4, 6}};
  const PositionTaps taps = VisionPositionTaps(a, grids);
  ASSERT_EQ(taps.index.size(), 24u * 4);
  ASSERT_EQ(taps.weight.size(), 24u * 4);
  // Row 0 is patch (0, 0): the table's corner alone.
  EXPECT_EQ(std::vector<int32_t>(taps.index.begin(), taps.index.begin() + 4),
            (std::vector<int32_t>{0, 1, 5, 6}));
  EXPECT_FLOAT_EQ(taps.weight[0], 1.0f);
  EXPECT_FLOAT_EQ(taps.weight[1] + taps.weight[2] + taps.weight[3], 0.0f);
  // Row 1 is patch (0, 1): x = 4 / 5 of the way between columns 0 and 1.
  EXPECT_EQ(std::vector<int32_t>(taps.index.begin() + 4, taps.index.begin() + 8),
            (std::vector<int32_t>{0, 1, 5, 6}));
  EXPECT_NEAR(taps.weight[4], 0.2f, 1e-6);
  EXPECT_NEAR(taps.weight[5], 0.8f, 1e-6);
  // Row 3 is patch (1, 1): y = 4/3 (rows 1 and 2), x = 4/5 (columns 0 and 1).
  EXPECT_EQ(std::vector<int32_t>(taps.index.begin() + 12, taps.index.begin() + 16),
            (std::vector<int32_t>{5, 6, 10, 11}));
  EXPECT_NEAR(taps.weight[12], (2.0f / 3) * 0.2f, 1e-6);
  EXPECT_NEAR(taps.weight[15], (1.0f / 3) * 0.8f, 1e-6);
  // The last row is patch (3, 5): the far corner, the ceiling clipped to the table.
  EXPECT_EQ(std::vector<int32_t>(taps.index.end() - 4, taps.index.end()),
            (std::vector<int32_t>{24, 24, 24, 24}));
  EXPECT_FLOAT_EQ(taps.weight[23 * 4], 1.0f);
  for (size_t r = 0; r < 24; ++r) {
    float sum = 0;
    for (int j = 0; j < 4; ++j) sum += taps.weight[r * 4 + j];
    EXPECT_NEAR(sum, 1.0f, 1e-6) << r;
  }
  // Frames repeat the picture's taps.
  const std::vector<VisionGrid> video = {{2, 4, 6}};
  const PositionTaps twice = VisionPositionTaps(a, video);
  ASSERT_EQ(twice.index.size(), 48u * 4);
  EXPECT_TRUE(std::equal(taps.index.begin(), taps.index.end(), twice.index.begin() + 96));
}

TEST(VisionTaps, RotaryPositionsInMergeWindowOrder) {
  VisionArch a;
  a.merge = 2;
  const std::vector<VisionGrid> grids = {{1, 4, 6}, {1, 2, 2}};
  const std::vector<int32_t> pos = VisionRotaryPositions(a, grids);
  ASSERT_EQ(pos.size(), 2u * 28);
  // The first window (rows 0-1, columns 0-1), then the next window to its right.
  EXPECT_EQ(std::vector<int32_t>(pos.begin(), pos.begin() + 16),
            (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 0, 3, 1, 2, 1, 3}));
  // The third window's last patch, then the second row of windows.
  EXPECT_EQ(pos[2 * 11], 1);
  EXPECT_EQ(pos[2 * 11 + 1], 5);
  EXPECT_EQ(pos[2 * 12], 2);
  EXPECT_EQ(pos[2 * 12 + 1], 0);
  // The second picture starts again at (0, 0).
  EXPECT_EQ(std::vector<int32_t>(pos.end() - 8, pos.end()),
            (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(VisionTokens(a, {1, 4, 6}), 6);
  EXPECT_EQ(VisionTokens(a, {2, 2, 4}), 4);
}

// Qwen3.5-MoE's tower (the golden folder's tiny one: no deepstack) loads and runs.
TEST(VisionTowerQwen3_5, LoadsAndRuns) {
  const std::string dir = "tests/golden/models/qwen3_5_moe";
  if (!fs::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " is absent";
  auto tower = VisionTower::Load(dir, Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  EXPECT_TRUE((*tower)->arch().deepstack.empty());
  EXPECT_EQ((*tower)->arch().image_token, 248056);
  const std::vector<VisionGrid> grids = {{1, 4, 4}};
  std::vector<float> pixels(16 * (*tower)->arch().PatchFloats(), 0.5f);
  VisionOutput out;
  ASSERT_TRUE((*tower)->Run(pixels, grids, &out).ok());
  EXPECT_EQ(out.rows, 4);
  EXPECT_EQ(out.embeddings.size(), 4u * 64);
  EXPECT_TRUE(out.deepstack.empty());
  for (float v : out.embeddings) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace gizllm
