// Status and Result<T>: the project's one error vocabulary.
//
// Library code never throws across a component boundary and never exits the process: it returns
// a Status (or a Result<T> carrying a value or a Status). Messages carry their context
// ("task 03_gelu: reading suite/kzbench/level1/03_gelu.py: No such file"), added by the caller
// with with_context() as the error travels up.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kz {

enum class StatusCode {
  ok,
  invalid_argument,  // bad user input: flag, config value, malformed file
  not_found,         // a file, task or key that should exist does not
  io_error,          // the OS refused: read/write/spawn failed
  parse_error,       // JSON/TOML/Python-source structure is wrong
  timeout,           // a deadline passed
  internal,          // a bug or broken invariant in KernelZero itself
};

const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns this status with "context: " prepended to the message (ok stays ok).
  Status with_context(const std::string& context) const;
  // "invalid_argument: context: message", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::not_found, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::io_error, std::move(m)}; }
inline Status parse_error(std::string m) { return {StatusCode::parse_error, std::move(m)}; }
inline Status timeout_error(std::string m) { return {StatusCode::timeout, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::internal, std::move(m)}; }

// A value or the Status explaining why there is none. Constructing from an ok Status is a bug.
template <class T>
class Result {
 public:
  Result(T value) : data_(std::move(value)) {}
  Result(Status status) : data_(std::move(status)) {}

  bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // The error; Status::ok() when a value is held.
  Status status() const { return ok() ? Status::ok() : std::get<Status>(data_); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace kz

// Early-return helpers for functions returning Status or Result<T>.
#define KZ_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::kz::Status kz_status_ = (expr);        \
    if (!kz_status_.is_ok()) return kz_status_; \
  } while (0)
