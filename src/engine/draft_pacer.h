// Pacing of drafts: a step of more rows costs more, and a draft pays only when it is kept often
// enough to make up for its row. The pacer keeps the measured time of steps per row count (the
// lowest measurement, grown slowly since) and the drafts' acceptance, and picks the number of
// drafts per sequence that maximizes the expected tokens per second of the step (zero where
// drafting does not beat not drafting by 5%).
#pragma once

#include <cstdint>
#include <vector>

namespace gizllm {

class DraftPacer {
 public:
  // Row counts 1 to `max_rows`; at most `max_drafts` drafts a sequence.
  DraftPacer(int64_t max_rows, int32_t max_drafts);

  // Drafts each of `candidates` sequences (those with drafts to offer) carries in a step of
  // `rows` rows without drafts, `decodes` of them generating one token each. A row count not
  // measured yet takes the time interpolated between the measured counts around it, beyond the
  // largest one extrapolated from the two largest, and with one measured count below it that
  // count's time (so it is tried and measured). After `kProbeAfter` steps without drafts one
  // draft is tried (a probe, by at most kProbeSequences sequences), so a changed acceptance is
  // seen; each probe after which drafting still does not pay doubles the wait, up to
  // kMaxProbeAfter. A step of a row count never measured carries no drafts, so that it is
  // measured without them.
  int32_t Choose(int64_t rows, int64_t decodes, int64_t candidates);
  // Whether the last Choose was a probe: then at most kProbeSequences of the candidates draft
  // (one draft each), so that at many sequences, where drafts rarely pay, a probe's step
  // costs little more than one without drafts.
  bool probing() const { return probing_; }

  // A step of `rows` rows took `ms` (the runner's wall clock).
  void RecordStep(int64_t rows, double ms);
  // Drafts made by a run of their own (MTP): the run for `sequences` drafting sequences took
  // `ms`. Choose adds the run's time to a drafted step's: measured at the nearest count (as
  // StepMs interpolates), before any measurement a plain step of the rows without drafts (an
  // MTP run reads a layer and the head again per chained draft, and on small models costs about
  // a step); set by SetDraftRuns. Drafts made without a run (lookup) add nothing.
  void SetDraftRuns(bool runs) { runs_ = runs; }
  void RecordDraftRun(int64_t sequences, double ms);
  // The drafts judged in a step, all its sequences': `accepted` kept, `rejected` refused (a
  // sequence's drafts after a refused one are not judged). Each call is one step of the decay.
  void RecordJudged(int64_t accepted, int64_t rejected);

  // The estimated chance that a draft is kept, given the one before it was.
  double acceptance() const;
  // The estimated time of a step of `rows` rows (Choose says how); 0 when no step was measured.
  double StepMs(int64_t rows) const;
  // The estimated time of the drafting run for `sequences` sequences beside a step of `rows`
  // rows without drafts (RecordDraftRun says how).
  double DraftRunMs(int64_t sequences, int64_t rows) const;
  // Expected tokens a sequence gains from `k` drafts kept with chance `a` each in turn, beyond
  // its one token: a + a^2 + ... + a^k.
  static double ExpectedGain(double a, int32_t k);

  static constexpr int64_t kProbeAfter = 64;
  static constexpr int64_t kMaxProbeAfter = 1024;
  static constexpr int64_t kProbeSequences = 2;

 private:
  int32_t max_drafts_;
  // StepMs in units of growth_ (every count's time grows alike each step; draft_pacer.cc), of
  // `table` (ms_ or run_ms_).
  double StoredMs(const std::vector<double>& table, int64_t rows) const;

  // [max_rows + 1] step time per row count, in units of growth_: its lowest measurement, grown
  // since; 0: none.
  std::vector<double> ms_;
  bool runs_ = false;
  std::vector<double> run_ms_;  // [max_rows + 1] drafting runs by drafting sequences, as ms_
  double growth_ = 1.0;
  double accepted_ = 0.0;  // decayed counts of judged drafts
  double judged_ = 0.0;
  int64_t idle_ = 0;  // steps with candidates and no drafts since the last drafts
  int64_t probe_after_ = kProbeAfter;
  bool probing_ = false;
};

}  // namespace gizllm
