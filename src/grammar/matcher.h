// Matcher: where a text is in a grammar, taken byte by byte (a pushdown recognizer in the style of
// llama.cpp's grammar stacks, over bytes).
//
// The state is a set of parse stacks. A stack is a chain of frames, each a position in the
// grammar's elements and the frame below it; the top frame of every stack is at a byte set. Frames
// are interned (a frame with the same position and the same frame below has one id), so equal
// stacks have equal ids, a state is a sorted list of ids that copies and compares cheaply, and
// states repeat where the parse repeats (inside a string, one state per character position of
// the string rule). A rule whose last symbol is a rule returns through its caller (no frame for
// the return), so right recursion such as x* keeps the stacks' depth constant.
//
// Work is bounded: one byte expands at most kMaxWork positions and keeps at most kMaxStacks
// stacks; a grammar ambiguous enough to pass them stops the matcher with an error instead of
// slowing it (left recursion is refused when the grammar is parsed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace gizllm {

struct MatchState {
  std::vector<int32_t> stacks;  // ids of the stacks' top frames, ascending
  bool complete = false;        // the text so far is a whole sentence of the grammar
  bool Dead() const { return stacks.empty() && !complete; }
  bool operator==(const MatchState&) const = default;
};

class Matcher {
 public:
  static constexpr int32_t kMaxStacks = 4096;
  static constexpr int64_t kMaxWork = 1 << 16;

  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Takes one byte; false, with the state unchanged, when the grammar allows no such byte here.
  bool Accept(uint8_t byte);
  // Takes all the bytes or none of them.
  bool Accept(std::string_view bytes);

  // The text so far is a whole sentence: a stop may come here.
  bool Complete() const { return state_.complete; }
  // More bytes may come.
  bool CanContinue() const { return !state_.stacks.empty(); }
  const MatchState& state() const { return state_; }
  const Grammar& grammar() const { return *grammar_; }
  // Not ok once a byte passed kMaxWork or kMaxStacks; the matcher then takes nothing more.
  const Status& status() const { return status_; }

  // For walks over many candidate texts (token masks): `to` = `from` after `byte`, false when
  // `to` is dead. Frames it interns stay until Rollback(Mark()).
  // overflowed(): the last Advance passed the bounds (its `to` is then dead).
  bool Advance(const MatchState& from, uint8_t byte, MatchState* to);
  bool overflowed() const { return overflow_; }
  // Every byte of `bytes` takes `state` to the same next state: Advance reads a byte only through
  // which stacks' top sets hold it, so when each top set holds all of `bytes` or none of them,
  // one byte of `bytes` stands for all (token masks walk a byte class at once).
  bool SameStep(const MatchState& state, const ByteSet& bytes) const;
  size_t Mark() const { return frames_.size(); }
  // A key of `state` (this matcher's) equal across matchers of the same grammar: each stack's
  // grammar positions from top to bottom, the stacks sorted, and the complete flag. canonical:
  // the positions as Grammar::canonical maps them (states whose next kCanonicalDepth bytes go
  // alike share a key).
  std::string Key(const MatchState& state, bool canonical = false) const;
  // `state` with every frame at its Grammar::canonical position, into *out; false (out
  // untouched) where no frame moves. Frames it interns stay until Rollback(Mark()).
  bool Canonical(const MatchState& state, MatchState* out);
  void Rollback(size_t mark);
  // Frames interned (grows with the text; Rollback gives back what walks added).
  size_t frames() const { return frames_.size(); }

 private:
  struct Frame {
    int32_t pos;     // an element of the grammar
    int32_t parent;  // the frame below; -1: none
  };
  int32_t Intern(int32_t pos, int32_t parent);
  void Insert(int32_t id);
  void Rehash(size_t capacity);
  // Adds the stacks that (pos, parent) expands to, through rule references and rule ends.
  bool Close(int32_t pos, int32_t parent, MatchState* to, int64_t* work);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Frame> frames_;
  std::vector<int32_t> table_;  // open addressing over frames_; -1: empty
  MatchState state_;
  MatchState next_;
  std::vector<Frame> pending_;  // Close's work list
  Status status_;
  bool overflow_ = false;
};

}  // namespace gizllm
