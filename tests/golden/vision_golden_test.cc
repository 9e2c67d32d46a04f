// Qwen3-VL and Qwen3.5 with pictures against Hugging Face transformers' float32 references
// (tools/make_vision_golden.py: random tiny Qwen3VLForConditionalGeneration and
// Qwen3_5ForConditionalGeneration, the latter a hybrid without deepstack): the vision tower's
// rows and deepstack
// features within 1e-4 of the largest reference value, the M-RoPE positions of a prompt with
// two pictures equal to get_rope_index's, and that prompt's logits within 1e-4 (read whole and
// in chunks that end inside a picture), all on the CPU in float32 (exact mode); on CUDA, exact
// mode within 1e-3 and fast mode within 2e-2. The reference is written on a machine with
// transformers; until then these skip.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "model/mrope.h"
#include "model/vision_tower.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"
#include "tests/unit/model/cuda_or_null.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

std::string Dir(const std::string& family) { return "tests/golden/vision/" + family; }

std::shared_ptr<Backend> Cpu() {
  DeviceOptions device;
  device.device = "cpu";
  device.threads = 2;
  device.exact = true;  // float32 activations
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  return std::move(backend).value();
}

// The reference, the tower and the prompt's pictures.
class VisionGolden : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    family_ = GetParam();
    dir_ = Dir(family_);
    if (!std::filesystem::exists(dir_ + "/reference.safetensors")) {
      GTEST_SKIP() << dir_ << "/reference.safetensors is absent: write it with python3 "
                   << "tools/make_vision_golden.py --out tests/golden/vision";
    }
    auto ref = SafetensorsFile::Open(dir_ + "/reference.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    ref_ = std::move(*ref);
    for (const char* name : {"pixel_values", "grid_thw", "ids", "tower", "positions", "logits"}) {
      ASSERT_NE(ref_.Find(name), nullptr) << name;
    }
    const std::vector<int32_t> thw = golden::ReadIds(*ref_.Find("grid_thw"));
    ASSERT_EQ(thw.size() % 3, 0u);
    for (size_t i = 0; i < thw.size(); i += 3) grids_.push_back({thw[i], thw[i + 1], thw[i + 2]});
    ids_ = golden::ReadIds(*ref_.Find("ids"));
    auto tower = VisionTower::Load(dir_, Cpu());
    ASSERT_TRUE(tower.ok()) << tower.status().message();
    tower_ = std::move(*tower);
    const std::vector<float> pixels = golden::ReadFloats(*ref_.Find("pixel_values"));
    ASSERT_TRUE(tower_->Run(pixels, grids_, &out_).ok());
  }

  std::string family_;
  std::string dir_;
  SafetensorsFile ref_;
  std::vector<VisionGrid> grids_;
  std::vector<int32_t> ids_;
  std::unique_ptr<VisionTower> tower_;
  VisionOutput out_;
};

TEST_P(VisionGolden, TowerRowsAndDeepstackFeatures) {
  const VisionArch& a = tower_->arch();
  EXPECT_EQ(a.depth, 3);
  const std::vector<int> deepstack_blocks =
      family_ == "qwen3_vl" ? std::vector<int>{0, 2} : std::vector<int>{};
  EXPECT_EQ(a.deepstack, deepstack_blocks);
  ASSERT_EQ(grids_.size(), 2u);
  golden::ExpectClose(out_.embeddings, golden::ReadFloats(*ref_.Find("tower")), 1e-4f,
                      "tower rows");
  if (out_.deepstack.empty()) {
    EXPECT_EQ(ref_.Find("deepstack"), nullptr);
    return;
  }
  ASSERT_NE(ref_.Find("deepstack"), nullptr);
  const TensorInfo& deepstack = *ref_.Find("deepstack");
  ASSERT_EQ(deepstack.shape.size(), 3u);
  ASSERT_EQ(deepstack.shape[0], static_cast<int64_t>(out_.deepstack.size()));
  const std::vector<float> all = golden::ReadFloats(deepstack);
  const size_t each = all.size() / out_.deepstack.size();
  for (size_t i = 0; i < out_.deepstack.size(); ++i) {
    golden::ExpectClose(out_.deepstack[i],
                        std::vector<float>(all.begin() + i * each, all.begin() + (i + 1) * each),
                        1e-4f, "deepstack feature " + std::to_string(i));
  }
}

TEST_P(VisionGolden, MropePositionsOfTwoPictures) {
  auto p = ComputeMropePositions(tower_->arch(), ids_, grids_);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const std::vector<int32_t> ref = golden::ReadIds(*ref_.Find("positions"));
  const size_t n = ids_.size();
  ASSERT_EQ(ref.size(), 3 * n);
  EXPECT_EQ(p->t, std::vector<int32_t>(ref.begin(), ref.begin() + n));
  EXPECT_EQ(p->h, std::vector<int32_t>(ref.begin() + n, ref.begin() + 2 * n));
  EXPECT_EQ(p->w, std::vector<int32_t>(ref.begin() + 2 * n, ref.end()));
  // The prompt is the tokenizer's ids of the script's text.
  auto tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  std::string text = "Two: <|vision_start|>";
  for (int i = 0; i < 6; ++i) text += "<|image_pad|>";
  text += "<|vision_end|> then <|vision_start|>";
  for (int i = 0; i < 6; ++i) text += "<|image_pad|>";
  text += "<|vision_end|>, which?";
  auto ids = tokenizer->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*ids, ids_);
}

TEST_P(VisionGolden, LogitsOfAPromptWithTwoPictures) {
  auto model = Model::Load(dir_, Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->arch().family, family_);
  auto positions = ComputeMropePositions(tower_->arch(), ids_, grids_);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  auto pictures = PlacePictures(tower_->arch(), ids_, *positions, out_);
  ASSERT_TRUE(pictures.ok()) << pictures.status().message();
  const std::vector<float> ref = golden::ReadFloats(*ref_.Find("logits"));
  for (int64_t chunk : {256, 7, 1}) {
    auto logits = SequenceLogits(**model, ids_, *pictures, chunk);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    golden::ExpectClose(*logits, ref, 1e-4f, "logits, chunk " + std::to_string(chunk));
  }
}

TEST_P(VisionGolden, CudaTowerAndLogits) {
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    const float tolerance = exact ? 1e-3f : 2e-2f;
    const std::string mode = exact ? "cuda exact " : "cuda fast ";
    auto tower = VisionTower::Load(dir_, cuda);
    ASSERT_TRUE(tower.ok()) << tower.status().message();
    VisionOutput out;
    ASSERT_TRUE((*tower)->Run(golden::ReadFloats(*ref_.Find("pixel_values")), grids_, &out).ok());
    golden::ExpectClose(out.embeddings, golden::ReadFloats(*ref_.Find("tower")), tolerance,
                        mode + "tower rows");
    auto model = Model::Load(dir_, cuda);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto positions = ComputeMropePositions((*tower)->arch(), ids_, grids_);
    ASSERT_TRUE(positions.ok()) << positions.status().message();
    auto pictures = PlacePictures((*tower)->arch(), ids_, *positions, out);
    ASSERT_TRUE(pictures.ok()) << pictures.status().message();
    for (int64_t chunk : {256, 7}) {
      auto logits = SequenceLogits(**model, ids_, *pictures, chunk);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      golden::ExpectClose(*logits, golden::ReadFloats(*ref_.Find("logits")), tolerance,
                          mode + "logits, chunk " + std::to_string(chunk));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, VisionGolden, ::testing::Values("qwen3_vl", "qwen3_5"));

}  // namespace
}  // namespace gizllm
