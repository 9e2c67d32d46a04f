// `--kv` as ops/backend.h reads it: ParseKvBits (bits of keys and values, the aliases), KvFormatOf
// (the pages that store them), AutoKvFormat (the choice that fits the budget) and ChooseKvFormat
// (the backend's default, and the refusal of a format a backend has no kernels for, naming the
// flag and the device). On the CPU backend and on
// a CPU backend that takes what the CUDA backend takes (32 and 16 bits, 16 by default).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

// A backend that takes float32 and fp16 pages, fp16 by default, as CUDA's fast mode does.
class SixteenBitBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  std::string Describe() const override { return "test-gpu"; }
  bool SupportsKvFormat(KvFormat f) const override {
    return f == KvFormat::kF32 || f == KvFormat::kF16;
  }
  KvFormat DefaultKvFormat() const override { return KvFormat::kF16; }
};

TEST(KvChoiceTest, ParsesBitsAndAliases) {
  struct Case {
    const char* text;
    int keys, values;
  };
  for (Case c : {Case{"32", 32, 32}, Case{"16", 16, 16}, Case{"8", 8, 8}, Case{"4", 4, 4},
                 Case{"2", 2, 2}, Case{"8/4", 8, 4}, Case{"16/8", 16, 8}, Case{"4/2", 4, 2},
                 Case{"f32", 32, 32}, Case{"f16", 16, 16}, Case{"q8", 8, 8}}) {
    auto bits = ParseKvBits(c.text);
    ASSERT_TRUE(bits.ok()) << c.text << ": " << bits.status().message();
    EXPECT_EQ(bits->keys, c.keys) << c.text;
    EXPECT_EQ(bits->values, c.values) << c.text;
  }
}

TEST(KvChoiceTest, RefusesWhatIsNotBits) {
  for (const char* text : {"", "3", "64", "1", "8/", "/8", "8/4/2", "16/3", "f8", "q4", "bf16",
                           "16 ", "auto/8", "08"}) {
    auto bits = ParseKvBits(text);
    ASSERT_FALSE(bits.ok()) << "'" << text << "'";
    EXPECT_EQ(bits.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bits.status().message().find("--kv " + std::string(text) + ":"), std::string::npos)
        << bits.status().message();
    EXPECT_NE(bits.status().message().find("8/4"), std::string::npos) << bits.status().message();
  }
}

TEST(KvChoiceTest, FormatsThatStoreTheBits) {
  EXPECT_EQ(KvFormatOf({32, 32}), KvFormat::kF32);
  EXPECT_EQ(KvFormatOf({16, 16}), KvFormat::kF16);
  // 8, 4 and 2 bits: the rotated pages, keys and values each their own bits; q8 is not them.
  for (int keys : {8, 4, 2}) {
    for (int values : {8, 4, 2}) {
      const std::optional<KvFormat> f = KvFormatOf({keys, values});
      ASSERT_TRUE(f.has_value());
      EXPECT_TRUE(IsRotatedKv(*f));
      EXPECT_NE(*f, KvFormat::kQ8);
      EXPECT_EQ(KvKeyBits(*f), keys);
      EXPECT_EQ(KvValueBits(*f), values);
      EXPECT_EQ(KvFormatName(*f), keys == values
                                      ? std::to_string(keys)
                                      : std::to_string(keys) + "/" + std::to_string(values));
      // Each vector's codes, plus a float32 step and min per 32 channels.
      EXPECT_EQ(KvKeyBytes(*f, 128), 16 * keys);
      EXPECT_EQ(KvValueBytes(*f, 128), 16 * values);
      EXPECT_EQ(KvFormatScaleBytes(*f, 128), 32);
      EXPECT_EQ(KvFormatScaleBytes(*f, 24), 8);
    }
  }
  // No pages mix floats and codes.
  for (KvBits bits : {KvBits{16, 8}, KvBits{32, 16}, KvBits{8, 16}}) {
    EXPECT_FALSE(KvFormatOf(bits).has_value()) << bits.keys << "/" << bits.values;
  }
  EXPECT_EQ(KvKeyBits(KvFormat::kF32), 32);
  EXPECT_EQ(KvValueBits(KvFormat::kF16), 16);
  EXPECT_EQ(KvKeyBits(KvFormat::kQ8), 8);
  EXPECT_EQ(AllKvFormats().size(), 12u);
}

// Bytes a position takes in a format for a model of 4 layers of 8 kv heads of 128.
int64_t PositionBytes(KvFormat f) {
  return 4 * 8 * (KvKeyBytes(f, 128) + KvValueBytes(f, 128) + 2 * KvFormatScaleBytes(f, 128));
}

// The automatic choice (the rule): the first format of more than 4 bits in which every
// slot's whole context fits, else the first of 4 bits or fewer in which one context fits, else
// the smallest.
TEST(KvChoiceTest, AutoFitsEverySlotThenOneContextThenTheSmallest) {
  const std::vector<KvFormat> candidates = {KvFormat::kF16, RotatedKv(8, 8), RotatedKv(8, 4),
                                            RotatedKv(4, 4), RotatedKv(2, 2)};
  KvFit fit{.budget_bytes = 0, .slots = 8, .context = 4096, .position_bytes = PositionBytes};
  auto with_budget = [&](int64_t bytes) {
    fit.budget_bytes = bytes;
    return AutoKvFormat(candidates, fit);
  };
  const int64_t every = fit.slots * fit.context;
  EXPECT_EQ(with_budget(every * PositionBytes(KvFormat::kF16)), KvFormat::kF16);
  EXPECT_EQ(with_budget(every * PositionBytes(KvFormat::kF16) - 1), RotatedKv(8, 8));
  EXPECT_EQ(with_budget(every * PositionBytes(RotatedKv(8, 8))), RotatedKv(8, 8));
  // 8-bit does not fit every slot: one context at 4 bits or fewer, the widest of those first
  // (8/4 has 4-bit values), even where 8/4 would fit every slot of a smaller model.
  EXPECT_EQ(with_budget(every * PositionBytes(RotatedKv(8, 8)) - 1), RotatedKv(8, 4));
  EXPECT_EQ(with_budget(fit.context * PositionBytes(RotatedKv(8, 4))), RotatedKv(8, 4));
  EXPECT_EQ(with_budget(fit.context * PositionBytes(RotatedKv(8, 4)) - 1), RotatedKv(4, 4));
  EXPECT_EQ(with_budget(fit.context * PositionBytes(RotatedKv(2, 2))), RotatedKv(2, 2));
  // Not even one context at 2 bits: the smallest all the same.
  EXPECT_EQ(with_budget(1), RotatedKv(2, 2));
  EXPECT_EQ(AutoKvFormat({KvFormat::kF32, KvFormat::kF16}, fit), KvFormat::kF16);
}

