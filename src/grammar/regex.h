// Regular expressions to GBNF: the syntax that vLLM's guided_regex and JSON Schema's `pattern`
// take (ECMAScript's and Python's common part).
//
// Supported: literals; escapes \. \\ \n \t \r \f \v \0 \xHH \uHHHH and any escaped punctuation;
// the classes \d \D \w \W \s \S; character classes [a-z_] [^"] with ranges, negation and escapes
// inside (\d \w \s among them); `.` (any character but a newline); groups ( ), non-capturing
// (?: ) and named (?P<n> ) (?<n> ) groups; alternation |; the quantifiers * + ? {m} {m,} {m,n}
// {,n} and their lazy forms (*? ..., the same language); ^ at the start and $ at the end.
//
// Refused, with the position in the regex: backreferences (\1, \k<n>), lookaround ((?= (?! (?<=
// (?<!), flags ((?i) ...), word boundaries (\b \B), anchors anywhere but the ends, groups nested
// deeper than kMaxRegexNesting, repetition counts above kMaxRegexRepeat, a quantifier on a
// quantifier (possessive a*+), and malformed text (an unclosed group or class, a bad escape).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace gizllm {

constexpr long kMaxRegexRepeat = 1000;  // the largest count of {m,n}
constexpr int kMaxRegexNesting = 64;    // groups inside groups

// The GBNF (rule `root`) of the texts `regex` matches in full: the output is one match of the
// whole regex, whether or not it is written between ^ and $. Errors read
// "regex: at position 3: a lookaround is not supported" (positions count bytes from 0).
Expected<std::string> RegexToGbnf(std::string_view regex);

// RegexToGbnf, parsed.
Expected<Grammar> RegexGrammar(std::string_view regex);

// For JSON Schema's `pattern`: the body of a rule (no name) for the JSON strings, quotes
// included, whose characters hold a match of `pattern`, searched as JavaScript does (an end
// without its anchor lets any characters come before or after; it uses the rule `char`, one
// character of a JSON string). A character of the pattern is matched as JSON writes it; class
// members JSON must escape are left out of non-negated classes and \s is only the space (a
// subset). `path` names the pattern in messages ("json schema #/p/pattern: pattern ...: ...").
Expected<std::string> JsonStringPatternGbnf(std::string_view pattern, const std::string& path);

}  // namespace gizllm
