// The language model's side of Qwen3-VL on the CPU backend, on a small random model written
// here: M-RoPE positions of prompts with pictures (hand-worked, as transformers'
// get_rope_index), the M-RoPE rotation as three rotations of zero-masked tables against a
// float64 interleaved M-RoPE, picture rows and deepstack features placed where they belong,
// and a prompt with pictures read whole or in chunks that end inside a picture (Qwen3-VL, and
// Qwen3.5's hybrid with partial rotary M-RoPE).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "model/mrope.h"
#include "model/vision_tower.h"
#include "ops/device.h"
#include "tests/unit/model/cuda_or_null.h"
#include "tests/unit/model/tiny_hybrid.h"
#include "tests/unit/model/tiny_vl.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using tiny_vl::kDim;
using tiny_vl::kEnd;
using tiny_vl::kImage;
using tiny_vl::kLayers;
using tiny_vl::kStart;
using tiny_vl::kVideo;
using tiny_vl::kVocab;

std::shared_ptr<Backend> Cpu() {
  auto be = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  EXPECT_TRUE(be.ok()) << be.status().message();
  return std::move(be).value();
}

VisionArch TinyVision() { return tiny_vl::Vision(); }

TEST(MropePositions, TwoPicturesHandWorked) {
  // text, text, start, 6 pads (grid [1, 4, 6]: 2 x 3 merged), end, start, 6 pads ([1, 6, 4]:
  // 3 x 2), end, text.
  std::vector<int32_t> ids = {1, 2, kStart};
  ids.insert(ids.end(), 6, kImage);
  ids.insert(ids.end(), {kEnd, kStart});
  ids.insert(ids.end(), 6, kImage);
  ids.insert(ids.end(), {kEnd, 5});
  const std::vector<VisionGrid> grids = {{1, 4, 6}, {1, 6, 4}};
  auto p = ComputeMropePositions(TinyVision(), ids, grids);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->t,
            (std::vector<int32_t>{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 8, 8, 8, 8, 8, 11, 12}));
  EXPECT_EQ(p->h,
            (std::vector<int32_t>{0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 8, 9, 9, 10, 10, 11, 12}));
  EXPECT_EQ(p->w,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 8, 9, 8, 9, 11, 12}));
  EXPECT_EQ(p->next, 13);
  EXPECT_EQ(p->picture_rows, (std::vector<int64_t>{3, 11}));

  // A two-frame grid: the frames' time positions count up from the picture's start.
  std::vector<int32_t> video = {kStart, kImage, kImage, kEnd};
  const std::vector<VisionGrid> two = {{2, 2, 2}};
  p = ComputeMropePositions(TinyVision(), video, two);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->t, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p->h, (std::vector<int32_t>{0, 1, 1, 3}));
  EXPECT_EQ(p->next, 4);
}

