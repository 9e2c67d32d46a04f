// The CPU's KV write and attention over rotated KV pages (ops/kv_codes.h): the write rotates
// and codes each key and value vector; the attention reads the codes where they lie (no float
// copy of the cache), a task per row and kv head.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/backend.h"

namespace gizllm {

// Rows [r0, r1) of a KvWrite into rotated pages.
void RotatedKvWriteRows(const KvWriteParams& p, int64_t r0, int64_t r1);

// Attention over rotated pages: each query head rotated and scaled once, a score per position
// summed over the key's code groups, step * (q'.c') + mid * sum(q') from its centered codes c'
// (attention_codes.cc), the
// online softmax, the values summed as step-weighted centered codes plus a weighted sum of their
// mids, and the result rotated back.
void RotatedAttention(const AttentionParams& p, ThreadPool* pool);

}  // namespace gizllm
