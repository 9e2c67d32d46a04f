#include "engine/kv_sizing.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "engine/page_pool.h"

namespace gizllm {
namespace {
constexpr int64_t kGiB = int64_t{1} << 30;

std::string Gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return text;
}
}  // namespace

int64_t KvReserveBytes(int64_t total) { return std::max(kGiB, total / 20); }

int64_t DefaultKvBudget(DeviceKind kind, const DeviceMemory& memory) {
  const bool known = memory.total > 0 && memory.free > 0;
  const int64_t left = known ? std::max<int64_t>(0, memory.free - KvReserveBytes(memory.total)) : 0;
  if (kind == DeviceKind::kCuda) return left;
  return std::clamp(left / 4, kCpuKvBudgetFloor, kCpuKvBudgetCap);
}

int64_t KvBudgetFor(std::span<const CacheSpec> caches, int64_t page_bytes, int32_t slots,
                    int64_t blocks, int64_t rows) {
  const KvPaging paging = KvPagingOf(caches);
  if (!paging.enabled()) return slots * blocks * page_bytes;
  const int64_t window_blocks = std::min<int64_t>(blocks, WindowBlocks(paging.window, rows));
  return slots * (blocks + paging.window_groups * window_blocks) * paging.page_bytes;
}

int64_t StepRows(DeviceKind kind, int32_t slots, int64_t requested) {
  if (requested > 0) return std::max<int64_t>(requested, slots);
  if (kind == DeviceKind::kCuda) return std::max<int64_t>(slots + kGpuPromptRows, kGpuIdleRows);
  return std::max<int64_t>(kCpuStepRows, slots);
}

int64_t BusyStepRows(DeviceKind kind, int32_t slots, int64_t requested) {
  if (requested > 0) return std::max<int64_t>(requested, slots);
  if (kind == DeviceKind::kCuda) return slots + kGpuPromptRows;
  return std::max<int64_t>(kCpuStepRows, slots);
}

Expected<ServeSize> SizeServe(DeviceKind kind, const DeviceMemory& memory, int64_t page_bytes,
                              int64_t model_context, const ServeAsk& ask) {
  if (page_bytes <= 0) return InvalidArgument("SizeServe: page_bytes must be positive");
  const bool gpu = kind == DeviceKind::kCuda;
  ServeSize size;
  size.kv_budget_bytes =
      ask.kv_budget_bytes > 0 ? ask.kv_budget_bytes : DefaultKvBudget(kind, memory);
  size.positions = size.kv_budget_bytes / page_bytes * kPage;
  if (ask.context > 0) {
    size.context = ask.context;
  } else {
    size.context = gpu ? kMaxGpuContext : kMaxCpuContext;
    if (model_context > 0) size.context = std::min(size.context, model_context);
    size.context = std::min(size.context, size.positions);
  }
  if (size.context < 2) {
    std::string why = ask.kv_budget_bytes > 0
                          ? "--kv-mib gives " + Gib(ask.kv_budget_bytes)
                          : "the device has " + Gib(memory.free) + " free of " + Gib(memory.total) +
                                ", less a reserve of " + Gib(KvReserveBytes(memory.total)) +
                                " leaves " + Gib(size.kv_budget_bytes);
    return ResourceExhausted("KV cache: " + why + ", which holds " +
                             std::to_string(size.positions) + " positions at " +
                             std::to_string(page_bytes) + " bytes a page of " +
                             std::to_string(kPage) + "; pass --kv-mib, or a smaller --kv");
  }
  if (ask.slots > 0) {
    size.slots = ask.slots;
  } else {
    const int64_t fit = size.positions / kTypicalChat;
    size.slots =
        static_cast<int32_t>(std::clamp<int64_t>(fit, 1, gpu ? kMaxGpuSlots : kMaxCpuSlots));
  }
  return size;
}

}  // namespace gizllm
