// Status and Expected<T>: errors a user can cause travel as values, never as exceptions.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace gizllm {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a bad request or bad input value
  kNotFound,         // a missing file or tensor
  kDataLoss,         // a truncated or corrupt file
  kUnimplemented,    // an unsupported architecture, field or construct
  kResourceExhausted,
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prepends context, e.g. the file name: "model.safetensors: " + message.
  Status Annotate(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}

// A value or the Status that says why there is none.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Expected(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<1>(v_);
  }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gizllm

#define GZ_CONCAT_INNER(a, b) a##b
#define GZ_CONCAT(a, b) GZ_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if it is not ok.
#define GZ_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::gizllm::Status gz_status_ = (expr);         \
    if (!gz_status_.ok()) return gz_status_;      \
  } while (0)

// `GZ_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an Expected or returns its Status.
#define GZ_ASSIGN_OR_RETURN(lhs, expr) \
  GZ_ASSIGN_OR_RETURN_IMPL(GZ_CONCAT(gz_expected_, __LINE__), lhs, expr)
#define GZ_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
