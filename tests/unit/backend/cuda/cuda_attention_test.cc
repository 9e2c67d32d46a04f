// Paged attention on the CUDA backend against the CPU scalar reference: decoding rows (the split
// decode kernel), prompt pieces (the float32 tile kernel in exact mode, the fp16 tensor-core tile
// kernel in the fast mode), steps that mix both, sliding windows, soft-capped scores, and the
// head shapes of the supported models; over float32 pages and fp16 pages (KvFormat::kF16).
//
// fp16 pages are held to the same bounds as float32 ones: the reference reads the very fp16
// values the device reads (the cache is made of fp16 values; keys written in the step are
// rounded by ReferenceKvWrite as RopeKv rounds them, and must match its pages bit for bit), so
// the only rounding left between them is the kernels' own.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

// The bytes of KV pages holding `values` in `format` (kF32, or kF16 rounded to nearest).
std::vector<uint8_t> PageBytes(const std::vector<float>& values, KvFormat format) {
  std::vector<uint8_t> bytes(values.size() * KvFormatBytes(format));
  if (format == KvFormat::kF16) {
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = F32ToF16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  } else {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

// A step: per sequence (slot) its rows' positions, in the order the rows appear.
struct Piece {
  int32_t slot;
  int32_t first;  // KV position of the piece's first row
  int32_t count;  // rows
};

// exact: the float32 kernels, within 1e-4; otherwise the fast mode (prompt pieces with fp16
// operands), within 1e-2. through_rope_kv: the step's own keys and values are written by RopeKv
// (no rotary) just before, as a model does, so that the fast mode's tile kernel may read them
// from the fp16 copy RopeKv leaves; otherwise every position is in the cache beforehand.
// softcap: AttentionParams::softcap (0: off). kv: the pages' format (kF32 or kF16). holes: the
// device's page table holds -1 for every block wholly before the window of its slot's earliest
// row (as window paging leaves it, model/runner.h), and page -1 is a page of NaN keys and values
// just before the pool: a kernel that read a hole would put NaN in the output.
void CheckAttentionIn(bool exact, int heads, int kv_heads, int head_dim, int32_t window,
                      const std::vector<Piece>& pieces, uint32_t seed, bool through_rope_kv = false,
                      float softcap = 0.0f, KvFormat kv = KvFormat::kF32, bool holes = false) {
  SCOPED_TRACE(std::string(exact ? "exact" : "fast") + (through_rope_kv ? " rope-kv" : "") +
               (holes ? " holes" : "") + " pages " + KvFormatName(kv) + " heads " +
               std::to_string(heads) + "/" + std::to_string(kv_heads) + " dim " +
               std::to_string(head_dim) + " window " + std::to_string(window) + " softcap " +
               std::to_string(softcap) + " seed " + std::to_string(seed));
  auto backend = MakeBackend(exact);
  std::mt19937 rng(seed);
  int32_t slots = 0, longest = 0;
  std::vector<int32_t> row_slots, row_positions;
  for (const Piece& piece : pieces) {
    slots = std::max(slots, piece.slot + 1);
    longest = std::max(longest, piece.first + piece.count);
    for (int32_t i = 0; i < piece.count; ++i) {
      row_slots.push_back(piece.slot);
      row_positions.push_back(piece.first + i);
    }
  }
  const int64_t rows = static_cast<int64_t>(row_slots.size());
  const int32_t max_pages = (longest + kPage - 1) / kPage + 1;
  const int32_t pages = slots * max_pages;
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  size_t cache_size = static_cast<size_t>(pages) * kPage * kv_heads * head_dim;
  // The device's table: with holes, -1 for the blocks before each slot's earliest window.
  std::vector<int32_t> device_table = table;
  if (holes) {
    ASSERT_GT(window, 0);
    std::vector<int32_t> first(slots, INT32_MAX);
    for (int64_t r = 0; r < static_cast<int64_t>(row_slots.size()); ++r) {
      first[row_slots[r]] =
          std::min(first[row_slots[r]], std::max(0, row_positions[r] - window + 1));
    }
    int32_t dropped = 0;
    for (int32_t s = 0; s < slots; ++s) {
      for (int32_t b = 0; first[s] != INT32_MAX && b < first[s] / kPage; ++b, ++dropped) {
        device_table[s * max_pages + b] = -1;
      }
    }
    ASSERT_GT(dropped, 0);
  }
  // Every position of the cache holds random keys and values (those a row must not see too),
  // after one page of NaN (page -1).
  const size_t guard = static_cast<size_t>(kPage) * kv_heads * head_dim;
  auto with_guard = [&](std::vector<float> cache) {
    cache.insert(cache.begin(), guard, std::numeric_limits<float>::quiet_NaN());
    return PageBytes(cache, kv);
  };
  DeviceArray<uint8_t> keys(backend.get(), with_guard(RandomFloats(rng, cache_size)));
  DeviceArray<uint8_t> values(backend.get(), with_guard(RandomFloats(rng, cache_size)));
  const size_t guard_bytes = guard * KvFormatBytes(kv);
  DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * heads * head_dim, 2.0f));
  DeviceArray<float> out(backend.get(), std::vector<float>(rows * heads * head_dim));
  out.Poison();
  DeviceArray<int32_t> d_table(backend.get(), device_table), d_slots(backend.get(), row_slots),
      d_positions(backend.get(), row_positions);
  AttentionParams p;
  p.out = out.device();
  p.q = q.device();
  p.cache = {keys.device() + guard_bytes, values.device() + guard_bytes, kv};
  p.table = {d_table.device(), max_pages};
  p.slots = d_slots.device();
  p.positions = d_positions.device();
  p.rows = rows;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.window = window;
  p.softcap = softcap;
  ASSERT_TRUE(p.Check().ok());
  if (through_rope_kv) {
    const int64_t n = rows * kv_heads * head_dim;
    DeviceArray<float> k(backend.get(), RandomFloats(rng, n)),
        v(backend.get(), RandomFloats(rng, n));
    RopeKvParams rk;
    rk.q = RopeParams{.x = q.device(), .rows = rows, .heads = heads, .head_dim = head_dim};
    rk.k = RopeParams{.x = k.device(), .rows = rows, .heads = kv_heads, .head_dim = head_dim};
    rk.kv = KvWriteParams{.cache = p.cache,
                          .table = p.table,
                          .k = k.device(),
                          .v = v.device(),
                          .slots = p.slots,
                          .positions = p.positions,
                          .rows = rows,
                          .kv_heads = kv_heads,
                          .head_dim = head_dim};
    ASSERT_TRUE(rk.Check().ok()) << rk.Check().message();
    backend->RopeKv(rk);
    // The reference's cache holds the same rows, stored as the reference stores them; RopeKv's
    // pages hold the same bytes.
    KvWriteParams write = rk.kv;
    write.cache = {keys.host().data() + guard_bytes, values.host().data() + guard_bytes, kv};
    write.table = {table.data(), max_pages};
    write.k = k.host().data();
    write.v = v.host().data();
    write.slots = row_slots.data();
    write.positions = row_positions.data();
    ReferenceKvWrite(write);
    EXPECT_TRUE(keys.Read() == keys.host()) << "RopeKv's keys differ from the reference's";
    EXPECT_TRUE(values.Read() == values.host()) << "RopeKv's values differ from the reference's";
  }
  backend->Attention(p);
  AttentionParams ref = p;
  ref.out = out.host().data();
  ref.q = q.host().data();
  ref.cache = {keys.host().data() + guard_bytes, values.host().data() + guard_bytes, kv};
  ref.table = {table.data(), max_pages};
  ref.slots = row_slots.data();
  ref.positions = row_positions.data();
  ReferenceAttention(ref);
  EXPECT_LT(RelativeError(out.Read(), out.host()), exact ? 1e-4 : 1e-2);
}

