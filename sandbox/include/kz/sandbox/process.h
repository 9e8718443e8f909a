// Child processes with pipes, deadlines and process groups.
//
// The evaluator runs every candidate in a Python worker process. The worker reports progress on
// a dedicated message pipe (fd 3 in the child, one JSON object per line) so that whatever the
// candidate prints on stdout/stderr cannot forge a protocol message. The supervisor waits for
// each message with a deadline; on a timeout it kills the child's whole process group, so
// grandchildren (nvcc, ninja, a fork bomb's children) die with it. stdout and stderr are drained
// while waiting (no pipe-full deadlock) and their tails kept for error messages.
//
// Optionally the child is sandboxed before exec (ProcessSpec::limits and the namespace flags):
// resource limits (setrlimit), a process-count cap (a pids cgroup, else the supervisor polls the
// process group), its own network namespace, a mount namespace in which everything but a few
// writable paths is read-only, and no capabilities. Optional parts that the system refuses
// (EPERM without root, no cgroup) are skipped and reported in Process::sandbox(), never fatal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz {

// Limits applied with setrlimit in the child before exec, inherited by everything it starts.
// 0 leaves a limit as the parent has it. RLIMIT_* limits count per process (CPU time, file size,
// address space), so each grandchild (nvcc, ...) gets its own budget.
struct ResourceLimits {
  uint64_t cpu_time_s = 0;           // RLIMIT_CPU: SIGXCPU at the limit, SIGKILL 2 CPU-seconds later
  uint64_t file_size_bytes = 0;      // RLIMIT_FSIZE: a write past it gets SIGXFSZ (EFBIG if ignored)
  // The cap on tasks (processes and threads, as the kernel counts them) of the child and all it
  // starts. Enforced by a pids cgroup (pids.max; fork fails with EAGAIN at the cap) when this
  // process may create one (root, cgroup v1 `pids` or v2 with the pids controller), else by
  // counting the process group's tasks every 200 ms while the caller waits on the Process (and
  // once more when the child exits; needs new_process_group). Either way, once the cap is passed
  // (a fork refused by the cgroup, or more tasks than the cap counted) the supervisor kills the
  // group and limit_hit() says `processes`. RLIMIT_NPROC is also set (cap + 1 + the tasks the real
  // uid already has) when the uid is not root; it counts per uid across the system (parallel
  // workers share it) and the kernel ignores it for root, so it is only a backstop.
  uint64_t max_processes = 0;
  uint64_t address_space_bytes = 0;  // RLIMIT_AS; never for CUDA processes (they reserve TBs of VA)
  uint64_t open_files = 0;           // RLIMIT_NOFILE
  bool no_core_dumps = false;        // RLIMIT_CORE = 0 (SIGXCPU, SIGXFSZ, SIGSEGV dump core by default)
};

struct ProcessSpec {
  std::vector<std::string> argv;              // argv[0] is looked up on PATH when it has no '/'
  std::map<std::string, std::string> env;     // the child's whole environment (nothing inherited)
  std::filesystem::path cwd;                  // empty: the parent's working directory
  std::string stdin_data;                     // written to the child's stdin, which is then closed
  bool defer_stdin = false;                   // stdin stays open, empty, until Process::send_stdin
                                              // (for Process::spawn; run_process would wait for it)
  bool message_pipe = false;                  // open fd 3 in the child as a write-only message pipe
  bool new_process_group = true;              // setpgid(0,0) in the child, so kill_group reaches all
  size_t output_tail_bytes = 64 * 1024;       // how much of stdout/stderr to keep (the last bytes)
  int nice_increment = 0;                     // added to the parent's nice value (capped at 19), inherited
                                              // by all the child starts; a failure to set it is ignored
  int control_fd = -1;                        // with message_pipe: this descriptor of the caller's becomes
                                              // fd 4 in the child (a Zygote's control socket)

