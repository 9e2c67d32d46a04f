#include "engine/draft_pacer.h"

#include <algorithm>

namespace gizllm {
namespace {

// A row count's time is its lowest measurement, and every count's time grows by this factor a
// step until a lower one is measured. The machine's other work only adds time: a count measured
// every step (under load, always high) and one measured now and then (in a quiet moment, low)
// would otherwise make drafting look cheap by chance; growing alike, a count not measured for
// long looks dearer, and a sequence's growing context is followed.
constexpr double kGrowth = 1.001;
// Judged drafts fade by this factor per step that judges any, so the estimate follows the text.
constexpr double kJudgedDecay = 0.95;
// Prior: acceptance 0.3, worth three judged drafts (cautious: where drafts fail, the first
// steps learn it at a small cost; where they are kept, a few steps raise it). It fades with
// the judged drafts: a prior that stayed would hold the estimate of drafts kept 90% of the time
// near 0.75, where three drafts do not pay.
constexpr double kPriorAccepted = 0.9, kPriorJudged = 3.0;
// Drafts must promise this much more than no drafts: measured step times are noisy, and a draft
// that would gain less than the noise costs more often than it pays.
constexpr double kMargin = 1.05;

}  // namespace

DraftPacer::DraftPacer(int64_t max_rows, int32_t max_drafts)
    : max_drafts_(max_drafts),
      ms_(static_cast<size_t>(std::max<int64_t>(max_rows, 1)) + 1, 0.0),
      run_ms_(ms_.size(), 0.0) {
  for (int32_t d = 0; d < 2; ++d) accepted_[d] = kPriorAccepted, judged_[d] = kPriorJudged;
}

void DraftPacer::RecordStep(int64_t rows, double ms) {
  if (rows < 1 || rows >= static_cast<int64_t>(ms_.size()) || ms <= 0.0) return;
  growth_ *= kGrowth;
  if (growth_ > 1e100) {
    for (double& t : ms_) t *= growth_;
    for (double& t : run_ms_) t *= growth_;
    growth_ = 1.0;
  }
  double& t = ms_[rows];  // in units of growth_
  if (t == 0.0 || ms < t * growth_) t = ms / growth_;
}

void DraftPacer::RecordDraftRun(int64_t sequences, double ms) {
  if (sequences < 1 || sequences >= static_cast<int64_t>(run_ms_.size()) || ms <= 0.0) return;
  double& t = run_ms_[sequences];
  if (t == 0.0 || ms < t * growth_) t = ms / growth_;
  run_most_ = std::max(run_most_, sequences);
}

double DraftPacer::DraftRunMs(int64_t sequences, int64_t rows) const {
  if (!runs_) return 0.0;
  const double stored = growth_ * StoredMs(run_ms_, sequences);
  // More sequences than any measured run: at least a plain step of the rows (a run of 2
  // sequences says little of one of 64, whose chained rows grow with them).
  if (stored == 0.0 || sequences > run_most_) return std::max(stored, StepMs(rows));
  return stored;
}

void DraftPacer::RecordJudged(int64_t accepted, int64_t rejected, int32_t drafter) {
  if (accepted + rejected == 0 || drafter < 0 || drafter >= drafters_) return;
  accepted_[drafter] = kJudgedDecay * accepted_[drafter] + static_cast<double>(accepted);
  judged_[drafter] = kJudgedDecay * judged_[drafter] + static_cast<double>(accepted + rejected);
}

double DraftPacer::acceptance(int32_t drafter) const {
  drafter = std::clamp(drafter, 0, drafters_ - 1);
  return accepted_[drafter] / judged_[drafter];
}

double DraftPacer::StepMs(int64_t rows) const { return growth_ * StoredMs(ms_, rows); }

double DraftPacer::StoredMs(const std::vector<double>& table, int64_t rows) const {
  const int64_t n = static_cast<int64_t>(table.size());
  rows = std::clamp<int64_t>(rows, 1, n - 1);
  if (table[rows] > 0.0) return table[rows];
  int64_t below = rows - 1, above = rows + 1;
  while (below >= 1 && table[below] == 0.0) --below;
  while (above < n && table[above] == 0.0) ++above;
  if (below >= 1 && above < n) {
    const double f = static_cast<double>(rows - below) / static_cast<double>(above - below);
    return table[below] + f * (table[above] - table[below]);
  }
  if (below >= 1) {
    // Beyond the largest measured count: the slope of the two largest, where there are two
    // (never below flat); with one, its time (so the count is tried and measured).
    int64_t lower = below - 1;
    while (lower >= 1 && table[lower] == 0.0) --lower;
    if (lower < 1) return table[below];
    const double slope =
        std::max(0.0, (table[below] - table[lower]) / static_cast<double>(below - lower));
    return table[below] + slope * static_cast<double>(rows - below);
  }
  if (above < n) return table[above];
  return 0.0;
}

bool DraftPacer::CouldPay(int64_t rows, int32_t drafter) const {
  const int64_t most = static_cast<int64_t>(ms_.size()) - 1;
  rows = std::clamp<int64_t>(rows, 1, most);
  const int64_t k = std::min<int64_t>(max_drafts_, (most - rows) / rows);
  if (k < 1) return false;
  if (ms_[rows] == 0.0 || ms_[rows + rows * k] == 0.0) return true;
  const double run_ms = drafter == kLookup ? 0.0 : DraftRunMs(rows, rows);
  const double drafted = static_cast<double>(rows * (1 + k)) / (StepMs(rows + rows * k) + run_ms);
  return drafted > kMargin * static_cast<double>(rows) / StepMs(rows);
}

double DraftPacer::ExpectedGain(double a, int32_t k) {
  double gain = 0.0, p = 1.0;
  for (int32_t i = 0; i < k; ++i) gain += (p *= a);
  return gain;
}

int32_t DraftPacer::Choose(int64_t rows, int64_t decodes, int64_t candidates) {
  probing_ = false;
  drafter_ = 0;
  if (candidates <= 0 || max_drafts_ <= 0) return 0;
  const int64_t most = static_cast<int64_t>(ms_.size()) - 1;
  // The step without drafts is measured first: a count never measured would take a larger
  // count's time (drafted steps'), and drafting would look free.
  if (ms_[std::clamp<int64_t>(rows, 1, most)] == 0.0) return 0;
  const double base_ms = StepMs(rows);
  int32_t best = 0;
  double best_rate = kMargin * static_cast<double>(decodes) / base_ms;
  for (int32_t d = 0; d < drafters_; ++d) {
    const double a = acceptance(d);
    // Lookup (the second drafter) needs no run of its own.
    const double run_ms = d == kLookup ? 0.0 : DraftRunMs(candidates, rows);
    for (int32_t k = 1; k <= max_drafts_ && rows + candidates * k <= most; ++k) {
      const double tokens =
          static_cast<double>(decodes) + static_cast<double>(candidates) * ExpectedGain(a, k);
      const double rate = tokens / (StepMs(rows + candidates * k) + run_ms);
      if (rate > best_rate) best_rate = rate, best = k, drafter_ = d;
    }
  }
  if (best > 0) {
    idle_ = 0;
    probe_after_ = kProbeAfter;
  } else if (++idle_ >= probe_after_ && rows + std::min(candidates, kProbeSequences) <= most) {
    // A probe, by the drafters in turn; if drafting still does not pay, the next one waits
    // twice as long.
    idle_ = 0;
    probe_after_ = std::min(2 * probe_after_, kMaxProbeAfter);
    for (int32_t i = 0; i < drafters_; ++i) {
      const int32_t d = static_cast<int32_t>((probes_ + i) % drafters_);
      if (shadowed_[d]) continue;
      best = 1;
      probing_ = true;
      drafter_ = d;
      probes_ = d + 1;
      break;
    }
  }
  return best;
}

}  // namespace gizllm
