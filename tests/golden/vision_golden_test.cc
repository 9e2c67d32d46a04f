// Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 with pictures against Hugging Face transformers' float32
// references (tools/make_vision_golden.py: random tiny Qwen3VLForConditionalGeneration,
// Qwen3VLMoeForConditionalGeneration and Qwen3_5ForConditionalGeneration, the last a hybrid
// without deepstack): the vision tower's
// rows and deepstack
// features within 1e-4 of the largest reference value, the M-RoPE positions of a prompt with
// two pictures equal to get_rope_index's, and that prompt's logits within 1e-4 (read whole and
// in chunks that end inside a picture), all on the CPU in float32 (exact mode); on CUDA, exact
// mode within 1e-3 and fast mode within 2e-2 (of the rounded reference where there is one); and
// a chat with a short video (frames, tokens, positions, tower, logits). The references are
// written on a machine with transformers; until then these skip. And a converted Qwen3-VL
// folder (`gizllm convert`): its tower in a file of its own, read as the source's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "jobs/convert.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "model/mrope.h"
#include "model/picture_prompt.h"
#include "model/vision_tower.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"
#include "tests/unit/model/cuda_or_null.h"
#include "tokenizer/tokenizer.h"
#include "vision/video.h"

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
      family_ == "qwen3_5" ? std::vector<int>{} : std::vector<int>{0, 2};
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

// The norm of (a - b) over the norm of b.
double RelativeDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (a[i] - double(b[i])) * (a[i] - double(b[i]));
    norm += double(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : 0;
}