  // ---- sandbox (all off by default) ----
  ResourceLimits limits;
  // unshare(CLONE_NEWNET): the child sees only its own loopback device, which is down, so every
  // connection fails at once. Without the permission (EPERM) it runs in the parent's namespace.
  bool new_network_namespace = false;
  // unshare(CLONE_NEWNS), every mount made private, `writable_paths` bind-mounted onto themselves,
  // then every other mount remounted read-only (bind remounts keep nosuid/nodev/noexec). autofs
  // mounts are left alone. If a writable path cannot be bound, nothing is made read-only.
  bool read_only_filesystem = false;
  std::vector<std::filesystem::path> writable_paths;  // must exist
  // With read_only_filesystem: each of these paths (which must exist) gets a fresh tmpfs of its own
  // in the child's mount namespace (mode 1777, nosuid, nodev) in place of the parent's directory,
  // writable: what the child and its processes write there counts against size_bytes (> 0; ENOSPC
  // past it, and past one file per 16 KiB of it), is seen by no process outside that namespace, and is
  // gone with the namespace. Where the mount is refused, or a writable path lies in it (which the
  // tmpfs would hide), the path is bound writable as a writable_paths entry is, and the report says so.
  // Its mount source is "kz-tmpfs" (/proc/<pid>/mountinfo), so the child can tell it from the host's.
  struct FreshTmpfs {
    std::filesystem::path path;
    uint64_t size_bytes = 0;
  };
  std::vector<FreshTmpfs> fresh_tmpfs;
  // PR_SET_NO_NEW_PRIVS, and every capability dropped from the bounding, inheritable and ambient
  // sets: a root child keeps uid 0 (it owns root's files) but cannot mount, undo the read-only
  // remounts, leave the network namespace (setns), raise its rlimits, ptrace or load modules.
  bool drop_capabilities = false;
  // With read_only_filesystem only: the child is the first process (pid 1) of a new PID namespace,
  // with a fresh /proc that lists that namespace's processes alone (no sibling's cwd, cmdline or
  // environment in sight). When it exits, the kernel kills every process left in its namespace. As pid 1 it gets signals with the default action only where they are
  // forced: SIGKILL and SIGSTOP from outside, and faults (a SIGSEGV from a bad access still kills it;
  // kill(getpid(), SIGSEGV) does not, nor SIGXCPU: the CPU limit ends it with SIGKILL at the hard
  // limit). Where the namespace or its /proc cannot be made, the child runs without and
  // SandboxReport says why.
  bool new_pid_namespace = false;
  // A seccomp filter, installed last (under no_new_privs) and kept by everything the child starts:
  // new user namespaces refused (unshare or clone with CLONE_NEWUSER: EPERM), and setns (joining one
  // that exists, which a user namespace its uid owns would allow), so no process of the child's gets
  // a namespace's capabilities back (a mount of its own, say); io_uring refused (EPERM:
  // a ring's requests act outside the calls a supervisor can see); clone3 answered ENOSYS (its flags
  // lie in memory, out of a filter's sight, and libc then falls back to clone); and every call through
  // another ABI than the child's own (x86-64's int 0x80 and x32 numbers) refused, since the filter
  // knows the native numbers only. x86-64 and aarch64; where it cannot be installed the child runs
  // without it and SandboxReport says why.
  bool syscall_filter = false;
};

// What the sandbox of a spawned process really got (see Process::sandbox()).
struct SandboxReport {
  bool network_isolated = false;     // in its own network namespace
  bool filesystem_read_only = false; // every mount but writable_paths remounted read-only
  bool capabilities_dropped = false;
  bool pids_isolated = false;        // in its own PID namespace, with its own /proc
  bool tmpfs_private = false;        // every fresh_tmpfs path has its own tmpfs
  bool syscalls_filtered = false;    // under the seccomp filter (ProcessSpec::syscall_filter)
  std::string process_cap;           // "cgroup", "polling", or "" without max_processes
  std::vector<std::string> notes;    // what was asked for but not applied, and why
};

