// Lookup drafts: a sequence often repeats what it already holds (code, quotes, lists, a passage
// read again), so the tokens that followed the last earlier occurrence of its latest tokens are a
// guess at what comes next that needs no model.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gizllm {

struct LookupParams {
  int32_t max_ngram = 4;  // longest suffix matched
  int32_t min_ngram = 1;  // shortest suffix matched
};

// Up to `count` drafts in `drafts` (cleared first): the tokens that followed the most recent
// earlier occurrence of the longest suffix of `tokens` (max_ngram down to min_ngram tokens) in
// `tokens` itself; none when no suffix of min_ngram tokens occurs earlier.
void LookupDraft(std::span<const int32_t> tokens, int32_t count, std::vector<int32_t>* drafts,
                 const LookupParams& params = {});

}  // namespace gizllm