// The same with fp16 pages.
void CheckF16Attention(bool exact, int heads, int kv_heads, int head_dim, int32_t window,
                       const std::vector<Piece>& pieces, uint32_t seed,
                       bool through_rope_kv = false, float softcap = 0.0f) {
  CheckAttentionIn(exact, heads, kv_heads, head_dim, window, pieces, seed, through_rope_kv, softcap,
                   KvFormat::kF16);
}

void CheckAttention(int heads, int kv_heads, int head_dim, int32_t window,
                    const std::vector<Piece>& pieces, uint32_t seed) {
  CheckAttentionIn(/*exact=*/true, heads, kv_heads, head_dim, window, pieces, seed);
}

void CheckFastAttention(int heads, int kv_heads, int head_dim, int32_t window,
                        const std::vector<Piece>& pieces, uint32_t seed) {
  CheckAttentionIn(/*exact=*/false, heads, kv_heads, head_dim, window, pieces, seed);
}

TEST(CudaAttentionTest, DecodeRowsOfSeveralSequences) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckAttention(32, 8, 128, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}, {2, 129, 1}}, 1);
  CheckAttention(16, 8, 128, 0, {{0, 33, 1}, {1, 300, 1}}, 2);  // Qwen3-0.6B's heads
  CheckAttention(6, 2, 64, 0, {{1, 77, 1}, {0, 18, 1}}, 3);     // tiny-chat's heads
}