TEST(MropePositions, ErrorsWhenPlaceholdersAndPicturesDisagree) {
  const VisionArch a = TinyVision();
  std::vector<int32_t> ids = {kStart, kImage, kImage, kImage, kEnd};
  const std::vector<VisionGrid> one = {{1, 4, 2}};  // 2 rows; 3 placeholders
  auto p = ComputeMropePositions(a, ids, one);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("beyond the 1 pictures"), std::string::npos)
      << p.status().message();
  const std::vector<VisionGrid> big = {{1, 4, 4}};  // 4 rows; 3 placeholders
  p = ComputeMropePositions(a, ids, big);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("needs 4 image placeholders"), std::string::npos)
      << p.status().message();
  const std::vector<VisionGrid> extra = {{1, 2, 6}, {1, 2, 2}};
  p = ComputeMropePositions(a, ids, extra);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("2 given"), std::string::npos) << p.status().message();
  const std::vector<VisionGrid> odd = {{1, 3, 2}};
  p = ComputeMropePositions(a, ids, odd);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("merge size"), std::string::npos) << p.status().message();
  std::vector<int32_t> video = {kStart, kVideo, kEnd};
  p = ComputeMropePositions(a, video, {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("video placeholder beyond the 0"), std::string::npos)
      << p.status().message();
  // A picture's grid where the prompt holds a video's placeholders, and the other way round.
  p = ComputeMropePositions(a, video, std::vector<VisionGrid>{{1, 2, 2}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("a video placeholder where picture 1 is due"),
            std::string::npos)
      << p.status().message();
  p = ComputeMropePositions(a, std::vector<int32_t>{kStart, kImage, kEnd},
                            std::vector<VisionGrid>{{2, 2, 2, /*video=*/true}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("an image placeholder where video 1 is due"),
            std::string::npos)
      << p.status().message();
}

// The M-RoPE rotation as the attention block issues it (three Rope ops, each with one axis'
// frequencies and positions, the others zero; the q/k norm in the first) against
// transformers' interleaved M-RoPE in float64.
TEST(MropeRotation, ThreeMaskedRotationsEqualInterleavedMrope) {
  auto be = Cpu();
  Rope rope;
  rope.theta = 10000.0;
  rope.rotary_dims = 16;  // of head_dim 20: partial rotary, as Qwen3.5
  rope.mrope_section = {3, 3, 2};
  const int heads = 3, head_dim = 20, rows = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(rows * heads * head_dim), norm(head_dim);
  for (float& v : x) v = d(rng);
  for (float& v : norm) v = 1.0f + 0.3f * d(rng);
  const std::vector<int32_t> t = {0, 3, 3, 7, 9}, h = {0, 3, 5, 4, 9}, w = {0, 8, 3, 6, 2};
  const std::vector<int32_t>* pos[] = {&t, &h, &w};
  std::vector<float> ours = x;
  for (int axis = 0; axis < 3; ++axis) {
    const std::vector<float> inv = rope.MropeInvFreq(axis);
    be->Rope({ours.data(), rows, heads, head_dim, rope.rotary_dims, pos[axis]->data(), inv.data(),
              axis == 0 ? norm.data() : nullptr, 1e-6f});
  }
  const std::vector<float> inv = rope.InvFreq();
  const int half = rope.rotary_dims / 2;
  double top = 0, diff = 0;
  for (int r = 0; r < rows; ++r) {
    for (int hd = 0; hd < heads; ++hd) {
      const float* v = x.data() + (r * heads + hd) * head_dim;
      double ms = 0;
      for (int i = 0; i < head_dim; ++i) ms += double(v[i]) * v[i] / head_dim;
      std::vector<double> n(head_dim);
      for (int i = 0; i < head_dim; ++i) n[i] = v[i] / std::sqrt(ms + 1e-6) * norm[i];
      std::vector<double> out = n;
      for (int i = 0; i < half; ++i) {
        // apply_interleaved_mrope: H at 1, 4, 7, ... below 3 * section[1]; W at 2, 5, ...
        int axis = 0;
        if (i % 3 == 1 && i < 3 * 3) axis = 1;
        if (i % 3 == 2 && i < 3 * 2) axis = 2;
        const double angle = double((*pos[axis])[r]) * inv[i];
        out[i] = n[i] * std::cos(angle) - n[i + half] * std::sin(angle);
        out[i + half] = n[i + half] * std::cos(angle) + n[i] * std::sin(angle);
      }
      for (int i = 0; i < head_dim; ++i) {
        top = std::max(top, std::fabs(out[i]));
        diff = std::max(diff, std::fabs(out[i] - ours[(r * heads + hd) * head_dim + i]));
      }
    }
  }
  EXPECT_LE(diff, 1e-5 * top) << "max diff " << diff;
}

class VisionModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        (fs::path(::testing::TempDir()) / ("vision_model_" + std::to_string(::getpid()))).string();
    embed_ = tiny_vl::Write(dir_);
    auto model = Model::Load(dir_, Cpu());
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(*model);
    ids_ = tiny_vl::Prompt();
  }

  PromptPictures Pictures(int layers, float deepstack_scale = 0.5f) {
    return tiny_vl::Pictures(layers, deepstack_scale);
  }

  std::vector<float> Logits(const PromptPictures& pictures, int64_t chunk) {
    auto logits = SequenceLogits(*model_, ids_, pictures, chunk);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    return logits.ok() ? *logits : std::vector<float>();
  }

  std::string dir_;
  std::unique_ptr<Model> model_;
  std::vector<float> embed_;
  std::vector<int32_t> ids_;
};

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b, int64_t from = 0,
              int64_t to = -1) {
  EXPECT_EQ(a.size(), b.size());
  if (to < 0) to = static_cast<int64_t>(a.size());
  float m = 0;
  for (int64_t i = from; i < to; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(VisionModelTest, LoadsTheTextModelAndSkipsTheTower) {
  EXPECT_EQ(model_->arch().family, "qwen3_vl");
  EXPECT_EQ(model_->SkippedTensors(), 1);
  EXPECT_EQ(model_->arch().rope.mrope_section, (std::vector<int>{4, 6, 6}));
}

// Text rows given three equal positions rotate as the plain table does.
TEST_F(VisionModelTest, EqualMropePositionsAreThePlainRotation) {
  auto plain = SequenceLogits(*model_, ids_, 256);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  PromptPictures text;
  for (size_t i = 0; i < ids_.size(); ++i) {
    text.positions.t.push_back(static_cast<int32_t>(i));
    text.positions.h.push_back(static_cast<int32_t>(i));
    text.positions.w.push_back(static_cast<int32_t>(i));
  }
  EXPECT_LE(MaxDiff(Logits(text, 256), *plain), 1e-5f);
}

// Picture rows whose embeddings are their placeholder's embedding and whose deepstack features
// are zero compute what the text alone computes (same positions); other embeddings change the
// picture rows and those after them, never the rows before.
TEST_F(VisionModelTest, PictureRowsReplaceTheirPlaceholders) {
  PromptPictures same = Pictures(/*layers=*/1, /*deepstack_scale=*/0.0f);
  for (size_t j = 0; j < same.rows.size(); ++j)
    std::copy(embed_.begin() + kImage * kDim, embed_.begin() + (kImage + 1) * kDim,
              same.embeddings.begin() + j * kDim);
  PromptPictures text = same;
  text.rows.clear();
  text.embeddings.clear();
  text.deepstack.clear();
  text.layers = 0;
  const std::vector<float> base = Logits(text, 256);
  EXPECT_LE(MaxDiff(Logits(same, 256), base), 1e-5f);

  const PromptPictures other = Pictures(/*layers=*/0);
  const std::vector<float> changed = Logits(other, 256);
  const int64_t first = other.rows[0];
  EXPECT_EQ(MaxDiff(changed, base, 0, first * kVocab), 0.0f);
  EXPECT_GT(MaxDiff(changed, base, first * kVocab, (first + 1) * kVocab), 1e-3f);
  EXPECT_GT(MaxDiff(changed, base, 16 * kVocab, 17 * kVocab), 1e-3f);  // text after both
}

// Deepstack features join the picture rows after the first layers: zero features change
// nothing, others change the picture rows and what follows, not the rows before.
TEST_F(VisionModelTest, DeepstackFeaturesJoinThePictureRows) {
  const std::vector<float> none = Logits(Pictures(0), 256);
  EXPECT_LE(MaxDiff(Logits(Pictures(2, 0.0f), 256), none), 1e-6f);
  const PromptPictures two = Pictures(2);
  const std::vector<float> with = Logits(two, 256);
  const int64_t first = two.rows[0];
  EXPECT_EQ(MaxDiff(with, none, 0, first * kVocab), 0.0f);
  EXPECT_GT(MaxDiff(with, none, first * kVocab, (first + 1) * kVocab), 1e-3f);
  // One layer's feature is not two layers'.
  EXPECT_GT(MaxDiff(Logits(Pictures(1), 256), with), 1e-4f);
}

// A prompt read in chunks (some ending inside a picture) gives the logits of one read.
TEST_F(VisionModelTest, ChunksMayEndInsideAPicture) {
  const PromptPictures pictures = Pictures(2);
  const std::vector<float> whole = Logits(pictures, 256);
  for (int64_t chunk : {5, 4, 1}) {
    EXPECT_LE(MaxDiff(Logits(pictures, chunk), whole), 1e-5f) << chunk;
  }
}

// The same prompt on the CUDA backend (M-RoPE through three Rope ops and a KvWrite, picture
// rows, deepstack): exact mode within 1e-3 of the CPU's largest logit, fast mode within 2e-2.
// Skips without a CUDA device.
TEST_F(VisionModelTest, CudaMatchesTheCpu) {
  const PromptPictures pictures = Pictures(2);
  const std::vector<float> cpu = Logits(pictures, 256);
  float top = 0;
  for (float v : cpu) top = std::max(top, std::fabs(v));
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    auto model = Model::Load(dir_, cuda);
    ASSERT_TRUE(model.ok()) << model.status().message();
    for (int64_t chunk : {256, 5}) {
      auto logits = SequenceLogits(**model, ids_, pictures, chunk);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      EXPECT_LE(MaxDiff(*logits, cpu), (exact ? 1e-3f : 2e-2f) * top)
          << (exact ? "exact" : "fast") << " chunk " << chunk;
    }
  }
}

// Qwen3.5's hybrid (recurrent layers carry a slot's state, attention layers with partial rotary
// M-RoPE) with picture rows: read in chunks that end inside a picture, and one row at a time,
// it gives the logits of one read.
TEST(VisionHybrid, PicturesInChunksEqualOneRead) {
  using namespace tiny_hybrid;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("vision_hybrid_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Builder builder(5);
  ASSERT_FALSE(Builder::Write(dir, Builder::TextConfig("qwen3_5_text", /*moe=*/false),
                              builder.Qwen3_5("model.", /*moe=*/false))
                   .empty());
  auto model = Model::Load(dir.string(), Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_EQ((*model)->arch().rope.mrope_section, (std::vector<int>{1, 1, 0}));
  VisionArch vision;
  vision.merge = 2;
  vision.image_token = 30;
  vision.vision_start = 31;
  vision.video_token = 39;
  std::vector<int32_t> ids = {1, 2, 31};
  ids.insert(ids.end(), 6, 30);
  ids.insert(ids.end(), {32, 5, 31});
  ids.insert(ids.end(), 2, 30);
  ids.insert(ids.end(), {32, 9, 10});
  const std::vector<VisionGrid> grids = {{1, 4, 6}, {1, 2, 4}};
  auto positions = ComputeMropePositions(vision, ids, grids);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  VisionOutput tower;
  tower.rows = 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  tower.embeddings.resize(8 * kDim);
  for (float& v : tower.embeddings) v = d(rng);
  auto pictures = PlacePictures(vision, ids, *positions, tower);
  ASSERT_TRUE(pictures.ok()) << pictures.status().message();
  auto whole = SequenceLogits(**model, ids, *pictures, 256);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  float top = 0;
  for (float v : *whole) top = std::max(top, std::fabs(v));
  auto text = SequenceLogits(**model, ids, 256);
  ASSERT_TRUE(text.ok());
  EXPECT_GT(MaxDiff(*whole, *text), 1e-3f);  // the pictures count
  for (int64_t chunk : {5, 1}) {
    auto chunked = SequenceLogits(**model, ids, *pictures, chunk);
    ASSERT_TRUE(chunked.ok()) << chunked.status().message();
    EXPECT_LE(MaxDiff(*chunked, *whole), 1e-4f * top) << chunk;
  }
}

// Qwen3-VL-MoE (tiny_vl::Experts): the family, its tower, and its mixtures of experts. Experts
// that all equal the dense MLP give the dense folder's logits (the renormalized top-k weights sum
// to 1), so the stacked tensors are read as the right matrices whichever way they are stored;
// the three layouts of distinct experts give the same logits bit for bit; distinct experts are
// not the dense model.
class VisionMoeTest : public ::testing::Test {
 protected:
  std::string Folder(tiny_vl::Experts experts, const std::string& name) {
    const std::string dir =
        (fs::path(::testing::TempDir()) / ("vision_moe_" + name + "_" + std::to_string(::getpid())))
            .string();
    tiny_vl::Write(dir, /*tower=*/true, experts);
    dirs_.push_back(dir);
    return dir;
  }
  void TearDown() override {
    for (const std::string& dir : dirs_) fs::remove_all(dir);
  }
  std::vector<float> Logits(const std::string& dir) {
    auto model = Model::Load(dir, Cpu());
    EXPECT_TRUE(model.ok()) << model.status().message();
    if (!model.ok()) return {};
    auto logits = SequenceLogits(**model, tiny_vl::Prompt(), tiny_vl::Pictures(/*layers=*/1), 5);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    return logits.ok() ? *logits : std::vector<float>();
  }
  std::vector<std::string> dirs_;
};

TEST_F(VisionMoeTest, LoadsTheFamilyAndItsTower) {
  const std::string dir = Folder(tiny_vl::Experts::kTransposed, "family");
  auto model = Model::Load(dir, Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  const Arch& a = (*model)->arch();
  EXPECT_EQ(a.family, "qwen3_vl_moe");
  for (const LayerSpec& spec : a.layer) {
    ASSERT_TRUE(spec.IsMoe());
    EXPECT_EQ(spec.moe.experts, tiny_vl::kExperts);
    EXPECT_EQ(spec.moe.experts_per_token, tiny_vl::kTopK);
    EXPECT_TRUE(spec.moe.norm_topk_prob);
  }
  EXPECT_GT((*model)->SkippedTensors(), 10);  // the tower's, left to the VisionTower
  auto tower = VisionTower::Load(dir, Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  EXPECT_EQ((*tower)->arch().family, "qwen3_vl_moe");
  EXPECT_EQ((*tower)->arch().deepstack, std::vector<int>{0});
  const std::vector<VisionGrid> grids = {{1, 2, 4}};
  std::vector<float> pixels(8 * 24);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.37f * i);
  VisionOutput out;
  ASSERT_TRUE((*tower)->Run(pixels, grids, &out).ok());
  EXPECT_EQ(out.rows, 2);
  EXPECT_EQ(out.deepstack.size(), 1u);
}

TEST_F(VisionMoeTest, IdenticalExpertsAreTheDenseModel) {
  const std::vector<float> dense = Logits(Folder(tiny_vl::Experts::kNone, "dense"));
  const std::vector<float> moe = Logits(Folder(tiny_vl::Experts::kIdentical, "identical"));
  ASSERT_FALSE(dense.empty());
  float top = 0;
  for (float v : dense) top = std::max(top, std::fabs(v));
  EXPECT_LE(MaxDiff(moe, dense), 1e-5f * top);
}

TEST_F(VisionMoeTest, EveryExpertLayoutReadsTheSame) {
  const std::vector<float> transposed = Logits(Folder(tiny_vl::Experts::kTransposed, "t"));
  ASSERT_FALSE(transposed.empty());
  EXPECT_EQ(Logits(Folder(tiny_vl::Experts::kStacked, "s")), transposed);
  EXPECT_EQ(Logits(Folder(tiny_vl::Experts::kPerExpert, "p")), transposed);
  float top = 0;
  const std::vector<float> dense = Logits(Folder(tiny_vl::Experts::kNone, "d"));
  for (float v : dense) top = std::max(top, std::fabs(v));
  EXPECT_GT(MaxDiff(transposed, dense), 1e-2f * top);  // the other experts were picked
}

// On the CUDA backend (the transposed experts' host copies placed there): exact mode within 1e-3
// of the CPU's largest logit, fast mode within 2e-2. Skips without a CUDA device.
TEST_F(VisionMoeTest, CudaMatchesTheCpu) {
  const std::string dir = Folder(tiny_vl::Experts::kTransposed, "cuda");
  const std::vector<float> cpu = Logits(dir);
  ASSERT_FALSE(cpu.empty());
  float top = 0;
  for (float v : cpu) top = std::max(top, std::fabs(v));
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    auto model = Model::Load(dir, cuda);
    ASSERT_TRUE(model.ok()) << model.status().message();
    for (int64_t chunk : {256, 5}) {
      auto logits =
          SequenceLogits(**model, tiny_vl::Prompt(), tiny_vl::Pictures(/*layers=*/1), chunk);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      EXPECT_LE(MaxDiff(*logits, cpu), (exact ? 1e-3f : 2e-2f) * top)
          << (exact ? "exact" : "fast") << " chunk " << chunk;
    }
  }
}

// A stack of neither shape is a shape error naming the tensor.
TEST_F(VisionMoeTest, AStackOfNeitherShapeIsRefused) {
  const std::string dir = Folder(tiny_vl::Experts::kTransposed, "bad");
  const std::string name = "model.language_model.layers.0.mlp.experts.down_proj";
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::vector<TensorToWrite> out;
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(ckpt->All().size());
  for (const TensorInfo* t : ckpt->All()) {
    std::vector<int64_t> shape = t->shape;
    if (t->name == name) shape = {tiny_vl::kExperts, 8, tiny_vl::kFfn * kDim / 8};
    keep.emplace_back(t->data, t->data + t->bytes);
    out.push_back({t->name, t->dtype, shape, keep.back().data(), t->bytes});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", out, {}).ok());
  auto model = Model::Load(dir, Cpu());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find(name), std::string::npos) << model.status().message();
}

TEST_F(VisionModelTest, StepErrors) {
  Rows rows;
  rows.PushMrope(1, 0, 0, 0, 0, 0, true);
  rows.PushMrope(kImage, 0, 1, 1, 1, 1, true);
  rows.visual.rows = {1};
  rows.visual.embeddings.assign(kDim - 1, 0.0f);
  std::vector<int32_t> pages = {0};
  PageTables tables{pages.data(), 1, 1};
  ASSERT_TRUE(model_->AllocatePages(1).ok());
  std::vector<float> logits(2 * kVocab);
  Status s = model_->Step(rows, tables, logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("visual embeddings"), std::string::npos) << s.message();
  rows.visual.embeddings.assign(kDim, 0.0f);
  rows.visual.layers = kLayers + 1;
  s = model_->Step(rows, tables, logits.data());
  EXPECT_NE(s.message().find("deepstack"), std::string::npos) << s.message();
  rows.visual.layers = 0;
  rows.visual.rows = {2};
  s = model_->Step(rows, tables, logits.data());
  EXPECT_NE(s.message().find("ascending rows"), std::string::npos) << s.message();
  rows.visual.Clear();
  rows.rotary_h.pop_back();
  s = model_->Step(rows, tables, logits.data());
  EXPECT_NE(s.message().find("rotary_h"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gizllm
