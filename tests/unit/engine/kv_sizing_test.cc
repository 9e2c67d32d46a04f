// The default KV budget and `serve`'s slots and context, from memory figures alone (no device).
#include "engine/kv_sizing.h"

#include <gtest/gtest.h>

#include <vector>

namespace gizllm {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

// A page of Qwen3-8B (36 layers, 8 kv heads of 128) with 16-bit keys and values.
constexpr int64_t kQwen3_8bPage = int64_t{36} * 2 * kPage * 8 * 128 * 2;

// Gemma 3's layout (five window layers a global one, one shape): a pool page holds the global
// layer, and a block takes five more while its window (1,024 positions) is read; without a
// window layer, every layer's page a block as before.
TEST(KvSizingTest, BudgetForWindowPagingHoldsTheWindowOnly) {
  const CacheSpec global{LayerKind::kAttention, 8, 256, 0, KvFormat::kF16};
  CacheSpec local = global;
  local.window = 1024;
  const int64_t layer = global.PageBytes();
  std::vector<CacheSpec> gemma = {local, local, local, local, local, global};
  const int64_t blocks = 8192 / kPage;
  // WindowBlocks(1024, 512): PagesFor(1536) + 2 = 98 blocks of each of the five groups.
  EXPECT_EQ(KvBudgetFor(gemma, 6 * layer, 3, blocks, 512), 3 * (blocks + 5 * 98) * layer);
  // A context shorter than the window: every block in every group.
  EXPECT_EQ(KvBudgetFor(gemma, 6 * layer, 1, 40, 512), 6 * 40 * layer);
  std::vector<CacheSpec> dense(6, global);
  EXPECT_EQ(KvBudgetFor(dense, 6 * layer, 3, blocks, 512), 3 * blocks * 6 * layer);
  // Window layers of another shape than the others: no window paging.
  local.head_dim = 128;
  std::vector<CacheSpec> mixed = {local, global};
  EXPECT_FALSE(KvPagingOf(mixed).enabled());
  EXPECT_EQ(KvBudgetFor(mixed, 7, 2, 10, 64), 2 * 10 * 7);
}

TEST(KvSizingTest, StepRowsLeavePromptRowsBesideEverySlot) {
  EXPECT_EQ(StepRows(DeviceKind::kCuda, 64, 0), kGpuIdleRows);
  EXPECT_EQ(StepRows(DeviceKind::kCuda, 1, 0), kGpuIdleRows);
  EXPECT_EQ(StepRows(DeviceKind::kCuda, 2000, 0), 2000 + kGpuPromptRows);
  EXPECT_EQ(BusyStepRows(DeviceKind::kCuda, 64, 0), 64 + kGpuPromptRows);
  EXPECT_EQ(BusyStepRows(DeviceKind::kCuda, 1, 0), 1 + kGpuPromptRows);
  EXPECT_EQ(BusyStepRows(DeviceKind::kCpu, 4, 0), kCpuStepRows);
  EXPECT_EQ(BusyStepRows(DeviceKind::kCuda, 64, 2048), 2048);
  EXPECT_EQ(StepRows(DeviceKind::kCpu, 4, 0), kCpuStepRows);
  EXPECT_EQ(StepRows(DeviceKind::kCpu, 300, 0), 300);
  // What the user passed, raised to the slots.
  EXPECT_EQ(StepRows(DeviceKind::kCuda, 64, 2048), 2048);
  EXPECT_EQ(StepRows(DeviceKind::kCuda, 64, 16), 64);
  EXPECT_EQ(StepRows(DeviceKind::kCpu, 8, 32), 32);
}

TEST(KvSizingTest, ReserveIsAGibOrFivePercent) {
  EXPECT_EQ(KvReserveBytes(8 * kGiB), kGiB);
  EXPECT_EQ(KvReserveBytes(20 * kGiB), kGiB);
  EXPECT_EQ(KvReserveBytes(24 * kGiB), 24 * kGiB / 20);
  EXPECT_EQ(KvReserveBytes(140 * kGiB), 7 * kGiB);
}

TEST(KvSizingTest, GpuBudgetIsWhatTheWeightsLeftLessTheReserve) {
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCuda, {120 * kGiB, 140 * kGiB}), 113 * kGiB);
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCuda, {10 * kGiB, 24 * kGiB}), 10 * kGiB - 24 * kGiB / 20);
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCuda, {kGiB / 2, 24 * kGiB}), 0);  // nothing left
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCuda, {}), 0);                     // unknown figures
}

TEST(KvSizingTest, CpuBudgetIsAQuarterOfWhatIsLeftUpToACap) {
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCpu, {3 * kGiB, 8 * kGiB}), kGiB / 2);
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCpu, {60 * kGiB, 64 * kGiB}), kCpuKvBudgetCap);
  // Little or unknown memory: the floor (what a few chats need), as the pool always had.
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCpu, {kGiB / 2, 8 * kGiB}), kCpuKvBudgetFloor);
  EXPECT_EQ(DefaultKvBudget(DeviceKind::kCpu, {}), kCpuKvBudgetFloor);
}

