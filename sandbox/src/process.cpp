// Child processes: fork+exec with pipes, a message pipe on fd 3, deadlines and process groups.
//
// Everything the child needs (argv, envp, candidate paths) is prepared before fork(), so the
// child only makes async-signal-safe calls. Exec failures travel back over a CLOEXEC error pipe.
// The parent multiplexes stdin/stdout/stderr/fd 3 and a pidfd (child exit) in one poll loop.
// The child's exit is observed with WNOWAIT and reaped only when the Process is killed or
// destroyed: the zombie keeps its pid (and so the group id) from being reused while we might
// still signal the group.
//
// Sandbox steps run in the child between fork and exec, in this order: rlimits, joining the pids
// cgroup, unshare(CLONE_NEWNET), the read-only mount namespace (with a fresh /proc in a PID
// namespace), chdir, dropping capabilities. A child in its own PID namespace is made by
// clone(CLONE_NEWPID) instead of fork(): it is that namespace's first process (pid 1).
// The parent prepares every path (the mount list comes from its own /proc/self/mountinfo, which
// the child's new mount namespace copies). An optional step that fails is reported to the parent
// as a record on the error pipe and skipped; the parent turns the records into SandboxReport.
//
// The parts with a concern of their own live beside this file: the child's side of the sandbox
// (sandbox_plan.cpp), the pids cgroups (cgroups.cpp), the read-only mount list (mounts.cpp), the
// /proc scans (proc_scan.cpp) and the zygote's control socket (zygote_channel.cpp).
#include "kz/sandbox/process.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "cgroups.h"
#include "fd.h"
#include "mounts.h"
#include "proc_scan.h"
#include "sandbox_plan.h"
#include "zygote_channel.h"

extern char** environ;

namespace kz {

using namespace detail;  // Fd, the /proc scans, the cgroups and the mount list: fd.h, proc_scan.h, cgroups.h, mounts.h

namespace {

constexpr int kHighFd = 10;       // child-side pipe ends live here, clear of the 0..3 targets
constexpr size_t kChunk = 64 * 1024;

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

using namespace sandbox_plan;  // ChildRecord, Stage, Step, Plan: the child's side (sandbox_plan.h)

constexpr const char* kStageNames[] = {"setpgid", "dup2", "chdir", "exec", "setrlimit",
                                       "making its mount namespace and mounting /proc"};

// Everything an exec'd child needs, prepared before fork() (no allocation after it).
struct ChildPlan {
  std::vector<std::string> candidates;  // executable paths to try in order
  std::vector<std::string> argv_store, env_store;
  std::vector<char*> argv, envp;
  int stdio[5] = {-1, -1, -1, -1, -1};  // sources for fds 0..4 (3 only with a message pipe, 4 with a control fd)
  int error_fd = -1;
  Plan sandbox;
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

