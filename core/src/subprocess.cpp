// Child processes: fork+exec with pipes, a message pipe on fd 3, deadlines and process groups.
//
// Everything the child needs (argv, envp, candidate paths) is prepared before fork(), so the
// child only makes async-signal-safe calls. Exec failures travel back over a CLOEXEC error pipe.
// The parent multiplexes stdin/stdout/stderr/fd 3 and a pidfd (child exit) in one poll loop.
// The child's exit is observed with WNOWAIT and reaped only when the Process is killed or
// destroyed: the zombie keeps its pid (and so the group id) from being reused while we might
// still signal the group.
#include "kz/core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

extern char** environ;

namespace kz {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kHighFd = 10;       // child-side pipe ends live here, clear of the 0..3 targets
constexpr size_t kChunk = 64 * 1024;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);  // no EINTR retry: on Linux the fd is gone either way
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A CLOEXEC pipe whose ends are both >= kHighFd, so dup2() onto 0..3 in the child never
// clobbers another source fd (the parent may have closed its own stdin/stdout).
bool make_pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int& fd : fds) {
    if (fd >= kHighFd) continue;
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, kHighFd);
    ::close(fd);
    fd = high;
  }
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
  return read_end.valid() && write_end.valid();
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// write() that reports EPIPE instead of raising SIGPIPE, without touching process-wide signal
// dispositions: block SIGPIPE in this thread and swallow the one our write generated.
ssize_t write_no_sigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  sigset_t pending;
  sigpending(&pending);
  bool already_pending = sigismember(&pending, SIGPIPE);
  ssize_t n;
  do n = ::write(fd, data, size);
  while (n < 0 && errno == EINTR);
  int err = errno;
  if (n < 0 && err == EPIPE && !already_pending) {
    timespec zero{};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return n;
}

// What the child reports on the error pipe before _exit(127).
struct ChildError {
  int stage;  // index into kStageNames
  int err;
};
constexpr const char* kStageNames[] = {"setpgid", "dup2", "chdir", "exec"};

// Everything the child needs, prepared before fork() (no allocation after it).
struct ChildPlan {
  std::vector<std::string> candidates;  // executable paths to try in order
  std::vector<std::string> argv_store, env_store;
  std::vector<char*> argv, envp;
  std::string cwd;
  bool new_group = false;
  int stdio[4] = {-1, -1, -1, -1};  // sources for fds 0..3 (3 only with a message pipe)
  int error_fd = -1;
};