TEST(CudaAttentionTest, DecodeOneLongContextAcrossSplits) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckAttention(32, 8, 128, 0, {{0, 5000, 1}}, 4);
  CheckAttention(8, 1, 64, 0, {{0, 2047, 1}}, 5);
  CheckAttention(4, 2, 256, 0, {{0, 1234, 1}}, 6);
}

TEST(CudaAttentionTest, PromptPieces) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckAttention(32, 8, 128, 0, {{0, 0, 100}}, 7);
  CheckAttention(6, 2, 64, 0, {{0, 37, 70}}, 8);
  CheckAttention(4, 4, 256, 0, {{2, 3, 130}}, 9);
  CheckAttention(16, 2, 64, 0, {{0, 200, 19}, {1, 0, 45}}, 10);
}

TEST(CudaAttentionTest, MixedDecodesAndPromptPieces) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckAttention(32, 8, 128, 0, {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 0, 3}, {4, 5, 1}}, 11);
  CheckAttention(6, 2, 64, 0, {{2, 9, 1}, {0, 0, 2}, {1, 64, 1}}, 12);
}

TEST(CudaAttentionTest, SlidingWindow) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckAttention(8, 2, 128, 100, {{0, 300, 1}, {1, 250, 90}, {2, 40, 1}}, 13);
  CheckAttention(6, 2, 64, 17, {{0, 0, 50}, {1, 3000, 1}}, 14);
}

// Every head_dim that is a multiple of 32 up to 256 (float2 pieces where it is not a multiple
// of 64), through the split decode kernel, the tile kernel and a mixed step; 32 is the golden
// models' head_dim.
TEST(CudaAttentionTest, EveryHeadDimMultipleOf32) {
  GZ_SKIP_WITHOUT_CUDA();
  for (int head_dim = 32; head_dim <= 256; head_dim += 32) {
    uint32_t seed = 100 + head_dim;
    CheckAttention(4, 2, head_dim, 0, {{0, 700, 1}, {1, 3, 1}}, seed);
    CheckAttention(4, 2, head_dim, 0, {{0, 5, 37}}, seed + 1);
    CheckAttention(8, 1, head_dim, 0, {{0, 40, 1}, {1, 0, 20}, {2, 90, 1}}, seed + 2);
  }
}

// The fast mode's tensor-core tile kernel: prompts of 1, 17, 100 and 300 rows over contexts
// that are not multiples of 16 (nor of the 64-key tile), Qwen3-8B's and tiny-chat's heads.
TEST(CudaAttentionTest, FastPromptPieces) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] : {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}}) {
    uint32_t seed = 200 + head_dim;
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 0, 1}}, seed);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 45, 17}}, seed + 1);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{1, 0, 100}}, seed + 2);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 0, 300}}, seed + 3);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{2, 709, 100}}, seed + 4);
  }
}

// Several sequences in one step: decoding rows (the float32 decode kernel), prompt pieces of
// several slots side by side inside one tile, and a one-row prompt.
TEST(CudaAttentionTest, FastMixedSteps) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckFastAttention(32, 8, 128, 0,
                     {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 0, 3}, {4, 5, 1}, {5, 33, 17}},
                     220);
  CheckFastAttention(6, 2, 64, 0, {{2, 9, 1}, {0, 0, 2}, {1, 64, 100}, {3, 200, 1}, {4, 0, 1}},
                     221);
  CheckFastAttention(32, 8, 128, 0, {{0, 0, 5}, {1, 7, 9}, {2, 300, 2}, {3, 61, 300}}, 222);
}

