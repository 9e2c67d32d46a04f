#include "jobs/calibrate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "jobs/convert.h"
#include "jobs/perplexity.h"
#include "model/evaluate.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::quant {
namespace {

namespace fs = std::filesystem;

constexpr char kModel[] = "models/tiny-chat";

class CalibrateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gizllm_calibrate_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    cpu_ = MakeCpuBackend(&pool_);
  }
  void TearDown() override { fs::remove_all(root_); }

  ThreadPool pool_{2};
  std::shared_ptr<Backend> cpu_;
  fs::path root_;
};

TEST_F(CalibrateTest, SelfWrittenTextIsSeededAndHasTheRowsAsked) {
  auto c = Calibrator::Open(kModel, cpu_, {}, &pool_);
  ASSERT_TRUE(c.ok()) << c.status().message();
  CalibrationOptions o;
  o.rows = 80;
  o.window = 32;
  auto a = (*c)->Sequences(o);
  auto b = (*c)->Sequences(o);
  o.seed = 2;
  auto d = (*c)->Sequences(o);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok()) << a.status().message();
  ASSERT_EQ(a->size(), 3u);
  EXPECT_EQ((*a)[0].size(), 32u);
  EXPECT_EQ((*a)[1].size(), 32u);
  EXPECT_EQ((*a)[2].size(), 16u);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *d);
  // The model continues its prompt: "The" first.
  auto tokenizer = Tokenizer::Load(kModel);
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(tokenizer->Decode((*a)[0]).rfind("The", 0), 0u);
}

TEST_F(CalibrateTest, FileTextIsCutIntoWindows) {
  const fs::path file = root_ / "calib.jsonl";
  std::ofstream(file) << nlohmann::json({{"text", std::string(400, 'a') + " the end"}}).dump()
                      << "\n"
                      << nlohmann::json({{"text", "Short text, then more words."}}).dump()
                      << "\n";
  auto c = Calibrator::Open(kModel, cpu_, {}, &pool_);
  ASSERT_TRUE(c.ok());
  CalibrationOptions o;
  o.file = file.string();
  o.window = 16;
  o.rows = 1000;
  auto s = (*c)->Sequences(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  int64_t total = 0;
  for (const auto& seq : *s) {
    EXPECT_LE(seq.size(), 16u);
    EXPECT_GE(seq.size(), 2u);
    total += static_cast<int64_t>(seq.size());
  }
  o.rows = total - 5;  // fewer rows than the file holds: the last window is cut
  auto fewer = (*c)->Sequences(o);
  ASSERT_TRUE(fewer.ok());
  int64_t fewer_total = 0;
  for (const auto& seq : *fewer) fewer_total += static_cast<int64_t>(seq.size());
  EXPECT_EQ(fewer_total, total - 5);
  o.file = (root_ / "missing.jsonl").string();
  auto missing = (*c)->Sequences(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.jsonl"), std::string::npos);
}

// The whole path: tiny-chat converted at 4 bits (head bf16) by round to nearest and by GPTQ on
// 512 tokens of a text; on that text, GPTQ's residual stream after layers 2 and 8 is closer to
// the bf16 model's (GPTQ minimizes the error on its calibration inputs, and each layer makes up
// for the quantized layers before it).
TEST_F(CalibrateTest, ConvertWithCalibrationFitsItsText) {
  auto texts = ReadTexts(std::string(kModel) + "/heldout.jsonl", 6);
  auto tokenizer = Tokenizer::Load(kModel);
  ASSERT_TRUE(texts.ok() && tokenizer.ok());
  std::string text;
  for (const std::string& t : *texts) text += t + "\n\n";
  auto ids = tokenizer->Encode(text);  // what the calibration reads: its first 512 tokens
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 512u);
  ids->resize(512);
  const fs::path file = root_ / "calib.jsonl";
  std::ofstream(file) << nlohmann::json({{"text", text}}).dump() << "\n";
  const int layers[] = {2, 8};
  auto base = Model::Load(kModel, cpu_);
  ASSERT_TRUE(base.ok());
  auto want = SequenceHidden(**base, *ids, layers);
  ASSERT_TRUE(want.ok());

  const size_t per_layer = want->size() / 2;
  double error[2][2];  // [calibrated][layer]
  for (bool calibrate : {false, true}) {
    ConvertOptions o;
    o.from = kModel;
    o.to = (root_ / (calibrate ? "gptq" : "rtn")).string();
    o.bits = {4, 16};
    o.pool = &pool_;
    o.calibrate = calibrate;
    o.calibration.file = file.string();
    o.calibration.rows = 512;
    o.calibration.window = 512;
    o.backend = cpu_;
    auto summary = Convert(o);
    ASSERT_TRUE(summary.ok()) << summary.status().message();
    EXPECT_EQ(summary->quantized, 56);
    EXPECT_EQ(summary->calibrated, calibrate ? 56 : 0);
    auto m = Model::Load(o.to, cpu_);
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto got = SequenceHidden(**m, *ids, layers);
    ASSERT_TRUE(got.ok());
    for (int l = 0; l < 2; ++l) {
      double e = 0.0, norm = 0.0;
      for (size_t i = l * per_layer; i < (l + 1) * per_layer; ++i) {
        e += ((*got)[i] - (*want)[i]) * ((*got)[i] - (*want)[i]);
        norm += (*want)[i] * (*want)[i];
      }
      error[calibrate][l] = e / norm;
    }
  }
  for (int l = 0; l < 2; ++l) {
    std::printf("relative squared error after layer %d: rtn %.3g, gptq %.3g\n", layers[l],
                error[0][l], error[1][l]);
    EXPECT_LT(error[1][l], 0.8 * error[0][l]) << "layer " << layers[l];
  }
}

}  // namespace
}  // namespace gizllm::quant
