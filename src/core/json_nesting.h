// How deeply JSON text nests arrays and objects, read without parsing it.
//
// Code that walks parsed JSON recursively (dump(), a template's values, schema walkers) needs
// a bound on the nesting, checked once where outside text comes in: a request of 120 KB can
// nest 20,000 levels. nlohmann-json parses and frees deep documents without recursion, but
// what reads them afterwards does recurse.
#pragma once

#include <string_view>

namespace gizllm {

// The nesting allowed in JSON that comes from outside (request bodies, arguments given as
// text, a model's tool calls): far above what clients send, far below what exhausts a stack.
inline constexpr int kMaxJsonNesting = 128;

// The deepest nesting of '[' and '{' in `text`, brackets inside strings not counted; stops
// counting once it passes `stop_after` (then returns stop_after + 1). Text that is not JSON
// gives some number; only valid JSON's count is exact.
int JsonNesting(std::string_view text, int stop_after = kMaxJsonNesting);

// True when `text` nests deeper than kMaxJsonNesting.
inline bool JsonTooDeep(std::string_view text) { return JsonNesting(text) > kMaxJsonNesting; }

}  // namespace gizllm