  int nstd = plan.stdio[4] >= 0 ? 5 : plan.stdio[3] >= 0 ? 4 : 3;
  for (int target = 0; target < nstd; ++target) {
    if (::dup2(plan.stdio[target], target) < 0) child_fail(plan.error_fd, kStageDup2);
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
  apply_sandbox_plan(plan.sandbox, plan.error_fd);

  // Like execvp: try each PATH entry; remember EACCES so it wins over a later ENOENT.
  int saved = ENOENT;
  for (const std::string& path : plan.candidates) {
    ::execve(path.c_str(), plan.argv.data(), plan.envp.data());
    if (errno == EACCES) saved = EACCES;
    else if (errno != ENOENT && errno != ENOTDIR) saved = errno;
  }
  errno = saved;
  child_fail(plan.error_fd, kStageExec);
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

bool poll_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// ---- sandbox helpers (parent side) -------------------------------------------------------------

constexpr auto kCapPollInterval = std::chrono::milliseconds(200);
// How long kill_and_reap waits for the rest of a killed group (a process stuck in the kernel, in
// D state, may not end in any time: the caller then goes on).
constexpr auto kGroupEndWait = std::chrono::seconds(2);

const char* step_name(int32_t step) {
  switch (step) {
    case kStepCgroup: return "joining the pids cgroup";
    case kStepNetns: return "unshare(CLONE_NEWNET)";
    case kStepMountns: return "unshare(CLONE_NEWNS)";
    case kStepMountPrivate: return "making mounts private";
    case kStepBind: return "bind-mounting a writable path";
    case kStepRemount: return "remounting read-only";
    case kStepCaps: return "dropping capabilities";
    case kStepNoNewPrivs: return "PR_SET_NO_NEW_PRIVS";
    case kStepTmpfs: return "mounting a fresh tmpfs";
    case kStepSyscallFilter: return "installing the seccomp filter";
    default: return "sandbox step";
  }
}

}  // namespace

std::vector<std::string> missing_isolation(const ProcessSpec& spec, const SandboxReport& report) {
  std::vector<std::string> missing;
  if (spec.new_network_namespace && !report.network_isolated) missing.push_back("its own network namespace");
  if (spec.read_only_filesystem && !report.filesystem_read_only) missing.push_back("a read-only filesystem");
  if (spec.drop_capabilities && !report.capabilities_dropped) missing.push_back("no capabilities");
  if (spec.new_pid_namespace && spec.read_only_filesystem && !report.pids_isolated)
    missing.push_back("its own PID namespace");
  if (spec.syscall_filter && !report.syscalls_filtered) missing.push_back("its syscall filter");
  if (spec.read_only_filesystem && !spec.fresh_tmpfs.empty() && !report.tmpfs_private)
    for (const auto& tmpfs : spec.fresh_tmpfs) missing.push_back("its own tmpfs at " + tmpfs.path.string());
  return missing;
}

std::string ExitInfo::describe() const {
  if (exited) return fmt::format("exit code {}", exit_code);
  if (term_signal != 0) {
    const char* name = ::strsignal(term_signal);
    return fmt::format("killed by signal {} ({})", term_signal, name ? name : "unknown");
  }
  return "still running";
}

namespace {

// Has the zygote fork the child `plan` describes, handing it the plan's descriptors; its pid. The
// zygote makes the PID namespace itself; where it cannot, `pid_namespace_error` says why and the
// plan says none.
Result<pid_t> zygote_fork(Zygote::Channel& channel, ChildPlan& plan, const std::map<std::string, std::string>& env,
                          std::string& pid_namespace_error, std::chrono::milliseconds timeout) {
  std::vector<std::string> names;
  std::vector<int> fds;
  const char* stdio_names[] = {"stdin", "stdout", "stderr", "message", "control"};
  for (int i = 0; i < 5; ++i) {
    if (plan.stdio[i] < 0) continue;
    names.push_back(stdio_names[i]);
    fds.push_back(plan.stdio[i]);
  }
  names.push_back("error");
  fds.push_back(plan.error_fd);
  nlohmann::json request = {{"op", "spawn"}, {"plan", to_json(plan.sandbox)}, {"env", env}, {"fds", names}};
  auto reply = channel.spawn(request, fds, timeout);
  if (!reply.ok()) return reply.status();
  if (reply->value("op", "") != "spawned" || !(*reply)["pid"].is_number_integer())
    return io_error(fmt::format("the zygote could not fork it: {}", reply->value("error", reply->dump())));
  if (reply->contains("pid_namespace_error")) {
    pid_namespace_error = reply->value("pid_namespace_error", std::string("?"));
    plan.sandbox.new_pidns = false;
  }
  return (*reply)["pid"].get<pid_t>();
}

}  // namespace

struct Process::Impl {
  pid_t pid = -1;
  bool group = false;
  Fd pidfd, in, out, err, msg;
  std::string stdin_data;
  size_t stdin_off = 0;
  bool stdin_deferred = false;  // spec.defer_stdin, until send_stdin
  bool stdin_kept_open = false; // write_stdin: stdin stays open once its data is written
  size_t tail_cap = 0;
  std::string out_tail, err_tail, msg_buf;
  bool has_msg_pipe = false;
  std::optional<ExitInfo> exit;  // observed with WNOWAIT: the child is a zombie until reaped
  bool reaped = false;
  // Sandbox.
  SandboxReport report;
  std::string cgroup;             // the pids cgroup holding the child; empty: none
  uint64_t max_tasks = 0;         // the task cap (0: none)
  uint64_t cpu_limit_s = 0;
  Clock::time_point next_cap_check{};
  bool cap_hit = false;           // the task cap was reached (the group was then killed)
  bool signalled = false;         // we sent the child a signal
  double exit_cpu_s = -1;         // the child's CPU time, read when its exit was first seen
  // Set for a zygote's child: not ours to wait for; the zygote reports its exit and reaps it.
  std::shared_ptr<Zygote::Channel> zygote;

