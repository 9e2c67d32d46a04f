// The start of a JSON value's text, for error messages about files and requests a user gives.
// Header-only: its includers link nlohmann-json.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace gizllm {

namespace internal {

// Levels of nesting shown; deeper arrays and objects read [...] and {...}.
constexpr int kJsonExcerptDepth = 8;

// Appends `j` as dump() writes it until `out` holds `limit` characters.
template <class Json>
void AppendJsonExcerpt(const Json& j, int depth, size_t limit, std::string* out) {
  if (out->size() >= limit) return;
  if (!j.is_array() && !j.is_object()) {
    *out += j.dump();
    return;
  }
  if (depth >= kJsonExcerptDepth) {
    *out += j.is_array() ? "[...]" : "{...}";
    return;
  }
  *out += j.is_array() ? '[' : '{';
  bool first = true;
  for (auto it = j.begin(); it != j.end() && out->size() < limit; ++it) {
    if (!first) *out += ',';
    first = false;
    if (j.is_object()) *out += Json(it.key()).dump() + ":";
    AppendJsonExcerpt(*it, depth + 1, limit, out);
  }
  *out += j.is_array() ? ']' : '}';
}

}  // namespace internal

// `j` as dump() writes it, cut to `limit` characters ("..." at the end when cut) and to a few
// levels of nesting. dump() itself recurses once per level: a value nested a million deep (a
// few megabytes of a hostile file) overflows the stack.
template <class Json>
std::string JsonExcerpt(const Json& j, size_t limit = 60) {
  std::string out;
  internal::AppendJsonExcerpt(j, /*depth=*/0, limit + 1, &out);
  if (out.size() > limit) out = out.substr(0, limit - 3) + "...";
  return out;
}

}  // namespace gizllm
