// The HTTP servers of kz (serve-eval, serve-model) on cpp-httplib: bound, tuned and started one way.
// Built only where cpp-httplib is found (target kz_http, KZ_WITH_SERVICE).
#pragma once

#include <httplib.h>

#include <cstddef>
#include <exception>
#include <string>
#include <thread>

#include "kz/core/status.h"

namespace kz {

class HttpServer : public httplib::Server {
 public:
  // Binds host:port (port 0: any free port) with `threads` request threads, refusing bodies over
  // `max_request_bytes`; the bound port, or an error naming host:port.
  Result<int> bind(const std::string& host, int port, int threads, size_t max_request_bytes);
  // Runs the server loop on a new thread and returns once it accepts connections: a stop() that
  // came before the loop started would be missed, and the join after it would hang.
  std::thread serve_in_background();
};

// The message of an exception a route handler threw, for a 500 reply ("unknown exception" when
// it is no std::exception).
std::string exception_message(std::exception_ptr error);

// Writing to a socket whose client left must not kill the process: SIGPIPE ignored process-wide.
void ignore_sigpipe();

}  // namespace kz