// Fast mode rounds the inputs of its many-row matmuls to bf16 and the attention operands (the
// language model's and the tower's) to fp16: where reference_fast.safetensors
// (tools/make_vision_golden.py --fast) holds that computation, the tower rows are held to it
// within 2e-2, and so are the language model's logits read from the reference's own rounded
// tower rows; the tower rows, and the logits of our tower's rows, are held to the float32
// reference in norm within 2e-2 or 1.5 times the rounded reference's own distance from it.
// Without it, all are held to the float32 reference within 2e-2. The language model is given the
// reference's rows because these random models amplify a picture row's rounding tenfold: on the
// CPU, qwen3_5's rounded tower rows are 0.36% (of the largest) from the float32 ones, and the
// float32 language model's logits from them 4.1% from its logits of the float32 rows; our fast
// tower's rows are 0.29% from the rounded ones, which moves the logits 2.1% (2.6% on CUDA), while
// the fast language model read from the reference's rounded rows is 0.56% from its logits.
TEST_P(VisionGolden, CudaTowerAndLogits) {
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    const float tolerance = exact ? 1e-3f : 2e-2f;
    const std::string mode = exact ? "cuda exact " : "cuda fast ";
    std::optional<SafetensorsFile> fast;
    const std::string fast_path = dir_ + "/reference_fast.safetensors";
    if (!exact && std::filesystem::exists(fast_path)) {
      auto file = SafetensorsFile::Open(fast_path);
      ASSERT_TRUE(file.ok()) << file.status().message();
      fast = std::move(*file);
      for (const char* name : {"tower", "logits"}) ASSERT_NE(fast->Find(name), nullptr) << name;
    }
    // Against the rounded reference where there is one, and near the float32 one in norm.
    auto check = [&](const std::vector<float>& ours, const char* name, const std::string& what) {
      const std::vector<float> truth = golden::ReadFloats(*ref_.Find(name));
      if (!fast) {
        golden::ExpectClose(ours, truth, tolerance, mode + what);
        return;
      }
      const std::vector<float> rounded = golden::ReadFloats(*fast->Find(name));
      golden::ExpectClose(ours, rounded, tolerance, mode + what + " (" + fast_path + ")");
      const double bound = std::max(2e-2, 1.5 * RelativeDistance(rounded, truth));
      golden::ExpectCloseInNorm(ours, truth, bound, mode + what + " (float32, norm)");
    };
    auto tower = VisionTower::Load(dir_, cuda);
    ASSERT_TRUE(tower.ok()) << tower.status().message();
    VisionOutput out;
    ASSERT_TRUE((*tower)->Run(golden::ReadFloats(*ref_.Find("pixel_values")), grids_, &out).ok());
    check(out.embeddings, "tower", "tower rows");
    auto model = Model::Load(dir_, cuda);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto positions = ComputeMropePositions((*tower)->arch(), ids_, grids_);
    ASSERT_TRUE(positions.ok()) << positions.status().message();
    auto pictures = PlacePictures((*tower)->arch(), ids_, *positions, out);
    ASSERT_TRUE(pictures.ok()) << pictures.status().message();
    // Steps of many rows only (35 tokens: one step, or five of 7), as fast mode's rounding
    // applies to them.
    ASSERT_EQ(ids_.size() % 7, 0u);
    for (int64_t chunk : {256, 7}) {
      auto logits = SequenceLogits(**model, ids_, *pictures, chunk);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      const std::string what = "logits, chunk " + std::to_string(chunk);
      if (!fast) {
        check(*logits, "logits", what);
        continue;
      }
      const std::vector<float> truth = golden::ReadFloats(*ref_.Find("logits"));
      const std::vector<float> rounded = golden::ReadFloats(*fast->Find("logits"));
      golden::ExpectCloseInNorm(*logits, truth,
                                std::max(2e-2, 1.5 * RelativeDistance(rounded, truth)),
                                mode + what + " (float32, norm)");
    }
    if (fast) {
      // The language model alone: read from the reference's rounded tower rows (the deepstack
      // features, which it does not hold, ours).
      VisionOutput theirs = out;
      theirs.embeddings = golden::ReadFloats(*fast->Find("tower"));
      auto placed = PlacePictures((*tower)->arch(), ids_, *positions, theirs);
      ASSERT_TRUE(placed.ok()) << placed.status().message();
      auto logits = SequenceLogits(**model, ids_, *placed, 256);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      check(*logits, "logits", "logits of the reference's rounded tower rows");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, VisionGolden,
                         ::testing::Values("qwen3_vl", "qwen3_5", "qwen3_vl_moe"));

// A chat with a short video (reference_video.safetensors): the frames the script saved, read
// from their PNG files, sampled and preprocessed by PictureReader equal the video processor's
// pixel values; the prompt's video placeholder expands to the processor's tokens (timestamps,
// then each temporal patch's rows); positions, tower rows, deepstack features and logits as for
// the pictures.
class VisionGoldenVideo : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    family_ = GetParam();
    dir_ = Dir(family_);
    if (!std::filesystem::exists(dir_ + "/reference_video.safetensors")) {
      GTEST_SKIP() << dir_ << "/reference_video.safetensors is absent: write it with python3 "
                   << "tools/make_vision_golden.py --out tests/golden/vision";
    }
    auto ref = SafetensorsFile::Open(dir_ + "/reference_video.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    ref_ = std::move(*ref);
    for (const char* name : {"pixel_values", "grid_thw", "ids", "tower", "positions", "logits"}) {
      ASSERT_NE(ref_.Find(name), nullptr) << name;
    }
    auto reader = PictureReader::Load(dir_, Cpu());
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    reader_ = std::move(*reader);
    auto tokenizer = Tokenizer::Load(dir_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    tokenizer_ = std::make_unique<Tokenizer>(std::move(*tokenizer));
    auto frames = vision::ReadFrameFolder(dir_ + "/video", 64);
    ASSERT_TRUE(frames.ok()) << frames.status().message();
    auto video = reader_->PrepareVideo(*frames, /*fps=*/4.0);
    ASSERT_TRUE(video.ok()) << video.status().message();
    video_ = std::move(*video);
  }

  // The chat as the template writes it, the video placed.
  PlacedPrompt Placed() {
    ChatPrompt chat;
    chat.text =
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n"
        "<|im_start|>assistant\n";
    chat.tokens = tokenizer_->Encode(chat.text).value();
    auto written = reader_->WriteVideos(*tokenizer_, chat, {video_});
    EXPECT_TRUE(written.ok()) << written.status().message();
    auto placed = reader_->Place(written->tokens, {video_});
    EXPECT_TRUE(placed.ok()) << placed.status().message();
    return std::move(placed).value();
  }

  std::string family_;
  std::string dir_;
  SafetensorsFile ref_;
  std::unique_ptr<PictureReader> reader_;
  std::unique_ptr<Tokenizer> tokenizer_;
  VisionInput video_;
};

TEST_P(VisionGoldenVideo, FramesTokensAndPositions) {
  const std::vector<int32_t> thw = golden::ReadIds(*ref_.Find("grid_thw"));
  ASSERT_EQ(thw.size(), 3u);
  EXPECT_EQ(video_.grid.t, thw[0]);
  EXPECT_EQ(video_.grid.h, thw[1]);
  EXPECT_EQ(video_.grid.w, thw[2]);
  golden::ExpectClose(video_.pixels, golden::ReadFloats(*ref_.Find("pixel_values")), 1e-6f,
                      "video pixel values");
  const PlacedPrompt placed = Placed();
  EXPECT_EQ(placed.tokens, golden::ReadIds(*ref_.Find("ids")));
  if (const TensorInfo* processor = ref_.Find("processor_ids")) {
    EXPECT_EQ(placed.tokens, golden::ReadIds(*processor)) << "Qwen3VLProcessor's own expansion";
  }
  const std::vector<int32_t> ref = golden::ReadIds(*ref_.Find("positions"));
  const size_t n = placed.tokens.size();
  ASSERT_EQ(ref.size(), 3 * n);
  EXPECT_EQ(placed.positions.t, std::vector<int32_t>(ref.begin(), ref.begin() + n));
  EXPECT_EQ(placed.positions.h, std::vector<int32_t>(ref.begin() + n, ref.begin() + 2 * n));
  EXPECT_EQ(placed.positions.w, std::vector<int32_t>(ref.begin() + 2 * n, ref.end()));
}

TEST_P(VisionGoldenVideo, TowerAndLogits) {
  auto model = Model::Load(dir_, Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto read = reader_->Read(Placed());
  ASSERT_TRUE(read.ok()) << read.status().message();
  const PromptPictures& p = read->pictures;
  golden::ExpectClose(p.embeddings, golden::ReadFloats(*ref_.Find("tower")), 1e-4f,
                      "video tower rows");
  if (const TensorInfo* deepstack = ref_.Find("deepstack")) {
    golden::ExpectClose(p.deepstack, golden::ReadFloats(*deepstack), 1e-4f, "video deepstack");
  } else {
    EXPECT_EQ(p.layers, 0);
  }
  const std::vector<float> ref = golden::ReadFloats(*ref_.Find("logits"));
  for (int64_t chunk : {256, 7, 1}) {
    auto logits = SequenceLogits(**model, read->tokens, p, chunk);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    golden::ExpectClose(*logits, ref, 1e-4f, "video logits, chunk " + std::to_string(chunk));
  }
}

TEST_P(VisionGoldenVideo, CudaExactTowerAndLogits) {
  std::string why;
  std::shared_ptr<Backend> cuda = testing::CudaOrNull(/*exact=*/true, &why);
  if (!cuda) GTEST_SKIP() << why;
  auto reader = PictureReader::Load(dir_, cuda);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  auto read = (*reader)->Read(Placed());
  ASSERT_TRUE(read.ok()) << read.status().message();
  golden::ExpectClose(read->pictures.embeddings, golden::ReadFloats(*ref_.Find("tower")), 1e-3f,
                      "cuda exact video tower rows");
  auto model = Model::Load(dir_, cuda);
  ASSERT_TRUE(model.ok()) << model.status().message();
  for (int64_t chunk : {256, 7}) {
    auto logits = SequenceLogits(**model, read->tokens, read->pictures, chunk);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    golden::ExpectClose(*logits, golden::ReadFloats(*ref_.Find("logits")), 1e-3f,
                        "cuda exact video logits, chunk " + std::to_string(chunk));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, VisionGoldenVideo,
                         ::testing::Values("qwen3_vl", "qwen3_5", "qwen3_vl_moe"));

// The golden Qwen3-VL converted to 8 bits: the tower's tensors go, as the source holds them, to
// vision.safetensors (none stay in model.safetensors), the processors' configs are copied, and
// the converted folder's tower gives the source's rows and deepstack features bit for bit (the
// same float32 weights). Every linear of this tiny model has fewer than 128 inputs, so convert
// keeps each one bf16 (its values unchanged): the converted language model computes what the
// source's does, and its logits of the prompt with two pictures are the source's exactly (and
// within 1e-4 of transformers', as the source's).
TEST(VisionGoldenConvert, TheTowerKeepsAFileOfItsOwn) {
  namespace fs = std::filesystem;
  const std::string from = Dir("qwen3_vl");
  if (!fs::exists(from + "/reference.safetensors")) {
    GTEST_SKIP() << from << "/reference.safetensors is absent";
  }
  const fs::path root =
      fs::temp_directory_path() / ("gizllm_vision_convert_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string to = (root / "q8").string();
  quant::ConvertOptions options;
  options.from = from;
  options.to = to;
  options.bits = quant::Bits{8, 8};
  auto summary = quant::Convert(options);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->quantized, 0);
  EXPECT_EQ(summary->kept_bf16, 3 * 7 + 1);  // q, k, v, o, gate, up, down a layer; the head

  // The tower's tensors, bit for bit, in their own file.
  auto source = Checkpoint::Open(from);
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_TRUE(fs::exists(to + "/" + kVisionTowerFile));
  auto tower_file = SafetensorsFile::Open(to + "/" + kVisionTowerFile);
  ASSERT_TRUE(tower_file.ok()) << tower_file.status().message();
  auto converted = Checkpoint::Open(to);
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  int64_t tower_tensors = 0;
  for (const TensorInfo* t : source->All()) {
    if (t->name.rfind("model.visual.", 0) != 0) continue;
    ++tower_tensors;
    const TensorInfo* c = tower_file->Find(t->name);
    ASSERT_NE(c, nullptr) << t->name;
    EXPECT_EQ(c->dtype, t->dtype) << t->name;
    EXPECT_EQ(c->shape, t->shape) << t->name;
    ASSERT_EQ(c->bytes, t->bytes) << t->name;
    EXPECT_EQ(std::memcmp(c->data, t->data, t->bytes), 0) << t->name;
    EXPECT_EQ(converted->Find(t->name), nullptr) << t->name << " is in model.safetensors too";
  }
  EXPECT_GT(tower_tensors, 30);
  EXPECT_EQ(static_cast<int64_t>(tower_file->tensors().size()), tower_tensors);
  EXPECT_EQ(summary->tower_tensors, tower_tensors);
  for (const char* file : {"preprocessor_config.json", "video_preprocessor_config.json"}) {
    EXPECT_EQ(ReadFile(to + "/" + file).value(), ReadFile(from + "/" + file).value()) << file;
  }

  // The tower of the converted folder (through PictureReader too, as `run --image` loads it).
  auto ref = SafetensorsFile::Open(from + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const std::vector<int32_t> thw = golden::ReadIds(*ref->Find("grid_thw"));
  std::vector<VisionGrid> grids;
  for (size_t i = 0; i + 2 < thw.size(); i += 3) grids.push_back({thw[i], thw[i + 1], thw[i + 2]});
  const std::vector<float> pixels = golden::ReadFloats(*ref->Find("pixel_values"));
  VisionOutput want, got;
  auto tower = VisionTower::Load(from, Cpu());
  ASSERT_TRUE(tower.ok()) << tower.status().message();
  ASSERT_TRUE((*tower)->Run(pixels, grids, &want).ok());
  auto converted_tower = VisionTower::Load(to, Cpu());
  ASSERT_TRUE(converted_tower.ok()) << converted_tower.status().message();
  ASSERT_TRUE((*converted_tower)->Run(pixels, grids, &got).ok());
  EXPECT_EQ(got.embeddings, want.embeddings);
  EXPECT_EQ(got.deepstack, want.deepstack);
  EXPECT_EQ((*converted_tower)->Parameters(), (*tower)->Parameters());
  auto reader = PictureReader::Load(to, Cpu());
  ASSERT_TRUE(reader.ok()) << reader.status().message();

  // The prompt with two pictures through the converted language model.
  const std::vector<int32_t> ids = golden::ReadIds(*ref->Find("ids"));
  auto positions = ComputeMropePositions((*converted_tower)->arch(), ids, grids);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  auto pictures = PlacePictures((*converted_tower)->arch(), ids, *positions, got);
  ASSERT_TRUE(pictures.ok()) << pictures.status().message();
  auto source_model = Model::Load(from, Cpu());
  ASSERT_TRUE(source_model.ok()) << source_model.status().message();
  auto model = Model::Load(to, Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  for (int64_t chunk : {256, 7}) {
    auto logits = SequenceLogits(**model, ids, *pictures, chunk);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    auto source_logits = SequenceLogits(**source_model, ids, *pictures, chunk);
    ASSERT_TRUE(source_logits.ok()) << source_logits.status().message();
    EXPECT_EQ(*logits, *source_logits) << "chunk " << chunk;
    golden::ExpectClose(*logits, golden::ReadFloats(*ref->Find("logits")), 1e-4f,
                        "converted logits, chunk " + std::to_string(chunk));
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace gizllm
