// `--kv` as ops/backend.h reads it: ParseKvBits (bits of keys and values, the aliases), KvFormatOf
// (the pages that store them) and ChooseKvFormat (the backend's default, and the refusal of a
// format a backend has no kernels for, naming the flag and the device). On the CPU backend and on
// a CPU backend that takes what the CUDA backend takes (32 and 16 bits, 16 by default).
#include <gtest/gtest.h>

#include <string>

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
    bool q8;
  };
  for (Case c : {Case{"32", 32, 32, false}, Case{"16", 16, 16, false}, Case{"8", 8, 8, false},
                 Case{"4", 4, 4, false}, Case{"2", 2, 2, false}, Case{"8/4", 8, 4, false},
                 Case{"16/8", 16, 8, false}, Case{"4/2", 4, 2, false}, Case{"f32", 32, 32, false},
                 Case{"f16", 16, 16, false}, Case{"q8", 8, 8, true}}) {
    auto bits = ParseKvBits(c.text);
    ASSERT_TRUE(bits.ok()) << c.text << ": " << bits.status().message();
    EXPECT_EQ(bits->keys, c.keys) << c.text;
    EXPECT_EQ(bits->values, c.values) << c.text;
    EXPECT_EQ(bits->q8, c.q8) << c.text;
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
  EXPECT_EQ(KvFormatOf({8, 8, true}), KvFormat::kQ8);
  // The rotated pages are not there yet; q8 is not them.
  for (KvBits bits :
       {KvBits{8, 8}, KvBits{4, 4}, KvBits{2, 2}, KvBits{8, 4}, KvBits{16, 8}, KvBits{32, 16}}) {
    EXPECT_FALSE(KvFormatOf(bits).has_value()) << bits.keys << "/" << bits.values;
  }
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
  EXPECT_EQ(*choose("q8"), KvFormat::kQ8);
  for (const char* text : {"8", "4", "2", "8/4", "16/8"}) {
    auto format = choose(text);
    ASSERT_FALSE(format.ok()) << text;
    EXPECT_EQ(format.status().code(), StatusCode::kUnimplemented);
    const std::string& m = format.status().message();
    EXPECT_NE(m.find("--kv " + std::string(text) + ":"), std::string::npos) << m;
    EXPECT_NE(m.find(cpu->Describe()), std::string::npos) << m;
    EXPECT_NE(m.find("not implemented yet"), std::string::npos) << m;
    EXPECT_NE(m.find("32 (f32), 16 (f16), q8"), std::string::npos) << m;
  }
  EXPECT_NE(choose("8/4").status().message().find("8-bit keys and 4-bit values"),
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
            "--kv q8: q8 KV pages do not run on test-gpu; it takes --kv 32 "
            "(f32), 16 (f16)");
  auto eight = ChooseKvFormat("8", gpu);
  ASSERT_FALSE(eight.ok());
  EXPECT_EQ(eight.status().message(),
            "--kv 8: 8-bit KV pages (rotated codes, not implemented yet) do not run on test-gpu; "
            "it takes --kv 32 (f32), 16 (f16)");
}

}  // namespace
}  // namespace gizllm
