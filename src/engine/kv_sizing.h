// How much KV memory an engine takes by default, and how `serve` divides it into slots and
// context: pure functions of the device's memory figures and the model's page size.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "model/runner.h"
#include "ops/backend.h"

namespace gizllm {

// Bytes left free beside the KV pool on a device of `total` bytes: max(1 GiB, 5% of total). They
// hold what is allocated after the pool: the engine's step buffers, scratch that grows in the
// first steps (the attention's split parts, bf16 copies of activations, dequantized weights),
// recorded steps and the libraries' workspaces.
int64_t KvReserveBytes(int64_t total);

// The KV budget when none is given. On a GPU: the memory free once the weights are placed, less
// KvReserveBytes (0 where the figures are unknown or leave nothing). On the CPU, whose memory the
// pool shares with everything else (and which it touches when it is allocated): a quarter of
// that, within [kCpuKvBudgetFloor, kCpuKvBudgetCap] (the floor also where the figures are
// unknown).
inline constexpr int64_t kCpuKvBudgetCap = int64_t{1} << 30;
inline constexpr int64_t kCpuKvBudgetFloor = int64_t{256} << 20;
int64_t DefaultKvBudget(DeviceKind kind, const DeviceMemory& memory);

// The KV budget (EngineOptions::kv_budget_bytes) in which `slots` sequences hold `blocks` blocks
// of kPage positions each while reading up to `rows` rows a step: a page of every attention layer
// (`page_bytes`, Runner::PageBytes) a block, or under window paging (KvPagingOf(caches)) a pool
// page a block and the window layers' pages of the blocks their window still reads.
int64_t KvBudgetFor(std::span<const CacheSpec> caches, int64_t page_bytes, int32_t slots,
                    int64_t blocks, int64_t rows);

// What `serve` was told (0: choose).
struct ServeAsk {
  int32_t slots = 0;
  int64_t context = 0;
  int64_t kv_budget_bytes = 0;
};

// What `serve` runs with.
struct ServeSize {
  int32_t slots = 0;
  int64_t context = 0;
  int64_t kv_budget_bytes = 0;
  int64_t positions = 0;  // the budget's whole pages, in positions
};

// Positions a chat typically holds (prompt, turns and answer): the default slots are the
// positions the budget holds over this, so that that many chats of this size fit at once.
inline constexpr int64_t kTypicalChat = 2048;
// The most slots chosen by default: on a GPU (steps of that many decode rows are still fast),
// and on the CPU (where a step's rows cost in proportion).
inline constexpr int32_t kMaxGpuSlots = 512;
inline constexpr int32_t kMaxCpuSlots = 16;
// The longest context chosen by default (the model's own when shorter): on a GPU a long chat
// takes pages only as it grows; on the CPU long contexts are slow to read.
inline constexpr int64_t kMaxGpuContext = 32768;
inline constexpr int64_t kMaxCpuContext = 4096;

// The most rows one engine step reads (EngineOptions::rows) for `slots` sequences; `requested`
// > 0 is what the user passed (raised to the slots). Each generating sequence takes one row of a
// step and prompt pieces the rows left, so rows equal to the slots would admit a new prompt only
// as fast as sequences finish. On a GPU a step holds a row for every slot plus kGpuPromptRows for
// prompt pieces (a step of 512 prompt rows is compute-bound there, and a prompt split into such
// pieces stalls the generating sequences a few tens of ms at a time); on the CPU, where a row
// costs in proportion, max(kCpuStepRows, slots).
// A step beside no generating sequence (a prompt alone, or prompts only) may read more: on a GPU
// up to kGpuIdleRows (a 1,038-row prompt with a picture took 124.5 ms to its first token in one
// step against 133.6 ms in three on the H200), so StepRows there is the larger of the two and
// BusyStepRows (EngineOptions::busy_rows) the bound beside generating sequences. A `requested`
// count is both.
inline constexpr int64_t kGpuPromptRows = 512;
inline constexpr int64_t kGpuIdleRows = 2048;
inline constexpr int64_t kCpuStepRows = 256;
int64_t StepRows(DeviceKind kind, int32_t slots, int64_t requested);
int64_t BusyStepRows(DeviceKind kind, int32_t slots, int64_t requested);

// Sizes `serve`: the budget (asked, or DefaultKvBudget), the context (asked, or the model's up
// to the kind's cap and to what the budget holds) and the slots (asked, or the budget's
// positions over kTypicalChat, at least 1, at most the kind's cap). model_context 0: unknown.
// A budget that holds no context of at least 2 positions is an error that says which figures
// made it.
Expected<ServeSize> SizeServe(DeviceKind kind, const DeviceMemory& memory, int64_t page_bytes,
                              int64_t model_context, const ServeAsk& ask);

}  // namespace gizllm