// An 8B model on an H200 (141 GiB; 16.4 GB of bf16 weights and the runtime taken): hundreds of
// chats of kTypicalChat positions, each up to 32,768 positions, with no number passed.
TEST(KvSizingTest, ServeOnAnH200HoldsHundredsOfChats) {
  const DeviceMemory h200{124 * kGiB, 141 * kGiB};
  auto size = SizeServe(DeviceKind::kCuda, h200, kQwen3_8bPage, /*model_context=*/40960, {});
  ASSERT_TRUE(size.ok()) << size.status().message();
  EXPECT_EQ(size->kv_budget_bytes, 124 * kGiB - 141 * kGiB / 20);
  EXPECT_EQ(size->positions, size->kv_budget_bytes / kQwen3_8bPage * kPage);
  EXPECT_GT(size->positions, 700000);
  EXPECT_EQ(size->context, kMaxGpuContext);
  EXPECT_EQ(size->slots, size->positions / kTypicalChat);
  EXPECT_GE(size->slots, 300);
  EXPECT_LE(size->slots, kMaxGpuSlots);
  // Float32 pages hold half the positions: half the slots.
  auto f32 = SizeServe(DeviceKind::kCuda, h200, 2 * kQwen3_8bPage, 40960, {});
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->slots, f32->positions / kTypicalChat);
  EXPECT_NEAR(f32->slots, size->slots / 2, 1);
  // A small model: the slots stop at the cap.
  auto small = SizeServe(DeviceKind::kCuda, h200, kQwen3_8bPage / 8, 40960, {});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->slots, kMaxGpuSlots);
}

TEST(KvSizingTest, ServeKeepsWhatItIsTold) {
  const DeviceMemory h200{124 * kGiB, 141 * kGiB};
  auto size = SizeServe(DeviceKind::kCuda, h200, kQwen3_8bPage, 40960,
                        {/*slots=*/7, /*context=*/1000, /*kv_budget_bytes=*/256 * kMiB});
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size->slots, 7);
  EXPECT_EQ(size->context, 1000);
  EXPECT_EQ(size->kv_budget_bytes, 256 * kMiB);
  EXPECT_EQ(size->positions, 256 * kMiB / kQwen3_8bPage * kPage);
}

TEST(KvSizingTest, ServeContextFollowsTheModelAndTheBudget) {
  // The model's own context when shorter than the cap.
  auto model = SizeServe(DeviceKind::kCuda, {20 * kGiB, 24 * kGiB}, kQwen3_8bPage, 8192, {});
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->context, 8192);
  // A budget that holds less than the cap: the context is what it holds; one slot.
  auto tight = SizeServe(DeviceKind::kCuda, {20 * kGiB, 24 * kGiB}, kQwen3_8bPage, 40960,
                         {0, 0, /*kv_budget_bytes=*/100 * kQwen3_8bPage});
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ(tight->positions, 100 * kPage);
  EXPECT_EQ(tight->context, 100 * kPage);
  EXPECT_EQ(tight->slots, 1);
  // Unknown model context: the cap.
  auto unknown = SizeServe(DeviceKind::kCuda, {20 * kGiB, 24 * kGiB}, kQwen3_8bPage, 0, {});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->context, kMaxGpuContext);
}

TEST(KvSizingTest, ServeOnTheCpuStaysSmall) {
  // tiny-chat-sized pages (a few KB) in 64 GiB of host memory: 1 GiB, 16 slots of 4,096.
  auto size = SizeServe(DeviceKind::kCpu, {60 * kGiB, 64 * kGiB}, 4 * 4096, 8192, {});
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size->kv_budget_bytes, kCpuKvBudgetCap);
  EXPECT_EQ(size->slots, kMaxCpuSlots);
  EXPECT_EQ(size->context, kMaxCpuContext);
}

TEST(KvSizingTest, ServeWithoutRoomSaysWhy) {
  auto size = SizeServe(DeviceKind::kCuda, {kGiB / 2, 24 * kGiB}, kQwen3_8bPage, 40960, {});
  ASSERT_FALSE(size.ok());
  EXPECT_EQ(size.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(size.status().message().find("0.50 GiB free of 24.00 GiB"), std::string::npos)
      << size.status().message();
  EXPECT_NE(size.status().message().find("--kv-mib"), std::string::npos);
  auto told = SizeServe(DeviceKind::kCuda, {20 * kGiB, 24 * kGiB}, kQwen3_8bPage, 40960,
                        {0, 0, /*kv_budget_bytes=*/kMiB});
  ASSERT_FALSE(told.ok());
  EXPECT_NE(told.status().message().find("--kv-mib gives"), std::string::npos);
  EXPECT_FALSE(SizeServe(DeviceKind::kCuda, {20 * kGiB, 24 * kGiB}, 0, 40960, {}).ok());
}

}  // namespace
}  // namespace gizllm