TEST(CudaAttentionTest, FastSlidingWindow) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckFastAttention(32, 8, 128, 100, {{0, 250, 90}, {1, 40, 1}, {2, 0, 300}}, 230);
  CheckFastAttention(6, 2, 64, 17, {{0, 0, 50}, {1, 3000, 1}, {2, 1000, 100}}, 231);
}

// Every head shape: head_dim 32, 96 and 256 and groups of 1, 2, 3 and 8 query heads on the
// tensor cores.
TEST(CudaAttentionTest, FastHeadShapes) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckFastAttention(4, 2, 32, 0, {{0, 5, 37}, {1, 700, 1}}, 240);
  CheckFastAttention(8, 1, 96, 0, {{0, 40, 1}, {1, 0, 20}, {2, 90, 1}}, 241);
  CheckFastAttention(16, 2, 64, 0, {{0, 200, 19}, {1, 0, 45}}, 242);
  CheckFastAttention(4, 4, 128, 0, {{0, 3, 130}}, 243);
  CheckFastAttention(6, 2, 64, 0, {{0, 0, 77}}, 244);
  CheckFastAttention(4, 4, 256, 0, {{2, 3, 130}}, 245);
}

// Steps large enough for the 8-warp blocks (at least one per multiprocessor on an H200's 132):
// 600 rows of 32 heads over 8 kv heads, 1,100 rows of 16 over 2, a window, decodes beside them.
TEST(CudaAttentionTest, FastLongPrompts) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckFastAttention(32, 8, 128, 0, {{0, 3, 600}}, 250);
  CheckFastAttention(16, 2, 64, 0, {{1, 20, 1100}, {0, 50, 1}}, 251);
  CheckFastAttention(32, 8, 128, 257, {{2, 100, 1}, {0, 0, 700}, {1, 33, 1}}, 252);
}

// Keys written by RopeKv in the same step: prompts read whole (every key in the step: the tile
// kernel copies RopeKv's fp16 keys), several of them side by side, with decodes, with a window,
// and pieces that continue a sequence (earlier keys only in the cache: the float32 path).
TEST(CudaAttentionTest, FastPromptKeysFromTheStep) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{4, 2, 32}, std::tuple{8, 1, 96}}) {
    uint32_t seed = 260 + head_dim;
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 0, 300}}, seed, true);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 0, 77}, {1, 0, 130}, {2, 0, 2}},
                     seed + 1, true);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0,
                     {{3, 40, 1}, {0, 0, 65}, {1, 90, 1}, {2, 709, 100}}, seed + 2, true);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 100, {{0, 0, 400}, {1, 250, 90}}, seed + 3,
                     true);
  }
  CheckAttentionIn(false, 32, 8, 128, 0, {{0, 0, 1500}}, 270, true);  // 8-warp blocks
  CheckAttentionIn(true, 32, 8, 128, 0, {{0, 0, 300}, {1, 5, 40}}, 271, true);
}

// Window paging (model/runner.h KvPaging) leaves holes (-1) in a window layer's page table for
// the blocks before the window of the slot's earliest row in the step: every kernel (the split
// decode, the float32 tile, the fp16 tensor-core tile, with keys from the cache or RopeKv's copy)
// starts at that window and never reads one. Windows shorter than a page, across pages, and
// longer than a step's piece; decodes beside prompt pieces that start mid-page.
TEST(CudaAttentionTest, PageTableHolesBeforeTheWindow) {
  GZ_SKIP_WITHOUT_CUDA();
  uint32_t seed = 500;
  for (bool exact : {true, false}) {
    for (KvFormat kv : {KvFormat::kF32, KvFormat::kF16}) {
      for (auto [heads, kv_heads, head_dim] :
           {std::tuple{4, 2, 32}, std::tuple{8, 4, 128}, std::tuple{8, 4, 256}}) {
        for (int32_t window : {8, 37, 100}) {
          for (bool rope_kv : {false, true}) {
            CheckAttentionIn(exact, heads, kv_heads, head_dim, window,
                             {{0, 300, 1}, {1, 517, 1}, {2, 201, 60}, {3, 133, 7}, {4, 40, 1}},
                             seed++, rope_kv, /*softcap=*/0.0f, kv, /*holes=*/true);
          }
        }
        CheckAttentionIn(exact, heads, kv_heads, head_dim, 8, {{0, 250, 1}, {1, 90, 30}}, seed++,
                         false, /*softcap=*/30.0f, kv, /*holes=*/true);
      }
    }
  }
}

