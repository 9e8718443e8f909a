// libtorch reports errors by throwing; the model engine's API returns Result. One bridge for both.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "kz/core/status.h"

namespace kz::model {

// Runs f (which returns a Result or Status) and turns a libtorch or standard exception into an
// internal_error that says what was being done ("loading DIR: ..."), without c10's C++ backtrace.
template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return internal_error(what + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(what + ": " + e.what());
  }
}

}  // namespace kz::model