// ChooseKvFormat("auto") with a fit: the backend's formats from its default down.
TEST(KvChoiceTest, AutoWithAFitOnTheCpu) {
  ThreadPool pool(1);
  auto cpu = MakeCpuBackend(&pool);
  KvFit fit{.budget_bytes = 0, .slots = 4, .context = 1024, .position_bytes = PositionBytes};
  const int64_t every = fit.slots * fit.context;
  fit.budget_bytes = every * PositionBytes(KvFormat::kF32);
  EXPECT_EQ(*ChooseKvFormat("auto", *cpu, &fit), KvFormat::kF32);
  fit.budget_bytes = every * PositionBytes(KvFormat::kF16);
  EXPECT_EQ(*ChooseKvFormat("auto", *cpu, &fit), KvFormat::kF16);
  fit.budget_bytes = every * PositionBytes(RotatedKv(8, 8));
  EXPECT_EQ(*ChooseKvFormat("auto", *cpu, &fit), RotatedKv(8, 8));
  fit.budget_bytes = fit.context * PositionBytes(RotatedKv(4, 4));
  EXPECT_EQ(*ChooseKvFormat("auto", *cpu, &fit), RotatedKv(4, 4));
  fit.budget_bytes = 1;
  EXPECT_EQ(*ChooseKvFormat("auto", *cpu, &fit), RotatedKv(2, 2));
  // An explicit --kv is taken as it is.
  EXPECT_EQ(*ChooseKvFormat("16", *cpu, &fit), KvFormat::kF16);
  // A backend of 16-bit pages only: 16 where nothing else runs.
  SixteenBitBackend gpu(&pool, CpuOptions{});
  EXPECT_EQ(*ChooseKvFormat("auto", gpu, &fit), KvFormat::kF16);
}

TEST(KvChoiceTest, ChoosesOnTheCpu) {
  ThreadPool pool(1);
  auto cpu = MakeCpuBackend(&pool);
  auto choose = [&](const char* text) { return ChooseKvFormat(text, *cpu); };
  EXPECT_EQ(*choose("auto"), KvFormat::kF32);  // the CPU's default stays float32
  EXPECT_EQ(*choose("32"), KvFormat::kF32);
  EXPECT_EQ(*choose("f32"), KvFormat::kF32);
  EXPECT_EQ(*choose("16"), KvFormat::kF16);
  EXPECT_EQ(*choose("f16"), KvFormat::kF16);
  EXPECT_EQ(*choose("q8"), RotatedKv(8, 8));  // the alias of 8
  EXPECT_EQ(*choose("8"), RotatedKv(8, 8));
  EXPECT_EQ(*choose("4"), RotatedKv(4, 4));
  EXPECT_EQ(*choose("2"), RotatedKv(2, 2));
  EXPECT_EQ(*choose("8/4"), RotatedKv(8, 4));
  EXPECT_EQ(*choose("4/8"), RotatedKv(4, 8));
  for (const char* text : {"16/8", "32/16", "8/16"}) {
    auto format = choose(text);
    ASSERT_FALSE(format.ok()) << text;
    EXPECT_EQ(format.status().code(), StatusCode::kUnimplemented);
    const std::string& m = format.status().message();
    EXPECT_NE(m.find("--kv " + std::string(text) + ":"), std::string::npos) << m;
    EXPECT_NE(m.find("do not mix floats and codes"), std::string::npos) << m;
  }
  EXPECT_NE(choose("16/8").status().message().find("16-bit keys and 8-bit values"),
            std::string::npos);
  EXPECT_FALSE(choose("x").ok());
}

TEST(KvChoiceTest, ChoosesOnABackendOfSixteenBitPages) {
  ThreadPool pool(1);
  SixteenBitBackend gpu(&pool, CpuOptions{});
  EXPECT_EQ(*ChooseKvFormat("auto", gpu), KvFormat::kF16);
  EXPECT_EQ(*ChooseKvFormat("32", gpu), KvFormat::kF32);
  EXPECT_EQ(*ChooseKvFormat("f16", gpu), KvFormat::kF16);
  auto q8 = ChooseKvFormat("q8", gpu);
  ASSERT_FALSE(q8.ok());
  EXPECT_EQ(q8.status().message(),
            "--kv q8: 8-bit KV pages do not run on test-gpu; it takes --kv 32 (f32), 16 (f16)");
  auto eight = ChooseKvFormat("8/4", gpu);
  ASSERT_FALSE(eight.ok());
  EXPECT_EQ(eight.status().message(),
            "--kv 8/4: 8-bit keys and 4-bit values do not run on test-gpu; it takes --kv 32 "
            "(f32), 16 (f16)");
}

}  // namespace
}  // namespace gizllm