// What `spec` asked for that `report` says the child did not get ("its own network namespace",
// "a read-only filesystem", "no capabilities", "its own PID namespace", "its own tmpfs at <path>",
// "its syscall filter");
// empty when all of it holds.
std::vector<std::string> missing_isolation(const ProcessSpec& spec, const SandboxReport& report);

// Which limit ended (or, for `processes`, was crossed by) a sandboxed process. `scratch` is the
// caller's own bound on what its scratch dir holds (the eval supervisor's; Process never sets it).
enum class LimitHit { none, cpu_time, file_size, processes, scratch };

struct ExitInfo {
  bool exited = false;      // exited normally (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;      // signal that killed it, 0 if none
  // "exit code 3", "killed by signal 11 (Segmentation fault)".
  std::string describe() const;
};

class Zygote;

class Process {
 public:
  enum class ReadEvent { line, eof, timeout };

  static Result<Process> spawn(const ProcessSpec& spec);

  Process(Process&&) noexcept;
  Process& operator=(Process&&) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // kills the process group if still running, then reaps

  pid_t pid() const;

  // With spec.defer_stdin: writes `data` to the child's stdin (the rest while this Process waits
  // on the child: read_message, wait_for), then closes it. Once only.
  void send_stdin(std::string data);
  // With spec.defer_stdin: writes `data` to the child's stdin (the rest while this Process waits
  // on the child) and keeps stdin open, for a child that reads one request after another (a fork
  // server). May be called again; send_stdin after it sends the last data and closes.
  void write_stdin(const std::string& data);
  // Forgets the stdout/stderr tails kept so far: the next error message shows only what the child
  // wrote after this call (one request of a child that serves several).
  void clear_output_tails();

  // Waits up to `timeout` for the next complete line on the message pipe (without the '\n').
  // eof: the child closed the pipe (usually: it exited). Requires spec.message_pipe.
  ReadEvent read_message(std::string& line, std::chrono::milliseconds timeout);

  // Waits up to `timeout` for the child to exit, draining its output meanwhile.
  std::optional<ExitInfo> wait_for(std::chrono::milliseconds timeout);
  // Sends `sig` to the child's process group (or the child alone without a group).
  void kill_group(int sig);
  // Kills the group with SIGKILL, reaps the child, and waits (2 s at most) until no other member of
  // its group still runs.
  ExitInfo kill_and_reap();

  const std::string& stdout_tail() const;
  const std::string& stderr_tail() const;

  // What the sandbox requested in the spec really got.
  const SandboxReport& sandbox() const;
  // Checks the task cap now (it is otherwise checked every 200 ms while this Process waits on the
  // child): kills the group and makes limit_hit() say `processes` when the cap was reached.
  void check_task_cap();
  // The child's processes now: its cgroup's members where it has one (a process that left its
  // group is still there), else its process group's (a scan of /proc), else the child alone; none
  // once it was reaped. Zombies may be among them.
  std::vector<pid_t> members() const;
  // Which limit ended the process: SIGXCPU (or SIGKILL past the CPU limit, not sent by us) is
  // cpu_time, SIGXFSZ is file_size; `processes` once the task cap was reached (the group is then
  // killed). Meaningful once the child exited; `none` otherwise.
  LimitHit limit_hit() const;

 private:
  struct Impl;
  explicit Process(std::unique_ptr<Impl> impl);
  // spawn() without its retry: `pid_namespace_failure` says why the child, cloned into its own PID
  // namespace, failed before exec to make its mount namespace or /proc (then spawn tries without).
  // Where clone itself refuses the namespace, the child is forked without one, with a note.
  // Both with `zygote`: the child is the zygote's (Zygote::spawn), which answers within `timeout`.
  static Result<Process> spawn_via(const ProcessSpec& spec, Zygote* zygote, std::chrono::milliseconds timeout);
  static Result<Process> spawn_once(const ProcessSpec& spec, std::string& pid_namespace_failure, Zygote* zygote,
                                    std::chrono::milliseconds timeout);
  std::unique_ptr<Impl> impl_;
  friend class Zygote;
};