std::vector<std::string> path_candidates(const ProcessSpec& spec) {
  const std::string& prog = spec.argv[0];
  if (prog.find('/') != std::string::npos) return {prog};
  std::string path;
  if (auto it = spec.env.find("PATH"); it != spec.env.end()) {
    path = it->second;
  } else if (const char* p = ::getenv("PATH")) {
    path = p;
  } else {
    path = "/usr/local/bin:/usr/bin:/bin";
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? end : end - start);
    out.push_back((dir.empty() ? std::string(".") : dir) + "/" + prog);  // "" means cwd
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

[[noreturn]] void child_fail(int error_fd, int stage) {
  ChildError e{stage, errno};
  ssize_t ignored = ::write(error_fd, &e, sizeof e);  // 8 bytes: atomic on a pipe
  (void)ignored;
  ::_exit(127);
}

// Runs in the forked child: async-signal-safe calls only.
[[noreturn]] void child_exec(const ChildPlan& plan) {
  // Signal handlers and ignored signals (e.g. SIGPIPE) must not leak into the child; the parent
  // blocked everything around fork() so no parent handler runs here before this reset.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  if (plan.new_group && ::setpgid(0, 0) != 0) child_fail(plan.error_fd, 0);
  int nstd = plan.stdio[3] >= 0 ? 4 : 3;
  for (int target = 0; target < nstd; ++target) {
    if (::dup2(plan.stdio[target], target) < 0) child_fail(plan.error_fd, 1);
  }
  // Anything else the parent had open (other threads' fds without CLOEXEC) must not reach the
  // program; mark it CLOEXEC rather than closing so the error pipe survives until exec.
  if (::syscall(SYS_close_range, nstd, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */) != 0) {
    rlimit lim{};
    int max_fd = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 65536
                     ? static_cast<int>(lim.rlim_cur)
                     : 65536;
    for (int fd = nstd; fd < max_fd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  if (!plan.cwd.empty() && ::chdir(plan.cwd.c_str()) != 0) child_fail(plan.error_fd, 2);

  // Like execvp: try each PATH entry; remember EACCES so it wins over a later ENOENT.
  int saved = ENOENT;
  for (const std::string& path : plan.candidates) {
    ::execve(path.c_str(), plan.argv.data(), plan.envp.data());
    if (errno == EACCES) saved = EACCES;
    else if (errno != ENOENT && errno != ENOTDIR) saved = errno;
  }
  errno = saved;
  child_fail(plan.error_fd, 3);
}

ExitInfo decode(const siginfo_t& info) {
  ExitInfo e;
  if (info.si_code == CLD_EXITED) {
    e.exited = true;
    e.exit_code = info.si_status;
  } else {
    e.term_signal = info.si_status;
  }
  return e;
}

// Appends to a tail buffer, keeping only its last `cap` bytes.
void append_tail(std::string& tail, const char* data, size_t n, size_t cap) {
  if (n >= cap) {
    tail.assign(data + (n - cap), cap);
    return;
  }
  tail.append(data, n);
  if (tail.size() > cap) tail.erase(0, tail.size() - cap);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

}  // namespace

std::string ExitInfo::describe() const {
  if (exited) return fmt::format("exit code {}", exit_code);
  if (term_signal != 0) {
    const char* name = ::strsignal(term_signal);
    return fmt::format("killed by signal {} ({})", term_signal, name ? name : "unknown");
  }
  return "still running";
}

struct Process::Impl {
  pid_t pid = -1;
  bool group = false;
  Fd pidfd, in, out, err, msg;
  std::string stdin_data;
  size_t stdin_off = 0;
  size_t tail_cap = 0;
  std::string out_tail, err_tail, msg_buf;
  bool has_msg_pipe = false;
  std::optional<ExitInfo> exit;  // observed with WNOWAIT: the child is a zombie until reaped
  bool reaped = false;

  ~Impl() {
    if (pid <= 0) return;
    kill_group(SIGKILL);  // also takes out grandchildren left behind by an exited child
    reap();
  }

  void kill_group(int sig) {
    if (reaped) return;  // the pid may belong to someone else now
    if (group && ::kill(-pid, sig) == 0) return;
    ::kill(pid, sig);
  }

  void reap() {
    if (reaped) return;
    siginfo_t info{};
    int rc;
    do rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED);
    while (rc != 0 && errno == EINTR);
    if (rc == 0 && !exit) exit = decode(info);
    reaped = true;
  }

  // Notes the child's exit without reaping it.
  void check_exit() {
    if (exit) return;
    siginfo_t info{};
    int rc;
    do rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    while (rc != 0 && errno == EINTR);
    if (rc == 0 && info.si_pid == pid) exit = decode(info);
  }

  // Reads once from a readable fd; closes it on EOF or error. Returns bytes read.
  size_t read_some(Fd& fd, std::string& sink, bool is_tail) {
    char buf[kChunk];
    ssize_t n;
    do n = ::read(fd.get(), buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) {
      fd.reset();
      return 0;
    }
    if (is_tail) append_tail(sink, buf, static_cast<size_t>(n), tail_cap);
    else sink.append(buf, static_cast<size_t>(n));
    return static_cast<size_t>(n);
  }

  void write_stdin() {
    while (stdin_off < stdin_data.size()) {
      size_t len = std::min(kChunk, stdin_data.size() - stdin_off);
      ssize_t n = write_no_sigpipe(in.get(), stdin_data.data() + stdin_off, len);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) break;  // EPIPE: the child closed stdin; drop the rest
      stdin_off += static_cast<size_t>(n);
    }
    in.reset();  // all written (or unwritable): the child sees EOF
    stdin_data.clear();
    stdin_data.shrink_to_fit();
  }

  // Waits up to `timeout_ms` for any fd event or the child's exit, and handles what is ready.
  void poll_once(int timeout_ms) {
    pollfd fds[5];
    Fd* owners[5];
    nfds_t n = 0;
    auto add = [&](Fd& fd, short events) {
      if (!fd.valid()) return;
      fds[n] = pollfd{fd.get(), events, 0};
      owners[n++] = &fd;
    };
    add(out, POLLIN);
    add(err, POLLIN);
    add(msg, POLLIN);
    add(in, POLLOUT);
    if (!exit) add(pidfd, POLLIN);
    // Without a pidfd nothing wakes us on exit: poll in short slices and check.
    if (!exit && !pidfd.valid()) timeout_ms = std::min(timeout_ms, 10);
    int rc = ::poll(fds, n, timeout_ms);
    if (rc > 0) {
      for (nfds_t i = 0; i < n; ++i) {
        if (fds[i].revents == 0) continue;
        Fd* fd = owners[i];
        if (fd == &out) read_some(out, out_tail, true);
        else if (fd == &err) read_some(err, err_tail, true);
        else if (fd == &msg) read_some(msg, msg_buf, false);
        else if (fd == &in) write_stdin();
      }
    }
    check_exit();
  }

  // After exit: takes what is already in the pipes without waiting for EOF, since a surviving
  // grandchild may hold them open. Bounded so a chatty grandchild cannot keep us here.
  void drain() {
    for (Fd* fd : {&out, &err, &msg}) {
      for (int i = 0; i < 256 && fd->valid(); ++i) {
        std::string& sink = fd == &out ? out_tail : fd == &err ? err_tail : msg_buf;
        if (read_some(*fd, sink, fd != &msg) == 0) break;
      }
    }
  }

  // Pops the next complete line from msg_buf, or the unterminated rest once the pipe is done.
  bool pop_line(std::string& line, bool pipe_done) {
    size_t nl = msg_buf.find('\n');
    if (nl == std::string::npos) {
      if (!pipe_done || msg_buf.empty()) return false;
      nl = msg_buf.size();
    }
    line.assign(msg_buf, 0, nl);
    msg_buf.erase(0, std::min(nl + 1, msg_buf.size()));
    return true;
  }
};

Process::Process(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Process::Process(Process&&) noexcept = default;
Process& Process::operator=(Process&&) noexcept = default;
Process::~Process() = default;

pid_t Process::pid() const { return impl_->pid; }
const std::string& Process::stdout_tail() const { return impl_->out_tail; }
const std::string& Process::stderr_tail() const { return impl_->err_tail; }
void Process::kill_group(int sig) { impl_->kill_group(sig); }

Result<Process> Process::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return invalid_argument("spawning a process: empty argv");
  const std::string& prog = spec.argv[0];
  auto fail = [&](const char* what) {
    return io_error(fmt::format("spawning {}: {}: {}", prog, what, std::strerror(errno)));
  };

  ChildPlan plan;
  plan.candidates = path_candidates(spec);
  plan.argv_store = spec.argv;
  for (auto& a : plan.argv_store) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  for (const auto& [k, v] : spec.env) plan.env_store.push_back(k + "=" + v);
  for (auto& e : plan.env_store) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  plan.cwd = spec.cwd.string();
  plan.new_group = spec.new_process_group;

  auto impl = std::make_unique<Impl>();
  Fd child_in, child_out, child_err, child_msg, error_r, error_w;
  if (!make_pipe(child_in, impl->in) || !make_pipe(impl->out, child_out) ||
      !make_pipe(impl->err, child_err) || !make_pipe(error_r, error_w) ||
      (spec.message_pipe && !make_pipe(impl->msg, child_msg))) {
    return fail("pipe");
  }
  plan.stdio[0] = child_in.get();
  plan.stdio[1] = child_out.get();
  plan.stdio[2] = child_err.get();
  plan.stdio[3] = child_msg.get();
  plan.error_fd = error_w.get();

  // Block all signals across fork() so no parent handler runs in the child before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) child_exec(plan);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    errno = fork_errno;
    return fail("fork");
  }

  impl->pid = pid;
  impl->group = spec.new_process_group;
  // Also set the group from the parent, so kill_group works even before the child runs
  // (EACCES after the child's exec is harmless: it already did it itself).
  if (spec.new_process_group) ::setpgid(pid, pid);
  error_w.reset();
  child_in.reset();
  child_out.reset();
  child_err.reset();
  child_msg.reset();

  ChildError ce{};
  ssize_t n;
  do n = ::read(error_r.get(), &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof ce)) {
    impl->reap();  // the child already _exit()ed
    impl->pid = -1;
    std::string msg = fmt::format("spawning {}: {}{}: {}", prog, kStageNames[ce.stage],
                                  ce.stage == 2 ? " " + plan.cwd : std::string(),
                                  std::strerror(ce.err));
    return ce.err == ENOENT && ce.stage == 3 ? not_found(std::move(msg)) : io_error(std::move(msg));
  }

  impl->pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));  // -1: slice instead
  impl->has_msg_pipe = spec.message_pipe;
  impl->tail_cap = spec.output_tail_bytes;
  impl->stdin_data = spec.stdin_data;
  for (Fd* fd : {&impl->in, &impl->out, &impl->err, &impl->msg}) {
    if (fd->valid()) set_nonblocking(fd->get());
  }
  if (impl->stdin_data.empty()) impl->in.reset();  // immediate EOF, never the parent's stdin
  return Process(std::move(impl));
}

