#include "engine/lookup_drafter.h"

#include <algorithm>

#include "core/check.h"

namespace gizllm {

void LookupDraft(std::span<const int32_t> tokens, int32_t count, std::vector<int32_t>* drafts,
                 const LookupParams& params) {
  DCHECK(params.min_ngram >= 1 && params.max_ngram >= params.min_ngram);
  drafts->clear();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (count <= 0 || n < params.min_ngram + 1) return;
  // One pass from the end: for each earlier end e (tokens[e] the last of a candidate match,
  // followed by tokens[e + 1]), the length of the common suffix of tokens[0, e] and tokens; the
  // longest wins, the most recent among equals.
  int64_t best_end = -1;
  int32_t best_length = 0;
  for (int64_t e = n - 2; e >= 0; --e) {
    int32_t length = 0;
    while (length < params.max_ngram && e - length >= 0 &&
           tokens[e - length] == tokens[n - 1 - length]) {
      ++length;
    }
    if (length > best_length) {
      best_length = length, best_end = e;
      if (length == params.max_ngram) break;
    }
  }
  if (best_length < params.min_ngram) return;
  const int64_t take = std::min<int64_t>(count, n - 1 - best_end);
  drafts->assign(tokens.begin() + best_end + 1, tokens.begin() + best_end + 1 + take);
}

}  // namespace gizllm