  ~Impl() {
    if (pid > 0) {
      kill_group(SIGKILL);  // also takes out grandchildren left behind by an exited child
      reap();
    }
    if (!cgroup.empty()) remove_cgroup(cgroup);  // and whatever left the group but not the cgroup
  }

  // Whether `pid` (and its group id) still name the child: not once it was reaped (the pid may
  // belong to someone else now), nor for a zygote's child whose zygote died, which was reparented
  // and is reaped by someone else once it exits, unless its pidfd says it lives.
  bool pid_still_ours() const {
    if (reaped) return false;
    return !(zygote && zygote->is_dead() && !(pidfd.valid() && !poll_readable(pidfd.get())));
  }

  // Whether the group (its leader at least) was signalled: false where its pid may be someone else's.
  bool kill_group(int sig) {
    if (!cgroup.empty())
      for (pid_t member : cgroup_members(cgroup)) ::kill(member, sig);
    if (!pid_still_ours()) return false;
    signalled = true;
    if (group && ::kill(-pid, sig) == 0) return true;
    ::kill(pid, sig);
    return true;
  }

  // Past the task cap: kill the group. The cgroup refuses forks at the cap and counts them; the
  // polled group is counted here.
  void check_task_cap() {
    next_cap_check = Clock::now() + kCapPollInterval;
    if (cap_hit || max_tasks == 0) return;
    bool over = !cgroup.empty() ? cgroup_max_events(cgroup) > 0 : group && count_group_tasks(pid) > max_tasks;
    if (!over) return;
    cap_hit = true;
    kill_group(SIGKILL);
  }

  LimitHit limit_hit() const {
    if (cap_hit) return LimitHit::processes;
    if (!exit || exit->exited) return LimitHit::none;
    if (exit->term_signal == SIGXCPU) return LimitHit::cpu_time;
    if (exit->term_signal == SIGXFSZ) return LimitHit::file_size;
    // SIGXCPU ignored: the kernel sends SIGKILL at the hard limit.
    if (exit->term_signal == SIGKILL && cpu_limit_s > 0 && !signalled &&
        exit_cpu_s >= static_cast<double>(cpu_limit_s))
      return LimitHit::cpu_time;
    return LimitHit::none;
  }

  void reap() {
    if (reaped) return;
    if (zygote) return reap_zygote_child();
    siginfo_t info{};
    int rc;
    do rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED);
    while (rc != 0 && errno == EINTR);
    if (rc == 0 && !exit) exit = decode(info);
    reaped = true;
  }

  // Gets the exit of a zygote's child (after a SIGKILL, where it was not seen yet), then has the
  // zygote reap it.
  void reap_zygote_child() {
    if (!exit) note_zygote_exit(std::chrono::seconds(30));
    zygote->reap(pid);
    reaped = true;
  }

  // The exit of a zygote's child, once the zygote reported it (waiting up to `timeout`). A child
  // whose zygote is gone has no exit to report: it counts as ended, how is unknown.
  void note_zygote_exit(std::chrono::milliseconds timeout) {
    if (auto reported = zygote->exit_of(pid, timeout)) {
      exit = reported->info;
      exit_cpu_s = reported->cpu_s;
    } else if (zygote->is_dead() && !(pidfd.valid() ? !poll_readable(pidfd.get()) : ::kill(pid, 0) == 0)) {
      exit = ExitInfo{};  // gone, and nobody left to say how
      report.notes.push_back("its zygote died: how it ended is unknown");
    }
  }

  // Notes the child's exit without reaping it.
  void check_exit() {
    if (exit) return;
    if (zygote) {
      // The pidfd says it exited: the zygote's report follows within milliseconds.
      bool gone = pidfd.valid() && poll_readable(pidfd.get());
      note_zygote_exit(gone ? std::chrono::milliseconds(500) : std::chrono::milliseconds(0));
      if (exit) note_task_cap_at_exit();
      return;
    }
    siginfo_t info{};
    int rc;
    do rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    while (rc != 0 && errno == EINTR);
    if (rc == 0 && info.si_pid == pid) {
      exit = decode(info);
      if (cpu_limit_s > 0) exit_cpu_s = process_cpu_seconds(pid);  // still a zombie: readable
      note_task_cap_at_exit();
    }
  }