Process::ReadEvent Process::read_message(std::string& line, std::chrono::milliseconds timeout) {
  Impl& p = *impl_;
  if (!p.has_msg_pipe) return ReadEvent::eof;
  auto deadline = Clock::now() + timeout;
  for (;;) {
    if (p.pop_line(line, !p.msg.valid())) return ReadEvent::line;
    if (!p.msg.valid()) return ReadEvent::eof;
    if (p.exit) {
      // The child is gone; a grandchild might still hold fd 3 open, so don't wait for EOF.
      p.drain();
      if (p.pop_line(line, true)) return ReadEvent::line;
      p.msg.reset();
      return ReadEvent::eof;
    }
    if (Clock::now() >= deadline) return ReadEvent::timeout;
    p.poll_once(remaining_ms(deadline));
  }
}

std::optional<ExitInfo> Process::wait_for(std::chrono::milliseconds timeout) {
  Impl& p = *impl_;
  auto deadline = Clock::now() + timeout;
  for (;;) {
    p.check_exit();
    if (p.exit) {
      p.drain();
      return p.exit;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    p.poll_once(remaining_ms(deadline));
  }
}

ExitInfo Process::kill_and_reap() {
  Impl& p = *impl_;
  p.kill_group(SIGKILL);
  p.reap();
  p.drain();
  return p.exit.value_or(ExitInfo{});
}

Result<RunResult> run_process(const ProcessSpec& spec, std::chrono::milliseconds timeout) {
  Result<Process> proc = Process::spawn(spec);
  if (!proc.ok()) return proc.status();
  RunResult result;
  if (std::optional<ExitInfo> exit = proc->wait_for(timeout)) {
    result.exit = *exit;
  } else {
    result.timed_out = true;
    result.exit = proc->kill_and_reap();
  }
  result.stdout_text = proc->stdout_tail();
  result.stderr_text = proc->stderr_tail();
  return result;  // ~Process kills whatever is left of the group
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace kz
