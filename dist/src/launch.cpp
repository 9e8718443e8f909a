// `kz launch` (launch.h): fork/exec per rank, then one wait loop that stops the rest at the first
// failure. Each rank leads its own process group, so stopping it reaches what it started.
#include "kz/dist/launch.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include "kz/sandbox/process.h"
#include "kz/dist/world.h"

namespace kz::dist {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;  // the signal that asked the launcher to stop

extern "C" void on_stop_signal(int sig) { g_interrupted = sig; }

// SIGINT, SIGTERM and SIGHUP interrupt the wait (no SA_RESTART) instead of killing the launcher
// before it could stop its ranks.
void catch_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);
}

struct Rank {
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid's, once it ended
};

// "KEY=VALUE" strings: this process's environment with the rank's world on top.
std::vector<std::string> rank_environment(const World& world) {
  auto env = current_environment();
  for (auto& [key, value] : world_environment(world)) env[key] = value;
  env.insert_or_assign("NCCL_NVLS_ENABLE", std::string(1, '0'));
  std::vector<std::string> out;
  for (auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Everything is prepared before fork: the child only calls async-signal-safe functions.
Result<pid_t> start_rank(const LaunchOptions& options, const World& world) {
  std::vector<std::string> args = options.argv, env = rank_environment(world);
  auto argv = pointers(args), envp = pointers(env);
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return io_error(fmt::format("starting rank {}: fork: {}", world.rank, std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher gone, the rank goes too
    if (::getppid() != launcher) ::_exit(127);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char message[] = "kz launch: cannot exec the rank's command\n";
    (void)!::write(2, message, sizeof message - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a stop right after the fork
  return pid;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string describe_exit(int global_rank, int status) {
  if (WIFEXITED(status)) return fmt::format("rank {} exited with code {}", global_rank, WEXITSTATUS(status));
  return fmt::format("rank {} was killed by signal {} ({})", global_rank, WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
}

// Reaps whichever ranks have ended; returns the index of the first that failed, or -1.
int reap(std::vector<Rank>& ranks, bool block) {
  int failed = -1;
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, block ? 0 : WNOHANG);
    if (pid <= 0) return failed;  // none ended (WNOHANG), no child left, or a signal (EINTR)
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i].pid != pid) continue;
      ranks[i].running = false;
      ranks[i].status = status;
      if (exit_code_of(status) != 0 && failed < 0) failed = static_cast<int>(i);
    }
    block = false;  // after the first, collect the others that ended too, without waiting
  }
}

bool any_running(const std::vector<Rank>& ranks) {
  for (const Rank& r : ranks)
    if (r.running) return true;
  return false;
}

// SIGTERM to every running rank's group, SIGKILL after the grace period.
void stop_all(std::vector<Rank>& ranks, std::chrono::milliseconds grace) {
  for (const Rank& r : ranks)
    if (r.running) ::kill(-r.pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (any_running(ranks) && std::chrono::steady_clock::now() < deadline) {
    reap(ranks, false);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const Rank& r : ranks)
    if (r.running) ::kill(-r.pid, SIGKILL);
  while (any_running(ranks)) reap(ranks, true);
}

}  // namespace

Result<int> free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return io_error(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    int error = errno;
    ::close(fd);
    return io_error(fmt::format("finding a free port: {}", std::strerror(error)));
  }
  ::close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

Result<LaunchReport> launch_local(const LaunchOptions& options) {
  if (options.argv.empty()) return invalid_argument("kz launch: no command to run");
  if (options.nproc < 1 || options.nnodes < 1 || options.node_rank < 0 || options.node_rank >= options.nnodes)
    return invalid_argument(fmt::format("kz launch: --nproc {} / --nnodes {} / --node-rank {} out of range",
                                        options.nproc, options.nnodes, options.node_rank));
  World world;
  world.size = options.nproc * options.nnodes;
  world.local_size = options.nproc;
  world.master_addr = options.master_addr;
  world.master_port = options.master_port;
  if (world.master_port == 0) {
    if (options.nnodes > 1) return invalid_argument("kz launch: several hosts need --master-port");
    auto port = free_port();
    if (!port.ok()) return port.status();
    world.master_port = *port;
  }
  g_interrupted = 0;
  catch_stop_signals();
  LaunchReport report;
  std::vector<Rank> ranks;
  for (int local = 0; local < options.nproc; ++local) {
    world.local_rank = local;
    world.rank = options.node_rank * options.nproc + local;
    auto pid = start_rank(options, world);
    if (!pid.ok()) {
      stop_all(ranks, options.grace);
      return pid.status();
    }
    ranks.push_back({world.rank, *pid, true, 0});
  }
  while (any_running(ranks)) {
    int failed = reap(ranks, true);
    if (failed >= 0) {
      report.failed_rank = ranks[static_cast<size_t>(failed)].global_rank;
      report.failure = describe_exit(report.failed_rank, ranks[static_cast<size_t>(failed)].status);
      break;
    }
    if (g_interrupted) {
      report.failure = fmt::format("kz launch was interrupted by signal {}", static_cast<int>(g_interrupted));
      break;
    }
  }
  stop_all(ranks, options.grace);
  for (const Rank& r : ranks) report.exit_codes.push_back(exit_code_of(r.status));
  return report;
}

}  // namespace kz::dist
