// Pacing of drafts: a step of more rows costs more, and a draft pays only when it is kept often
// enough to make up for its row. The pacer keeps the measured time of steps per row count (the
// lowest measurement, grown slowly since) and the drafts' acceptance, and picks the number of
// drafts per sequence that maximizes the expected tokens per second of the step (zero where
// drafting does not beat not drafting by 5%). A model with a drafting layer (MTP) under `--draft
// auto` has a second drafter beside it, lookup (AddLookup): each step weighs both, each with its
// own acceptance, and drafts with the one that promises more.
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
  // kMaxProbeAfter. A drafter judged without drafts (JudgedWithoutDrafts) is never probed. A step
  // of a row count never measured carries no drafts, so that it is measured without them. With two
  // drafters (AddLookup) each is weighed with its own acceptance and run time, and probes take
  // turns between them; drafter() says which the last Choose picked.
  int32_t Choose(int64_t rows, int64_t decodes, int64_t candidates);
  // Whether the last Choose was a probe: then at most kProbeSequences of the candidates draft
  // (one draft each), so that at many sequences, where drafts rarely pay, a probe's step
  // costs little more than one without drafts.
  bool probing() const { return probing_; }

  // A step of `rows` rows took `ms` (the runner's wall clock).
  void RecordStep(int64_t rows, double ms);
  // Drafts made by a run of their own (MTP): the run for `sequences` drafting sequences took
  // `ms`. Choose adds the run's time to a drafted step's: measured at the nearest count (as
  // StepMs interpolates; above every measured count, at least a plain step of the rows), before
  // any measurement a plain step of the rows without drafts (an
  // MTP run reads a layer and the head again per chained draft, and on small models costs about
  // a step); set by SetDraftRuns. Drafts made without a run (lookup) add nothing.
  void SetDraftRuns(bool runs) { runs_ = runs; }
  // Adds lookup as drafter kLookup beside drafter 0 (the one SetDraftRuns describes): lookup
  // drafts need no run, so where both are kept alike lookup costs less.
  void AddLookup() { drafters_ = 2; }
  static constexpr int32_t kLookup = 1;
  // The drafter the last Choose picked: 0, or kLookup.
  int32_t drafter() const { return drafter_; }
  // `drafter`'s drafts are judged without being read (lookup's against the tokens that come,
  // RecordJudged as for read ones), so probes never draft with it.
  void JudgedWithoutDrafts(int32_t drafter) {
    if (drafter >= 0 && drafter < 2) shadowed_[drafter] = true;
  }
  void RecordDraftRun(int64_t sequences, double ms);
  // The drafts judged in a step, all its sequences': `accepted` kept, `rejected` refused (a
  // sequence's drafts after a refused one are not judged), made by `drafter`. Each call is one
  // step of that drafter's decay.
  void RecordJudged(int64_t accepted, int64_t rejected, int32_t drafter = 0);

  // Whether drafts of `drafter` could pay at all in a step of `rows` rows, each of them a
  // generating sequence drafting max_drafts, every draft kept: Choose's weighing at acceptance 1.
  // A row count not measured yet could.
  bool CouldPay(int64_t rows, int32_t drafter) const;

  // The estimated chance that a draft of `drafter` is kept, given the one before it was.
  double acceptance(int32_t drafter = 0) const;
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
  int64_t run_most_ = 0;        // the most sequences of a measured run
  double growth_ = 1.0;
  int32_t drafters_ = 1;
  int32_t drafter_ = 0;
  double accepted_[2] = {0.0, 0.0};  // decayed counts of judged drafts (from a prior), by drafter
  double judged_[2] = {0.0, 0.0};
  int64_t idle_ = 0;  // steps with candidates and no drafts since the last drafts
  int64_t probe_after_ = kProbeAfter;
  int64_t probes_ = 0;  // the drafter the next probe tries first
  bool shadowed_[2] = {false, false};
  bool probing_ = false;
};

}  // namespace gizllm
