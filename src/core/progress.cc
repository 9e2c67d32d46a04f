#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

namespace gizllm {

ProgressLine::ProgressLine(std::FILE* out) : ProgressLine(out, isatty(fileno(out)) != 0) {}

ProgressLine::ProgressLine(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}

void ProgressLine::Update(int64_t done, int64_t total, const std::string& text) {
  if (ended_) return;
  total = std::max<int64_t>(total, 1);
  done = std::clamp<int64_t>(done, 0, total);
  const bool end = done == total;
  const int64_t tenths = done * 10 / total;
  if (!terminal_ && !end && tenths <= printed_tenths_) return;
  printed_tenths_ = tenths;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(out_, "%s[%s] %s%s", terminal_ ? "\r" : "", bar.c_str(), text.c_str(),
               terminal_ && !end ? "" : "\n");
  std::fflush(out_);
  ended_ = end;
}

}  // namespace gizllm
