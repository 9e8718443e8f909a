// Status: code names, context chaining and the one-line rendering used in logs and errors.
#include "kz/core/status.h"

namespace kz {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_found: return "not_found";
    case StatusCode::io_error: return "io_error";
    case StatusCode::parse_error: return "parse_error";
    case StatusCode::timeout: return "timeout";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, message_.empty() ? context : context + ": " + message_);
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace kz
