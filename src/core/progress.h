// Progress of long work (conversion, benchmarks, evaluation) on one line of a stream: redrawn in
// place on a terminal; elsewhere (a log file, a pipe) printed as whole lines at each tenth of the
// work and at the end, so that a log holds eleven lines at most instead of one per step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gizllm {

class ProgressLine {
 public:
  // terminal: whether `out` is a terminal (detected with isatty in the one-argument form).
  explicit ProgressLine(std::FILE* out);
  ProgressLine(std::FILE* out, bool terminal);

  // "[#####.....] text" for `done` of `total`; the line ends when done reaches total.
  void Update(int64_t done, int64_t total, const std::string& text);

 private:
  std::FILE* out_;
  bool terminal_;
  int64_t printed_tenths_ = -1;  // the last tenth printed where the stream is not a terminal
  bool ended_ = false;
};

}  // namespace gizllm
