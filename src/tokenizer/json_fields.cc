// Typed access to tokenizer.json fields with messages that name the field at fault.
#include "tokenizer/components.h"

namespace gizllm::tok {

Status CheckSequenceDepth(int depth, const std::string& where) {
  if (depth < kMaxSequenceDepth) return Status::Ok();
  return InvalidArgument("field '" + where + "': Sequences nested more than " +
                         std::to_string(kMaxSequenceDepth) + " deep");
}

std::string TypeOf(const Json& j) {
  if (j.is_object()) {
    auto it = j.find("type");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

Expected<std::string> GetString(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return InvalidArgument("field '" + where + "." + key + "': expected a string");
  }
  return it->get<std::string>();
}

Expected<bool> GetBool(const Json& j, const char* key, const std::string& where, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return InvalidArgument("field '" + where + "." + key + "': expected true or false");
  }
  return it->get<bool>();
}

Status IdBeyondVocab(const std::string& where, std::string_view token, uint64_t id, int64_t entries,
                     int64_t added) {
  return InvalidArgument(
      "field '" + where + "': token '" + std::string(token) + "' has id " + std::to_string(id) +
      ", beyond the " + std::to_string(entries) + " ids of the vocab and " + std::to_string(added) +
      " added tokens (ids must be below " + std::to_string(IdLimit(entries, added)) + ")");
}

}  // namespace gizllm::tok
