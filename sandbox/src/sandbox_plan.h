// The sandbox steps a child applies to itself before it runs its program (core-internal).
//
// Two callers share them: Process::spawn's child, between fork and exec, and a zygote's child
// (kz_zygote_child_setup, in the shared library a Python zygote loads), which goes on running the
// zygote's code instead of exec'ing. The parent prepares every path and value (the mount list
// comes from its own /proc/self/mountinfo, which the child's new mount namespace copies), so
// apply_sandbox_plan makes only async-signal-safe calls.
//
// Order: setpgid, nice, rlimits, joining the pids cgroup, unshare(CLONE_NEWNET), the read-only
// mount namespace (with a fresh /proc in a PID namespace, and fresh tmpfs mounts), chdir, dropping
// capabilities, the seccomp filter. An optional step that fails is reported to the parent as a record on the error pipe
// and skipped; a fatal one writes its record and _exit(127)s.
#pragma once
#include <sys/resource.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kz::sandbox_plan {

// What the child reports on the error pipe: optional sandbox steps it skipped (kSkipped, any
// number), and a fatal failure before _exit(127) (kFailed, last). 16 bytes: atomic on a pipe.
struct ChildRecord {
  int32_t kind;   // kFailed or kSkipped
  int32_t what;   // kFailed: a Stage; kSkipped: a Step
  int32_t index;  // kSkipped: which writable path / mount, where the step has several
  int32_t err;    // errno
};
constexpr int32_t kFailed = 0, kSkipped = 1;
// The source a fresh tmpfs is mounted from: what names it in /proc/<pid>/mountinfo, where a fork
// server looks before it empties its /dev/shm between requests (worker/kz_worker/fork_server.py).
constexpr const char* kTmpfsSource = "kz-tmpfs";
enum Stage : int32_t { kStageSetpgid, kStageDup2, kStageChdir, kStageExec, kStageSetrlimit, kStageMountProc };
enum Step : int32_t {
  kStepCgroup, kStepNetns, kStepMountns, kStepMountPrivate, kStepBind, kStepRemount, kStepCaps, kStepNoNewPrivs,
  kStepTmpfs, kStepSyscallFilter,
};

struct Plan {
  std::string cwd;  // empty: stay
  bool new_group = false;
  std::optional<int> nice;  // the child's nice value (setpriority), when one was asked for
  struct Limit {
    int resource;
    rlim_t soft, hard;
  };
  std::vector<Limit> limits;
  std::string cgroup_procs;  // the pids cgroup's cgroup.procs to join; empty: none
  bool new_netns = false, read_only = false, drop_caps = false;
  bool new_pidns = false;  // the child is pid 1 of a new PID namespace: mount its own /proc
  // A seccomp filter, last (ProcessSpec::syscall_filter says what it refuses); where the kernel
  // refuses it, kStepSyscallFilter is skipped.
  bool syscall_filter = false;
  std::vector<std::string> writable;  // bind-mounted onto themselves
  struct Tmpfs {
    std::string path;
    std::string options;  // tmpfs's mount data ("size=...,mode=1777"), made by the parent
  };
  std::vector<Tmpfs> tmpfs;  // a fresh tmpfs each; where refused, bound writable (kStepTmpfs, then kStepBind)
  struct ReadOnlyPath {
    std::string path;
    bool bind_first = false;  // not a mount point: bound onto itself first (e.g. /proc/sys)
  };
  std::vector<ReadOnlyPath> readonly_mounts;  // every other mount point, remounted read-only
};

[[noreturn]] void child_fail(int error_fd, Stage stage);

// Every step of `plan`, in the order above; records go to `error_fd`.
void apply_sandbox_plan(const Plan& plan, int error_fd);

// The plan as a zygote's child receives it, and back.
nlohmann::json to_json(const Plan& plan);
Plan plan_from_json(const nlohmann::json& json);

}  // namespace kz::sandbox_plan
