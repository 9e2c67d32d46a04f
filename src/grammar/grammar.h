// Grammar: a context-free grammar over bytes, parsed from GBNF (llama.cpp's syntax).
//
//   root   ::= "{" ws pair ("," ws pair)* "}"   # comments run to the end of the line
//   pair   ::= [a-z]+ ":" ws ( "true" | [0-9]{1,3} )
//   ws     ::= [ \t\n]*
//
// Rules hold alternatives of sequences; a sequence holds literals ("..."), character classes
// ([a-z], [^"\\], with escapes \n \t \r \\ \" \] \xHH \uHHHH \UHHHHHHHH), `.` (any character),
// rule names, groups ( ... ), and the postfix operators ? * + {m} {m,} {m,n}. A rule ends at the
// end of its line unless a group is open or the line ends in `|`. The start is the rule `root`.
//
// Characters are Unicode code points; the compiled grammar is over the bytes of their UTF-8, so
// a class of non-ASCII characters becomes a rule of byte sequences (surrogates never match) and a
// matcher (grammar/matcher.h) takes text byte by byte, partial characters included.
//
// Compilation refuses what a matcher could not run in bounded work: rules used but not defined,
// left recursion (a rule that can reach itself before reading a byte), and grammars larger than
// kMaxElements after repetitions are expanded. Errors name the line and the column.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gizllm {

// A set of bytes: 256 bits.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet&) const = default;
};

// One symbol of a sequence.
struct GrammarElement {
  enum Kind : int32_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: an index into sets; kRule: a rule; kEnd: unused
};

struct Grammar {
  // Bounds on what a grammar may expand into (repetitions included).
  static constexpr int64_t kMaxElements = 1 << 22;
  static constexpr int kMaxNesting = 512;

  // The elements of every alternative of every rule, each alternative ended by a kEnd.
  std::vector<GrammarElement> elements;
  // rules[r]: the offsets into `elements` where rule r's alternatives start.
  std::vector<std::vector<int32_t>> rules;
  std::vector<std::string> names;  // [rules] as written, or generated (name_1, ...)
  std::vector<ByteSet> sets;       // byte sets the kBytes elements read
  int32_t root = 0;

  // Long runs of one repeated item (x{m} with m past kCanonicalDepth + 2, as bounded repetitions
  // expand): canonical[e] is the element at e's place in the copy kCanonicalDepth + 1 copies
  // before the run's end, for an element e in an earlier copy of an item that reads at least one
  // byte; in a chain of optional copies (x{0,n}), the element at e's place in the chain's rule
  // that allows kCanonicalDepth + 2 copies, for e in one that allows more. What may follow both
  // agrees on every text of up to kCanonicalDepth bytes and may end at the same places (each
  // copy reads a byte), so a token mask, which looks no further than the longest token, is the
  // same from either: masks key their states by these positions
  // (Matcher::Key, Matcher::Canonical) and the states along a long run share one mask. Empty:
  // every element is its own.
  static constexpr int32_t kCanonicalDepth = 256;
  std::vector<int32_t> canonical;
  int32_t Canonical(int32_t element) const {
    return canonical.empty() ? element : canonical[element];
  }

  // The grammar as GBNF over bytes (for messages and tests).
  std::string ToString() const;
};

// `bytes` as a GBNF string literal (quote and backslash escaped, control bytes as \xHH).
std::string GbnfLiteral(std::string_view bytes);

// Parses GBNF. `name` stands for the text in messages ("grammar:3:14: ...").
Expected<Grammar> ParseGbnf(std::string_view text, const std::string& name = "grammar");

}  // namespace gizllm
