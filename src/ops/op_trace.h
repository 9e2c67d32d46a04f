// Per-op times for profiling (Backend::SetOpTrace, `bench --trace-ops`): each op notes its name
// when it starts; an op's time runs from its start to the next op's start, or to the end of the
// trace. Ops that call other ops count once (only the outermost notes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gizllm {

struct OpTime {
  std::string op;
  int64_t calls = 0;
  double ms = 0.0;
};

// Totals per op name, in the order the names first came.
class OpTotals {
 public:
  void Add(const char* op, double ms) {
    for (OpTime& t : totals_) {
      if (t.op == op) {
        ++t.calls;
        t.ms += ms;
        return;
      }
    }
    totals_.push_back({op, 1, ms});
  }
  std::vector<OpTime> Take() {
    std::vector<OpTime> out;
    out.swap(totals_);
    return out;
  }

 private:
  std::vector<OpTime> totals_;
};

// The outermost op of a call chain: `depth` counts the ops entered and not yet left.
class OpScope {
 public:
  explicit OpScope(int* depth) : depth_(depth) { ++*depth_; }
  ~OpScope() { --*depth_; }
  bool outermost() const { return *depth_ == 1; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  int* depth_;
};

}  // namespace gizllm
