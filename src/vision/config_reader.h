// Reading the fields of a processor's JSON config (preprocessor_config.json,
// video_preprocessor_config.json) with errors that name the file and the field. Internal to
// vision/.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace gizllm::vision {

// What a config field holds, for errors: its JSON, cut short.
inline std::string Shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 40) + "...";
  return s;
}

// Reads fields of one JSON object; a field that is absent or null leaves the value as it is.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, const std::string& file) : json_(json), file_(file) {}

  Status Error(const std::string& field, const std::string& expected, const nlohmann::json& got) {
    return InvalidArgument(file_ + ": " + field + ": expected " + expected + ", got " + Shown(got));
  }

  // A positive integer at `json`[key], when there is one.
  Status PositiveInt(const nlohmann::json& json, const std::string& key, const std::string& field,
                     int64_t max, int64_t* out) {
    const auto it = json.find(key);
    if (it == json.end() || it->is_null()) return Status::Ok();
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > max) {
      return Error(field, "a positive integer of at most " + std::to_string(max), *it);
    }
    *out = it->get<int64_t>();
    return Status::Ok();
  }

  Status Int(const std::string& key, int* out) {
    int64_t v = *out;
    GZ_RETURN_IF_ERROR(PositiveInt(json_, key, key, 1 << 12, &v));
    *out = static_cast<int>(v);
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out) {
    const auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return Status::Ok();
    if (!it->is_boolean()) return Error(key, "true or false", *it);
    *out = it->get<bool>();
    return Status::Ok();
  }

  // One number for every channel, or three.
  Status Channels(const std::string& key, std::array<float, 3>* out) {
    const auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return Status::Ok();
    if (it->is_number()) {
      out->fill(static_cast<float>(it->get<double>()));
      return Status::Ok();
    }
    if (!it->is_array() || it->size() != 3) return Error(key, "3 numbers (R, G, B)", *it);
    for (int c = 0; c < 3; ++c) {
      if (!(*it)[c].is_number()) return Error(key, "3 numbers (R, G, B)", *it);
      (*out)[c] = static_cast<float>((*it)[c].get<double>());
    }
    return Status::Ok();
  }

  const nlohmann::json& json() const { return json_; }

  // A positive number at `key`, when there is one.
  Status PositiveNumber(const std::string& key, double* out) {
    const auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return Status::Ok();
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
      return Error(key, "a positive number", *it);
    }
    *out = it->get<double>();
    return Status::Ok();
  }

 private:
  const nlohmann::json& json_;
  std::string file_;
};

}  // namespace gizllm::vision