// A process that forks children on request, so that every child starts from what the zygote
// prepared once (a Python worker's imports) instead of exec'ing a program and preparing again.
// Each child still gets the whole sandbox its ProcessSpec asks for: the same steps as
// Process::spawn's child (sandbox/src/sandbox_plan.h), applied by the child itself right after the
// fork (kz_zygote_child_setup, the shared library kz_zygote_child), before it runs anything of its
// own. Its Process behaves as a spawned one (pipes, deadlines, groups, limits, SandboxReport);
// the zygote, its parent, tells the supervisor when it exits and reaps it only when asked, so its
// pid stays reserved until the Process reaps it, as with a child of ours.
//
// The zygote itself runs unsandboxed (it needs its capabilities to give each child its
// namespaces) and must never run untrusted code. Its protocol, on the control socket at fd 4 (a
// SOCK_SEQPACKET pair, one JSON object per message): the supervisor sends
//   {"op": "spawn", "plan": <sandbox plan>, "env": {...}, "fds": ["stdin", "stdout", ...]}
// with those descriptors (SCM_RIGHTS, the error pipe last) and gets {"op": "spawned", "pid": N}
// (where it could not make the PID namespace asked for, also "pid_namespace_error") or
// {"op": "spawn_failed", "error": "..."}; unprompted, {"op": "exited", "pid": N,
// "exit_code": N | null, "signal": N | null, "cpu_s": F} with the child still a zombie, and it
// answers {"op": "reap", "pid": N} by reaping it. EOF on the socket ends the zygote.
class Zygote {
 public:
  // Starts `spec` (with message_pipe) as a zygote: its control socket at fd 4, in its own process
  // group. The caller leaves the sandbox flags off: the zygote needs what they would take away.
  static Result<std::shared_ptr<Zygote>> start(ProcessSpec spec);
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // A child of the zygote as `spec` describes it, but that spec.argv is not run: the child goes on
  // with the zygote's program (spec.argv[0] names it in errors). Waits up to `timeout` for the
  // zygote's answer (a zygote still preparing answers when it is done). An error where the zygote
  // is gone, refused or did not answer in time (it is then killed, and every later spawn fails):
  // the caller may spawn the program itself instead.
  Result<Process> spawn(const ProcessSpec& spec, std::chrono::milliseconds timeout);
  // False once the zygote died, closed its socket or failed to answer.
  bool alive();
  pid_t pid() const;
  // The zygote's stderr so far (its imports' complaints, a traceback when it died).
  std::string stderr_tail() const;

  struct Channel;  // the socket, shared with the Processes this zygote spawned (their exits)

 private:
  friend class Process;
  Zygote(Process process, std::shared_ptr<Channel> channel);
  mutable std::mutex process_mutex_;  // spawns run from several threads; process_ drains its pipes
  Process process_;
  std::shared_ptr<Channel> channel_;
};

struct RunResult {
  ExitInfo exit;
  bool timed_out = false;   // the deadline passed and the group was killed
  std::string stdout_text;  // the tails kept (spec.output_tail_bytes)
  std::string stderr_text;
};

// Runs to completion or until `timeout`, whichever comes first.
Result<RunResult> run_process(const ProcessSpec& spec, std::chrono::milliseconds timeout);

// The parent's environment as a map (to copy selected variables into a ProcessSpec).
std::map<std::string, std::string> current_environment();

// The parent of process `pid` (/proc/<pid>/stat's field 4); nullopt once it is gone.
std::optional<pid_t> parent_process(pid_t pid);

// Whether a process started from here may run at nice value `nice`: a higher one always, a lower one
// than this thread's with CAP_SYS_NICE or within RLIMIT_NICE (else a negative
// ProcessSpec::nice_increment is left out). Asked of a forked child that tries, so no thread of this
// process changes its priority.
bool nice_value_allowed(int nice);

}  // namespace kz