// head_dim 256 (Gemma 3's, Qwen3.5's) and 192 in exact mode: decoding rows (one across
// splits), prompt pieces, a step that mixes both, and a sliding window.
TEST(CudaAttentionTest, HeadDim256) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] : {std::tuple{8, 4, 256}, std::tuple{16, 8, 192}}) {
    uint32_t seed = 300 + head_dim;
    CheckAttention(heads, kv_heads, head_dim, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}}, seed);
    CheckAttention(heads, kv_heads, head_dim, 0, {{0, 3000, 1}}, seed + 1);
    CheckAttention(heads, kv_heads, head_dim, 0, {{1, 0, 100}, {0, 45, 17}}, seed + 2);
    CheckAttention(heads, kv_heads, head_dim, 0, {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}}, seed + 3);
    CheckAttention(heads, kv_heads, head_dim, 100, {{0, 300, 1}, {1, 250, 90}, {2, 0, 130}},
                   seed + 4);
  }
}

// The tensor-core tile kernel above head_dim 128 (32-key tiles, Q in shared memory): every
// head_dim it takes there, prompts of 1, 17, 100 and 300 rows over contexts that are not
// multiples of 16 (nor of the 32-key tile), a mixed step and a sliding window.
TEST(CudaAttentionTest, FastHeadDimsAbove128) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{8, 4, 256}, std::tuple{16, 8, 256}, std::tuple{6, 2, 160}, std::tuple{8, 2, 192},
        std::tuple{4, 4, 224}}) {
    uint32_t seed = 400 + head_dim + heads;
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 0, 1}}, seed);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 45, 17}}, seed + 1);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{1, 0, 100}}, seed + 2);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{0, 0, 300}}, seed + 3);
    CheckFastAttention(heads, kv_heads, head_dim, 0, {{2, 709, 100}}, seed + 4);
    CheckFastAttention(heads, kv_heads, head_dim, 0,
                       {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 0, 3}, {4, 33, 17}}, seed + 5);
    CheckFastAttention(heads, kv_heads, head_dim, 100, {{0, 250, 90}, {1, 40, 1}, {2, 0, 300}},
                       seed + 6);
  }
}

// 8-warp blocks above head_dim 128, on an H200's 132 multiprocessors: 600 rows of 32 heads over
// 16 (enough 8-warp tiles to fill the device), and 300 rows (at head_dim 224 and 256 a
// multiprocessor holds one 4-warp block, so more 4-warp tiles than multiprocessors take 8
// warps), with decodes and a window; the keys from the cache and from RopeKv's fp16 copy (whose
// copy rounds do not divide among 256 threads at head_dim 160 and 224).
TEST(CudaAttentionTest, FastLongPromptsAbove128) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckFastAttention(32, 16, 256, 0, {{0, 3, 600}}, 450);
  CheckFastAttention(32, 16, 256, 257, {{2, 100, 1}, {0, 0, 300}, {1, 33, 1}}, 451);
  CheckFastAttention(32, 16, 224, 0, {{1, 20, 300}, {0, 50, 1}}, 452);
  CheckAttentionIn(false, 32, 16, 160, 0, {{0, 0, 600}}, 453, true);
  CheckAttentionIn(false, 32, 16, 224, 0, {{0, 0, 300}}, 454, true);
  CheckAttentionIn(false, 32, 16, 256, 0, {{0, 0, 600}}, 455, true);
}

