// Errors as the OpenAI API writes them: {"error": {"message", "type", "param", "code"}} with an
// HTTP status.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace gizllm::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; empty: null
  std::string code;   // a machine-readable reason; empty: null

  nlohmann::json ToJson() const;
};

inline ApiError BadRequest(std::string message, std::string param = "", std::string code = "") {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                  std::move(code)};
}

// The API error for a Status from the layers below (a bad request or an internal failure).
ApiError FromStatus(const Status& status, std::string param = "");

}  // namespace gizllm::server
