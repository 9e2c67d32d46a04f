#include "server/api_error.h"

namespace gizllm::server {

nlohmann::json ApiError::ToJson() const {
  nlohmann::json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  error["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return {{"error", std::move(error)}};
}

ApiError FromStatus(const Status& status, std::string param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
    case StatusCode::kNotFound:
      return BadRequest(status.message(), std::move(param));
    case StatusCode::kResourceExhausted:
      return ApiError{503, status.message(), "server_error", "", "overloaded"};
    default:
      return ApiError{500, status.message(), "server_error", "", "internal_error"};
  }
}

}  // namespace gizllm::server
