#include "kz/core/http_server.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>

namespace kz {

Result<int> HttpServer::bind(const std::string& host, int port, int threads, size_t max_request_bytes) {
  size_t pool = static_cast<size_t>(std::max(1, threads));
  new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  set_payload_max_length(max_request_bytes);
  int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    return io_error(fmt::format("cannot listen on {}:{} (port in use, or not an address of this machine)", host, port));
  // httplib listens with a backlog of 5, so a burst of new connections (32 clients polling)
  // overflows it and each dropped SYN costs a client a 1 s retransmit. Listening again on the
  // bound socket raises the backlog (Linux).
  ::listen(svr_sock_, SOMAXCONN);
  return bound;
}

std::thread HttpServer::serve_in_background() {
  std::thread loop([this] { listen_after_bind(); });
  for (int i = 0; i < 5000 && !is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return loop;
}

std::string exception_message(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "unknown exception";
}

void ignore_sigpipe() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace kz