// Keys written by RopeKv in the same step above head_dim 128: prompts read whole, several side
// by side with decodes, a piece that continues a sequence, a window.
TEST(CudaAttentionTest, FastPromptKeysFromTheStepAbove128) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{8, 4, 256}, std::tuple{6, 2, 160}, std::tuple{4, 1, 224}}) {
    uint32_t seed = 460 + head_dim;
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 0, 300}}, seed, true);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0,
                     {{3, 40, 1}, {0, 0, 65}, {1, 90, 1}, {2, 709, 100}}, seed + 1, true);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 100, {{0, 0, 400}, {1, 250, 90}}, seed + 2,
                     true);
  }
}

// Soft-capped scores (cap 3 against scores of standard deviation 2: tanh bends most of them, the
// largest to nearly +-3) in exact mode: decoding rows, one across splits, prompt pieces of the
// float32 tile kernel, a mixed step, a window.
TEST(CudaAttentionTest, Softcap) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{8, 4, 256}}) {
    uint32_t seed = 500 + head_dim;
    CheckAttentionIn(true, heads, kv_heads, head_dim, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}}, seed,
                     false, /*softcap=*/3.0f);
    CheckAttentionIn(true, heads, kv_heads, head_dim, 0, {{0, 5000, 1}}, seed + 1, false, 3.0f);
    CheckAttentionIn(true, heads, kv_heads, head_dim, 0, {{0, 0, 100}, {1, 37, 70}}, seed + 2,
                     false, 3.0f);
    CheckAttentionIn(true, heads, kv_heads, head_dim, 100, {{0, 90, 1}, {1, 250, 90}}, seed + 3,
                     false, 3.0f);
  }
  // A cap far below the scores: nearly all of them saturate, far out on tanh (no inf, no NaN).
  CheckAttentionIn(true, 8, 4, 256, 0, {{0, 300, 1}, {1, 0, 40}}, 510, false, 0.2f);
  CheckAttentionIn(false, 8, 4, 256, 0, {{0, 300, 1}, {1, 0, 40}}, 511, false, 0.2f);
}

// The same in the fast mode: decoding rows beside prompt pieces on the tensor cores at head_dim
// 128, 64 and 256, keys from the cache and from RopeKv's copy, a window.
TEST(CudaAttentionTest, FastSoftcap) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{8, 4, 256}}) {
    uint32_t seed = 520 + head_dim;
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}}, seed,
                     false, /*softcap=*/3.0f);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 0, 300}}, seed + 1, false, 3.0f);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 90, 1}, {1, 10, 70}, {2, 709, 100}},
                     seed + 2, false, 3.0f);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 0, {{0, 0, 300}, {1, 5, 1}}, seed + 3, true,
                     3.0f);
    CheckAttentionIn(false, heads, kv_heads, head_dim, 100, {{0, 250, 90}, {1, 40, 1}}, seed + 4,
                     false, 3.0f);
  }
}

// fp16 pages in exact mode (float32 arithmetic on the fp16 keys and values): the split decode
// kernel (its ring of fp16 stages, the partial copy rounds at head_dim 32, 96, 160 and 224), the
// float32 tile kernel, mixed steps, windows and every head_dim, held to exact mode's 1e-4.
TEST(CudaAttentionTest, F16PagesExact) {
  GZ_SKIP_WITHOUT_CUDA();
  CheckF16Attention(true, 32, 8, 128, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}, {2, 129, 1}}, 600);
  CheckF16Attention(true, 32, 8, 128, 0, {{0, 5000, 1}}, 601);
  CheckF16Attention(true, 8, 1, 64, 0, {{0, 2047, 1}}, 602);
  CheckF16Attention(true, 32, 8, 128, 0, {{0, 0, 100}, {1, 37, 70}}, 603);
  CheckF16Attention(true, 32, 8, 128, 0, {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 0, 3}}, 604);
  CheckF16Attention(true, 8, 2, 128, 100, {{0, 300, 1}, {1, 250, 90}, {2, 40, 1}}, 605);
  CheckF16Attention(true, 6, 2, 64, 17, {{0, 0, 50}, {1, 3000, 1}}, 606);
  for (int head_dim = 32; head_dim <= 256; head_dim += 32) {
    uint32_t seed = 610 + head_dim;
    CheckF16Attention(true, 4, 2, head_dim, 0, {{0, 700, 1}, {1, 3, 1}}, seed);
    CheckF16Attention(true, 4, 2, head_dim, 0, {{0, 5, 37}}, seed + 1);
    CheckF16Attention(true, 8, 1, head_dim, 0, {{0, 40, 1}, {1, 0, 20}, {2, 90, 1}}, seed + 2);
  }
  // Keys written by RopeKv into fp16 pages in the same step.
  CheckF16Attention(true, 32, 8, 128, 0, {{0, 0, 300}, {1, 5, 40}, {2, 77, 1}}, 690, true);
}

