// Reading JSON lines of texts from a stream and writing floats, for embed and rerank.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/status.h"

namespace gizllm::cli {

// Calls fn with the text of each line of `in` (a JSON string); empty lines are skipped. An error
// names the line: one that is not a JSON string, or fn's.
inline Status ForEachTextLine(std::istream& in,
                              const std::function<Status(const std::string&)>& fn) {
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "stdin line " + std::to_string(number);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) {
      return InvalidArgument(where + ": expected a JSON string");
    }
    if (Status s = fn(j.get_ref<const std::string&>()); !s.ok()) return s.Annotate(where);
  }
  return Status::Ok();
}

// A text that reads back as the same float ("%.9g"); JSON has no NaN or infinity, so
// those print as null.
inline std::string FormatFloat(float f) {
  if (!std::isfinite(f)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(f));
  return buf;
}

// "[f0,f1,...]\n".
inline void AppendFloats(std::span<const float> v, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out->push_back(',');
    *out += FormatFloat(v[i]);
  }
  out->append("]\n");
}

}  // namespace gizllm::cli