  // A last look: forks refused by the cgroup, or a group still past the cap (its children outlive
  // a leader that died of a refused fork).
  void note_task_cap_at_exit() {
    if (max_tasks > 0 && !cap_hit)
      cap_hit = !cgroup.empty() ? cgroup_max_events(cgroup) > 0 : group && count_group_tasks(pid) > max_tasks;
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
    if (stdin_kept_open && stdin_off == stdin_data.size()) {  // all written: the child waits for more
      stdin_data.clear();
      stdin_off = 0;
      return;
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
    if (stdin_off < stdin_data.size()) add(in, POLLOUT);  // a deferred stdin waits for send_stdin
    if (!exit) add(pidfd, POLLIN);
    // Without a pidfd nothing wakes us on exit: poll in short slices and check.
    if (!exit && !pidfd.valid()) timeout_ms = std::min(timeout_ms, 10);
    bool watch_cap = max_tasks > 0 && !exit && !cap_hit;
    if (watch_cap) timeout_ms = std::min(timeout_ms, remaining_ms(next_cap_check));
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
    if (watch_cap && !exit && Clock::now() >= next_cap_check) check_task_cap();
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
const SandboxReport& Process::sandbox() const { return impl_->report; }
LimitHit Process::limit_hit() const { return impl_->limit_hit(); }
void Process::check_task_cap() {
  if (!impl_->exit) impl_->check_task_cap();
}

std::vector<pid_t> Process::members() const {
  if (impl_->reaped || impl_->pid <= 0) return {};
  if (!impl_->cgroup.empty()) return cgroup_members(impl_->cgroup);
  if (!impl_->pid_still_ours()) return {};
  if (!impl_->group) return {impl_->pid};
  std::vector<pid_t> pids;
  for_each_group_member(impl_->pid, [&](pid_t pid, const std::vector<std::string_view>&) { pids.push_back(pid); });
  return pids;
}

Result<Process> Process::spawn(const ProcessSpec& spec) { return spawn_via(spec, nullptr, {}); }

Result<Process> Process::spawn_via(const ProcessSpec& spec, Zygote* zygote, std::chrono::milliseconds timeout) {
  std::string pid_namespace_failure;
  Result<Process> process = spawn_once(spec, pid_namespace_failure, zygote, timeout);
  if (!process.ok() && !pid_namespace_failure.empty()) {  // the child could not make its own /proc
    ProcessSpec without = spec;
    without.new_pid_namespace = false;
    std::string ignored;
    process = spawn_once(without, ignored, zygote, timeout);
  }
  if (process.ok() && !pid_namespace_failure.empty())
    process->impl_->report.notes.push_back("own PID namespace: " + pid_namespace_failure);
  return process;
}

Result<Process> Process::spawn_once(const ProcessSpec& spec, std::string& pid_namespace_failure, Zygote* zygote,
                                    std::chrono::milliseconds zygote_timeout) {
  if (spec.argv.empty()) return invalid_argument("spawning a process: empty argv");
  if (spec.control_fd >= 0 && !spec.message_pipe)
    return invalid_argument(fmt::format("spawning {}: a control fd (fd 4) needs the message pipe (fd 3)", spec.argv[0]));
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
  plan.sandbox.cwd = spec.cwd.string();
  plan.sandbox.new_group = spec.new_process_group;
  if (spec.nice_increment != 0) {
    errno = 0;
    int current = ::getpriority(PRIO_PROCESS, 0);  // -1 is a valid nice value: errno tells
    if (errno == 0) plan.sandbox.nice = std::clamp(current + spec.nice_increment, -20, 19);
  }

  plan.sandbox.new_netns = spec.new_network_namespace;
  plan.sandbox.read_only = spec.read_only_filesystem;
  plan.sandbox.drop_caps = spec.drop_capabilities;
  plan.sandbox.new_pidns = spec.new_pid_namespace && spec.read_only_filesystem;
  plan.sandbox.syscall_filter = spec.syscall_filter;
  std::vector<std::string> plan_notes;  // what the plan left out, for the report
  bool tmpfs_given_up = false;
  if (plan.sandbox.read_only) {
    for (const auto& path : spec.writable_paths) {
      std::error_code ec;
      auto canonical = std::filesystem::canonical(path, ec);
      if (ec) return invalid_argument(fmt::format("spawning {}: writable path {}: {}", prog, path.string(), ec.message()));
      plan.sandbox.writable.push_back(canonical.string());
    }
    std::vector<std::string> not_read_only = plan.sandbox.writable;
    for (const auto& tmpfs : spec.fresh_tmpfs) {
      std::error_code ec;
      auto canonical = std::filesystem::canonical(tmpfs.path, ec);
      if (ec) return invalid_argument(fmt::format("spawning {}: tmpfs path {}: {}", prog, tmpfs.path.string(), ec.message()));
      if (tmpfs.size_bytes == 0) return invalid_argument(fmt::format("spawning {}: tmpfs at {} of size 0", prog, canonical.string()));
      std::string path = canonical.string();
      auto below = std::find_if(plan.sandbox.writable.begin(), plan.sandbox.writable.end(),
                                [&](const std::string& w) { return is_under(w, path); });
      if (below != plan.sandbox.writable.end()) {  // a fresh tmpfs would hide it (a scratch dir under /dev/shm)
        plan_notes.push_back(fmt::format("a fresh tmpfs at {}: not mounted, the writable path {} lies in it", path, *below));
        tmpfs_given_up = true;
        plan.sandbox.writable.push_back(path);
      } else {
        plan.sandbox.tmpfs.push_back({path, tmpfs_options(tmpfs.size_bytes)});
      }
      not_read_only.push_back(path);
    }
    plan.sandbox.readonly_mounts = mounts_to_protect(not_read_only, plan.sandbox.new_pidns);
  }

  auto impl = std::make_unique<Impl>();
  impl->report.notes = std::move(plan_notes);
  // Sandbox: everything the child will need, and the pids cgroup.
  const ResourceLimits& lim = spec.limits;
  auto add_limit = [&](int resource, uint64_t value, uint64_t extra_hard = 0) {
    if (value > 0) plan.sandbox.limits.push_back({resource, static_cast<rlim_t>(value), static_cast<rlim_t>(value + extra_hard)});
  };
  add_limit(RLIMIT_CPU, lim.cpu_time_s, 2);  // SIGXCPU at the soft limit, SIGKILL at the hard one
  add_limit(RLIMIT_FSIZE, lim.file_size_bytes);
  add_limit(RLIMIT_AS, lim.address_space_bytes);
  add_limit(RLIMIT_NOFILE, lim.open_files);
  if (lim.no_core_dumps) plan.sandbox.limits.push_back({RLIMIT_CORE, 0, 0});
  // Root: the kernel ignores RLIMIT_NPROC. Otherwise one more than the cap, so that a group stopped
  // by it is seen past the cap.
  if (lim.max_processes > 0 && ::getuid() != 0)
    add_limit(RLIMIT_NPROC, lim.max_processes + 1 + count_user_tasks(::getuid()));
  impl->cpu_limit_s = lim.cpu_time_s;
  impl->max_tasks = lim.max_processes;
  if (lim.max_processes > 0) {
    std::string why;
    std::string base = pids_cgroup_base(why);
    if (!base.empty()) {
      static std::atomic<uint64_t> counter{0};
      std::string dir = fmt::format("{}/{}-{}", base, ::getpid(), counter++);
      if (::mkdir(dir.c_str(), 0755) == 0 && write_small_file(dir + "/pids.max", std::to_string(lim.max_processes))) {
        impl->cgroup = dir;
        plan.sandbox.cgroup_procs = dir + "/cgroup.procs";
      } else {
        why = fmt::format("creating {}: {}", dir, std::strerror(errno));
        ::rmdir(dir.c_str());
      }
    }
    impl->report.process_cap = impl->cgroup.empty() ? "polling" : "cgroup";
    if (impl->cgroup.empty()) impl->report.notes.push_back("pids cgroup: " + why + "; polling the process group");
  }
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
  Fd control;
  if (spec.control_fd >= 0) {
    control.reset(::fcntl(spec.control_fd, F_DUPFD_CLOEXEC, kHighFd));  // clear of the 0..4 targets
    if (!control.valid()) return fail("dup of the control fd");
    plan.stdio[4] = control.get();
  }
  plan.error_fd = error_w.get();

  pid_t pid = -1;
  if (zygote) {
    std::string pid_namespace_error;
    auto forked = zygote_fork(*zygote->channel_, plan, spec.env, pid_namespace_error, zygote_timeout);
    if (!forked.ok()) return forked.status().with_context(fmt::format("spawning {} through its zygote", prog));
    pid = *forked;
    if (!pid_namespace_error.empty()) impl->report.notes.push_back("own PID namespace: " + pid_namespace_error);
    impl->zygote = zygote->channel_;
  } else {
    // Block all signals across fork() so no parent handler runs in the child before it resets them.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    // clone() with no new stack returns twice like fork(); the child makes only async-signal-safe
    // calls, so glibc's fork bookkeeping (atfork handlers, malloc locks) is not missed.
    pid = plan.sandbox.new_pidns ? static_cast<pid_t>(::syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, nullptr, nullptr, nullptr, 0))
                                 : ::fork();
    if (pid < 0 && plan.sandbox.new_pidns) {  // EPERM without CAP_SYS_ADMIN, ENOSPC past the namespace limit
      impl->report.notes.push_back(fmt::format("own PID namespace: clone(CLONE_NEWPID): {}", std::strerror(errno)));
      plan.sandbox.new_pidns = false;
      pid = ::fork();
    }
    if (pid == 0) child_exec(plan);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) {
      errno = fork_errno;
      return fail("fork");
    }
  }

  impl->pid = pid;
  // Now, while the pid is reserved (our zombie at worst, or the zygote's until we ask it to reap):
  // kill_group needs it for a zygote's child whose zygote dies. -1 (before Linux 5.3): slices instead.
  impl->pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  impl->group = spec.new_process_group;
  // Also set the group from the parent, so kill_group works even before the child runs
  // (EACCES after the child's exec is harmless: it already did it itself).
  if (spec.new_process_group && !zygote) ::setpgid(pid, pid);
  error_w.reset();
  child_in.reset();
  child_out.reset();
  child_err.reset();
  child_msg.reset();
  control.reset();

  // The child's records until exec (EOF: the pipe is CLOEXEC) or its _exit. A zygote's child
  // runs Python before it is set up (where a lock held by another thread at the fork could stop
  // it): it gets the zygote's deadline, then it is killed and the spawn fails.
  std::string records;
  auto setup_deadline = Clock::now() + zygote_timeout;
  for (;;) {
    if (zygote) {
      pollfd readable{error_r.get(), POLLIN, 0};
      int left = remaining_ms(setup_deadline);
      int ready = left == 0 ? 0 : ::poll(&readable, 1, left);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        impl->kill_group(SIGKILL);
        impl->reap();
        impl->pid = -1;
        return io_error(fmt::format("spawning {} through its zygote: the child did not set itself up within {} ms",
                                    prog, zygote_timeout.count()));
      }
    }
    char buf[4096];
    ssize_t n = ::read(error_r.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    records.append(buf, static_cast<size_t>(n));
  }
  std::vector<int32_t> skipped;
  for (size_t off = 0; off + sizeof(ChildRecord) <= records.size(); off += sizeof(ChildRecord)) {
    ChildRecord r;
    std::memcpy(&r, records.data() + off, sizeof r);
    if (r.kind == kFailed) {
      impl->reap();  // the child already _exit()ed
      impl->pid = -1;
      std::string msg = fmt::format("spawning {}: {}{}: {}", prog, kStageNames[r.what],
                                    r.what == kStageChdir ? " " + plan.sandbox.cwd : std::string(), std::strerror(r.err));
      if (r.what == kStageMountProc) pid_namespace_failure = fmt::format("{}: {}", kStageNames[r.what], std::strerror(r.err));
      return r.err == ENOENT && r.what == kStageExec ? not_found(std::move(msg)) : io_error(std::move(msg));
    }
    skipped.push_back(r.what);
    std::string what = step_name(r.what);
    const size_t index = r.index >= 0 ? static_cast<size_t>(r.index) : SIZE_MAX;
    const size_t writable_count = plan.sandbox.writable.size();
    if (r.what == kStepBind && index < writable_count) what += " (" + plan.sandbox.writable[index] + ")";
    if (r.what == kStepBind && index >= writable_count && index - writable_count < plan.sandbox.tmpfs.size())
      what += " (" + plan.sandbox.tmpfs[index - writable_count].path + ")";
    if (r.what == kStepTmpfs && index < plan.sandbox.tmpfs.size()) what += " (" + plan.sandbox.tmpfs[index].path + ")";
    if (r.what == kStepRemount && r.index >= 0 && static_cast<size_t>(r.index) < plan.sandbox.readonly_mounts.size())
      what += " (" + plan.sandbox.readonly_mounts[r.index].path + ")";
    impl->report.notes.push_back(fmt::format("{}: {}", what, std::strerror(r.err)));
  }
  auto was_skipped = [&](std::initializer_list<int32_t> steps) {
    return std::any_of(steps.begin(), steps.end(),
                       [&](int32_t s) { return std::find(skipped.begin(), skipped.end(), s) != skipped.end(); });
  };
  impl->report.network_isolated = spec.new_network_namespace && !was_skipped({kStepNetns});
  impl->report.filesystem_read_only =
      spec.read_only_filesystem && !was_skipped({kStepMountns, kStepMountPrivate, kStepBind, kStepRemount});
  impl->report.capabilities_dropped = spec.drop_capabilities && !was_skipped({kStepCaps, kStepNoNewPrivs});
  impl->report.syscalls_filtered = spec.syscall_filter && !was_skipped({kStepSyscallFilter});
  impl->report.pids_isolated = plan.sandbox.new_pidns;  // the child failed (above) where it could not mount /proc
  // Remounts skipped elsewhere leave the tmpfs in place; a failed writable bind stops before it.
  impl->report.tmpfs_private = spec.read_only_filesystem && !spec.fresh_tmpfs.empty() && !tmpfs_given_up &&
                               !was_skipped({kStepMountns, kStepMountPrivate, kStepBind, kStepTmpfs});
  if (!impl->cgroup.empty() && was_skipped({kStepCgroup})) {  // the child is not in it: poll instead
    ::rmdir(impl->cgroup.c_str());
    impl->cgroup.clear();
    impl->report.process_cap = "polling";
  }
  impl->next_cap_check = Clock::now() + kCapPollInterval;

  impl->has_msg_pipe = spec.message_pipe;
  impl->tail_cap = spec.output_tail_bytes;
  impl->stdin_data = spec.stdin_data;
  for (Fd* fd : {&impl->in, &impl->out, &impl->err, &impl->msg}) {
    if (fd->valid()) set_nonblocking(fd->get());
  }
  impl->stdin_deferred = spec.defer_stdin;
  if (impl->stdin_data.empty() && !spec.defer_stdin) impl->in.reset();  // immediate EOF, never the parent's stdin
  return Process(std::move(impl));
}

void Process::send_stdin(std::string data) {
  Impl& p = *impl_;
  if (!p.stdin_deferred || !p.in.valid()) return;  // not deferred, sent before, or the child closed it
  p.stdin_deferred = false;
  p.stdin_kept_open = false;
  p.stdin_data.erase(0, p.stdin_off);  // what write_stdin has not written yet goes first
  p.stdin_off = 0;
  p.stdin_data += data;
  p.write_stdin();
}

void Process::write_stdin(const std::string& data) {
  Impl& p = *impl_;
  if (!p.stdin_deferred || !p.in.valid()) return;  // not deferred, closed by send_stdin, or by the child
  p.stdin_kept_open = true;
  p.stdin_data.erase(0, p.stdin_off);
  p.stdin_off = 0;
  p.stdin_data += data;
  p.write_stdin();
}

void Process::clear_output_tails() {
  impl_->drain();  // what was written before this call, still in the pipes, is not the next request's
  impl_->out_tail.clear();
  impl_->err_tail.clear();
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
  bool group_signalled = p.kill_group(SIGKILL) && p.group;
  p.reap();
  // The leader's children die of the same SIGKILL but each in its own time (a loaded host can take
  // tens of milliseconds to tear one down): wait for them, so that what they held (files, a
  // directory's contents, GPU memory) is given back when this returns.
  if (group_signalled) {
    auto deadline = Clock::now() + kGroupEndWait;
    while (group_has_live_members(p.pid) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
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

bool nice_value_allowed(int nice) {
  pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) _exit(::setpriority(PRIO_PROCESS, 0, nice) == 0 ? 0 : 1);  // async-signal-safe only
  int status = 0;
  while (::waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return false;  // not reaped here: no answer
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
