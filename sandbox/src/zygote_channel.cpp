// The zygote's control-socket protocol on the supervisor's side (Zygote in kz/sandbox/process.h):
// sending spawn and reap requests with descriptors (SCM_RIGHTS), filing the zygote's answers and
// its children's exits, and the Zygote class itself (start, spawn, liveness). Apart from
// process.cpp because the protocol is message passing with its own locking; the child a zygote
// forks is set up by the same sandbox steps (sandbox_plan.h) as one Process::spawn forks.
#include "zygote_channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace kz {

using detail::Clock;
using detail::Fd;
using detail::remaining_ms;

bool Zygote::Channel::send(const nlohmann::json& message, const std::vector<int>& fds) {
  if (send_once(message, fds)) return true;
  int error = errno;
  std::lock_guard lock(mutex);
  dead = true;
  errno = error;
  return false;
}

bool Zygote::Channel::send_once(const nlohmann::json& message, const std::vector<int>& fds) {
  std::string text = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  iovec iov{text.data(), text.size()};
  msghdr header{};
  header.msg_iov = &iov;
  header.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    header.msg_control = control.data();
    header.msg_controllen = control.size();
    cmsghdr* rights = CMSG_FIRSTHDR(&header);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(rights), fds.data(), sizeof(int) * fds.size());
  }
  // A zygote that stopped reading (stopped, hung) must not hang us: a few seconds, then it is gone.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    ssize_t n = ::sendmsg(socket.get(), &header, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n == static_cast<ssize_t>(text.size());
    if (errno == EINTR) continue;
    pollfd writable{socket.get(), POLLOUT, 0};
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || ::poll(&writable, 1, remaining_ms(deadline)) <= 0) return false;
  }
}

void Zygote::Channel::pump() {
  while (!dead) {
    char buf[64 * 1024];
    ssize_t n = ::recv(socket.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      dead = true;
      return;
    }
    auto message = nlohmann::json::parse(std::string_view(buf, static_cast<size_t>(n)), nullptr, false);
    std::string op = message.is_object() ? message.value("op", "") : "";
    if (op == "exited" && message.contains("pid")) {
      Exit exit;
      if (message["exit_code"].is_number_integer()) {
        exit.info.exited = true;
        exit.info.exit_code = message["exit_code"].get<int>();
      }
      if (message["signal"].is_number_integer()) exit.info.term_signal = message["signal"].get<int>();
      exit.cpu_s = message.value("cpu_s", -1.0);
      exits[message["pid"].get<pid_t>()] = exit;
    } else if (op == "spawned" || op == "spawn_failed") {
      // A pid the zygote hands out again: an exit filed under it is an earlier child's.
      if (message.contains("pid") && message["pid"].is_number_integer()) exits.erase(message["pid"].get<pid_t>());
      reply = std::move(message);
    } else {
      dead = true;  // not the protocol: trust nothing more from it
    }
  }
}

template <typename Done>
bool Zygote::Channel::wait_until(Done done, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(mutex);
      pump();
      if (done()) return true;
      if (dead) return false;
    }
    int left = remaining_ms(deadline);
    if (left <= 0) return false;
    pollfd readable{socket.get(), POLLIN, 0};
    ::poll(&readable, 1, std::min(left, 50));
  }
}

Result<nlohmann::json> Zygote::Channel::spawn(const nlohmann::json& request, const std::vector<int>& fds,
                                              std::chrono::milliseconds timeout) {
  std::lock_guard one_at_a_time(spawn_mutex);
  {
    std::lock_guard lock(mutex);
    reply.reset();
    if (dead) return io_error("the zygote is gone");
  }
  if (!send(request, fds)) return io_error(fmt::format("the zygote is gone: {}", std::strerror(errno)));
  if (!wait_until([&] { return reply.has_value(); }, timeout)) {
    std::lock_guard lock(mutex);
    bool silent = !dead;
    dead = true;  // a late answer would be taken for the next request's
    return io_error(silent ? fmt::format("the zygote did not answer within {} ms", timeout.count())
                              : std::string("the zygote is gone"));
  }
  std::lock_guard lock(mutex);
  return std::move(*reply);
}

std::optional<Zygote::Channel::Exit> Zygote::Channel::exit_of(pid_t pid, std::chrono::milliseconds timeout) {
  std::optional<Exit> found;
  wait_until([&] {
    if (auto it = exits.find(pid); it != exits.end()) found = it->second;
    return found.has_value();
  }, timeout);
  return found;
}

bool Zygote::Channel::is_dead() {
  std::lock_guard lock(mutex);
  pump();
  return dead;
}

void Zygote::Channel::reap(pid_t pid) {
  {
    std::lock_guard lock(mutex);
    exits.erase(pid);
    if (dead) return;
  }
  send({{"op", "reap"}, {"pid", pid}}, {});  // where it does not read, the next kill need not wait on it
}

Zygote::Zygote(Process process, std::shared_ptr<Channel> channel)
    : process_(std::move(process)), channel_(std::move(channel)) {}

Zygote::~Zygote() {
  std::lock_guard lock(channel_->mutex);
  channel_->dead = true;
  // EOF: the zygote exits (~Process kills it if it does not). The descriptor itself stays open
  // until the last Process of this zygote is gone: another thread may be polling it.
  ::shutdown(channel_->socket.get(), SHUT_RDWR);
}

Result<std::shared_ptr<Zygote>> Zygote::start(ProcessSpec spec) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    return io_error(fmt::format("starting a zygote: socketpair: {}", std::strerror(errno)));
  Fd ours(pair[0]), theirs(pair[1]);
  spec.control_fd = theirs.get();
  spec.message_pipe = true;
  spec.defer_stdin = true;  // its stdin stays open and empty: it reads nothing there
  auto process = Process::spawn(spec);
  if (!process.ok()) return process.status().with_context("starting a zygote");
  auto channel = std::make_shared<Channel>();
  channel->socket = std::move(ours);
  return std::shared_ptr<Zygote>(new Zygote(std::move(*process), std::move(channel)));
}

Result<Process> Zygote::spawn(const ProcessSpec& spec, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(process_mutex_);
    (void)process_.wait_for(std::chrono::milliseconds(1));  // takes what it wrote on stderr meanwhile
  }
  auto process = Process::spawn_via(spec, this, timeout);
  if (!process.ok() && !alive()) {  // silent or gone: no later spawn waits on it
    std::lock_guard lock(process_mutex_);
    process_.kill_and_reap();
  }
  return process;
}

bool Zygote::alive() {
  if (channel_->is_dead()) return false;
  std::lock_guard lock(process_mutex_);
  return !process_.wait_for(std::chrono::milliseconds(1));
}

pid_t Zygote::pid() const { return process_.pid(); }

std::string Zygote::stderr_tail() const {
  std::lock_guard lock(process_mutex_);
  return process_.stderr_tail();
}

}  // namespace kz