// fp16 pages in the fast mode: the tensor-core tile kernel copies its key tiles from the pages
// as they are (no float32 staging, no step copy): prompts of 1 to 1,500 rows, pieces that
// continue a sequence, several sequences in a step beside decodes, windows, head_dim 32 to 256
// (4- and 8-warp blocks), keys written by RopeKv in the same step.
TEST(CudaAttentionTest, F16PagesFast) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{4, 2, 32}, std::tuple{8, 1, 96},
        std::tuple{8, 4, 256}, std::tuple{6, 2, 160}, std::tuple{8, 2, 192},
        std::tuple{4, 4, 224}}) {
    uint32_t seed = 700 + head_dim + heads;
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{0, 0, 1}}, seed);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{0, 45, 17}}, seed + 1);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{1, 0, 300}}, seed + 2);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{2, 709, 100}}, seed + 3);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0,
                      {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 0, 3}, {4, 33, 17}}, seed + 4);
    CheckF16Attention(false, heads, kv_heads, head_dim, 100,
                      {{0, 250, 90}, {1, 40, 1}, {2, 0, 300}}, seed + 5);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{0, 0, 77}, {1, 0, 130}, {2, 5, 1}},
                      seed + 6, true);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0,
                      {{3, 40, 1}, {0, 0, 65}, {1, 90, 1}, {2, 709, 100}}, seed + 7, true);
  }
  CheckF16Attention(false, 32, 8, 128, 0, {{0, 0, 1500}}, 790, true);  // 8-warp blocks
  CheckF16Attention(false, 32, 8, 128, 257, {{2, 100, 1}, {0, 0, 700}, {1, 33, 1}}, 791);
  CheckF16Attention(false, 32, 16, 256, 0, {{0, 3, 600}}, 792);
  CheckF16Attention(false, 32, 16, 224, 0, {{0, 0, 300}, {1, 50, 1}}, 793, true);
}

// Soft-capped scores over fp16 pages, in both modes: decodes, one across splits, prompt pieces,
// keys from RopeKv, a window.
TEST(CudaAttentionTest, F16PagesSoftcap) {
  GZ_SKIP_WITHOUT_CUDA();
  for (bool exact : {true, false}) {
    for (auto [heads, kv_heads, head_dim] :
         {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{8, 4, 256}}) {
      uint32_t seed = 800 + head_dim + (exact ? 0 : 1000);
      CheckF16Attention(exact, heads, kv_heads, head_dim, 0, {{0, 700, 1}, {3, 5, 1}, {1, 0, 1}},
                        seed, false, /*softcap=*/3.0f);
      CheckF16Attention(exact, heads, kv_heads, head_dim, 0, {{0, 5000, 1}}, seed + 1, false, 3.0f);
      CheckF16Attention(exact, heads, kv_heads, head_dim, 0, {{0, 90, 1}, {1, 10, 70}, {2, 0, 300}},
                        seed + 2, false, 3.0f);
      CheckF16Attention(exact, heads, kv_heads, head_dim, 0, {{0, 0, 300}, {1, 5, 1}}, seed + 3,
                        true, 3.0f);
      CheckF16Attention(exact, heads, kv_heads, head_dim, 100, {{0, 250, 90}, {1, 40, 1}}, seed + 4,
                        false, 3.0f);
    }
  }
}

