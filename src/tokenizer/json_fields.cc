// Typed access to tokenizer.json fields with messages that name the field at fault.
#include "tokenizer/components.h"

namespace gizllm::tok {

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

}  // namespace gizllm::tok