// The CUDA backend takes float32, fp16 and rotated pages (cuda_kv_codes_test.cc), not the
// unrotated q8 ones: Model::Load refuses those.
// The tensor-core decode kernel (fast mode, fp16 pages): rows alone in their sequence at
// positions on and off page edges, a long context across splits, 200 rows (no split), windows,
// soft-capped scores, groups of 1 to 16 query heads per kv head (two n8 tiles above 8) and every
// head_dim, beside prompt pieces in the same step.
TEST(CudaAttentionTest, F16PagesFastDecode) {
  GZ_SKIP_WITHOUT_CUDA();
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{32, 8, 128}, std::tuple{28, 4, 128}, std::tuple{16, 16, 128},
        std::tuple{16, 2, 128}, std::tuple{24, 2, 64}, std::tuple{12, 6, 32},
        std::tuple{16, 2, 96}, std::tuple{8, 1, 256}, std::tuple{8, 4, 160},
        std::tuple{8, 2, 224}, std::tuple{32, 2, 128}}) {
    uint32_t seed = 900 + head_dim + heads;
    CheckF16Attention(false, heads, kv_heads, head_dim, 0,
                      {{0, 0, 1}, {1, 15, 1}, {2, 16, 1}, {3, 17, 1}, {4, 700, 1}, {5, 63, 1}},
                      seed);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{0, 5000, 1}}, seed + 1);
    CheckF16Attention(false, heads, kv_heads, head_dim, 100, {{0, 250, 1}, {1, 40, 1}, {2, 116, 1}},
                      seed + 2);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0, {{0, 3000, 1}, {1, 9, 1}}, seed + 3,
                      false, 3.0f);
    CheckF16Attention(false, heads, kv_heads, head_dim, 0,
                      {{0, 90, 1}, {1, 10, 70}, {2, 400, 1}, {3, 33, 1}}, seed + 4, true);
  }
  std::vector<Piece> many;
  for (int32_t i = 0; i < 200; ++i) many.push_back({i, (i * 37) % 1100, 1});
  CheckF16Attention(false, 32, 8, 128, 0, many, 990);
}

TEST(CudaAttentionTest, PageFormats) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  EXPECT_TRUE(backend->SupportsKvFormat(KvFormat::kF32));
  EXPECT_TRUE(backend->SupportsKvFormat(KvFormat::kF16));
  EXPECT_FALSE(backend->SupportsKvFormat(KvFormat::kQ8));
  EXPECT_EQ(backend->DefaultKvFormat(), KvFormat::kF16);
  EXPECT_EQ(MakeBackend(true)->DefaultKvFormat(), KvFormat::kF32);
  // `--kv` on this backend: 32, 16, 8, 4 and 2 bits; pages that mix floats and codes refused,
  // the message naming the flag.
  EXPECT_EQ(*ChooseKvFormat("auto", *backend), KvFormat::kF16);
  EXPECT_EQ(*ChooseKvFormat("16", *backend), KvFormat::kF16);
  EXPECT_EQ(*ChooseKvFormat("f32", *backend), KvFormat::kF32);
  EXPECT_EQ(*ChooseKvFormat("4", *backend), RotatedKv(4, 4));
  for (const char* text : {"16/8", "32/16"}) {
    auto format = ChooseKvFormat(text, *backend);
    ASSERT_FALSE(format.ok()) << text;
    EXPECT_EQ(format.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(format.status().message().find("--kv " + std::string(text) + ": "),
              std::string::npos);
    EXPECT_NE(format.status().message().find("do not mix floats and codes"), std::string::npos)
        << format.status().message();
  }
}

TEST(CudaAttentionTest, ShapesWithoutKernelFailWithStatus) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  EXPECT_TRUE(backend->CheckAttentionShape(4, 2, 32).ok());
  EXPECT_TRUE(backend->CheckAttentionShape(32, 8, 128).ok());
  EXPECT_TRUE(backend->CheckAttentionShape(16, 4, 96).ok());
  EXPECT_TRUE(backend->CheckAttentionShape(8, 8, 256).ok());
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{4, 2, 48}, std::tuple{4, 2, 288}, std::tuple{4, 2, 16}, std::tuple{6, 4, 64},
        std::tuple{128, 1, 64}}) {
    Status s = backend->CheckAttentionShape(heads, kv_heads, head_dim);
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << heads << " " << kv_heads << " " << head_dim;
    EXPECT_NE(s.message().find("head_dim " + std::to_string(head_dim)), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace gizllm::testing
