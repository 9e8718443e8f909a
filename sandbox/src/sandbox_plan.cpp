// The sandbox steps a child applies to itself: sandbox_plan.h.
#include "sandbox_plan.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace kz::sandbox_plan {

[[noreturn]] void child_fail(int error_fd, Stage stage) {
  ChildRecord r{kFailed, stage, 0, errno};
  ssize_t ignored = ::write(error_fd, &r, sizeof r);
  (void)ignored;
  ::_exit(127);
}

namespace {

void child_skipped(int error_fd, Step step, int index, int err) {
  ChildRecord r{kSkipped, step, index, err};
  ssize_t ignored = ::write(error_fd, &r, sizeof r);
  (void)ignored;
}

// Empties every capability set: bounding, ambient, inheritable, and the permitted and effective
// sets too. An exec'd root child would lose the last two at exec (nothing left in the bounding
// set); a zygote's child never execs, and would otherwise run candidates with all of them
// (remount, ptrace, setns). Returns 0 or an errno.
int drop_all_capabilities() {
  for (int cap = 0; cap < 64; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
    if (errno == EINVAL) break;  // past the last capability this kernel knows
    return errno;
  }
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);  // EINVAL before Linux 4.3: none to clear
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2]{};
  if (::syscall(SYS_capset, &header, none) != 0) return errno;
  return 0;
}

// The mount namespace: private propagation, writable paths bound onto themselves (so they are
// mounts of their own), then every other mount remounted read-only.
//
// In a new PID namespace a fresh procfs goes over /proc first (the read-only binds below then apply
// to it): it lists the namespace's own processes only, so no sibling's cwd, cmdline or environment
// is in sight. Without it, this pid 1 would read the parent namespace's /proc under pids that are
// not its own (a fork server killing "its" descendants there would kill strangers): fatal.
void child_read_only_filesystem(const Plan& plan, int error_fd) {
  if (::unshare(CLONE_NEWNS) != 0) {
    if (plan.new_pidns) child_fail(error_fd, kStageMountProc);
    return child_skipped(error_fd, kStepMountns, 0, errno);
  }
  // Without private propagation our remounts could reach the parent's namespace: stop here.
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    if (plan.new_pidns) child_fail(error_fd, kStageMountProc);
    return child_skipped(error_fd, kStepMountPrivate, 0, errno);
  }
  if (plan.new_pidns && ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    child_fail(error_fd, kStageMountProc);
  for (size_t i = 0; i < plan.writable.size(); ++i) {
    const char* path = plan.writable[i].c_str();
    if (::mount(path, path, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      return child_skipped(error_fd, kStepBind, static_cast<int>(i), errno);  // nothing read-only
  }
  for (size_t i = 0; i < plan.tmpfs.size(); ++i) {
    const char* path = plan.tmpfs[i].path.c_str();
    if (::mount(kTmpfsSource, path, "tmpfs", MS_NOSUID | MS_NODEV, plan.tmpfs[i].options.c_str()) == 0) continue;
    child_skipped(error_fd, kStepTmpfs, static_cast<int>(i), errno);
    // Writable as before, the parent's directory: a kStepBind index past `writable` names a tmpfs path.
    if (::mount(path, path, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      return child_skipped(error_fd, kStepBind, static_cast<int>(plan.writable.size() + i), errno);
  }
  for (size_t i = 0; i < plan.readonly_mounts.size(); ++i) {
    const char* path = plan.readonly_mounts[i].path.c_str();
    if (plan.readonly_mounts[i].bind_first && ::mount(path, path, nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      if (errno != ENOENT) child_skipped(error_fd, kStepRemount, static_cast<int>(i), errno);
      continue;
    }
    struct statfs st {};
    if (::statfs(path, &st) != 0) {
      if (errno != ENOENT) child_skipped(error_fd, kStepRemount, static_cast<int>(i), errno);
      continue;  // ENOENT: unmounted since the parent read the list
    }
    if (st.f_flags & ST_RDONLY) continue;
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
    // A bind remount sets the mount's flags to exactly these: keep the restrictive ones.
    if (st.f_flags & ST_NOSUID) flags |= MS_NOSUID;
    if (st.f_flags & ST_NODEV) flags |= MS_NODEV;
    if (st.f_flags & ST_NOEXEC) flags |= MS_NOEXEC;
    if (::mount(nullptr, path, nullptr, flags, nullptr) != 0)
      child_skipped(error_fd, kStepRemount, static_cast<int>(i), errno);
  }
}

// The steps before chdir (sandbox_plan.h has the order).
void child_sandbox(const Plan& plan, int error_fd) {
  for (const Plan::Limit& limit : plan.limits) {
    rlimit current{};
    if (::getrlimit(limit.resource, &current) != 0) child_fail(error_fd, kStageSetrlimit);
    rlimit wanted{limit.soft, limit.hard};
    // Never loosen a limit the parent already has (root could raise the hard limit).
    if (current.rlim_max != RLIM_INFINITY) {
      wanted.rlim_max = std::min(wanted.rlim_max, current.rlim_max);
      wanted.rlim_cur = std::min(wanted.rlim_cur, current.rlim_max);
    }
    if (::setrlimit(limit.resource, &wanted) != 0) child_fail(error_fd, kStageSetrlimit);
  }
  if (!plan.cgroup_procs.empty()) {
    int fd = ::open(plan.cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1) child_skipped(error_fd, kStepCgroup, 0, errno);
    if (fd >= 0) ::close(fd);
  }
  if (plan.new_netns && ::unshare(CLONE_NEWNET) != 0) child_skipped(error_fd, kStepNetns, 0, errno);
  if (plan.read_only) child_read_only_filesystem(plan, error_fd);
}

// Last step before exec: after the mounts (which need CAP_SYS_ADMIN).
void child_drop_privileges(const Plan& plan, int error_fd) {
  if (!plan.drop_caps) return;
  int err = drop_all_capabilities();
  // Without CAP_SETPCAP (not root) there is nothing to drop: no_new_privs below keeps file
  // capabilities and setuid bits from granting any at exec.
  if (err != 0 && !(err == EPERM && ::geteuid() != 0)) child_skipped(error_fd, kStepCaps, 0, err);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_skipped(error_fd, kStepNoNewPrivs, 0, errno);
}

#if defined(__x86_64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
#endif

// The seccomp filter (sandbox_plan.h, Plan::syscall_filter). Returns 0 or an errno (EINVAL on an
// architecture this file has no filter for). Async-signal-safe: the program lives on the stack.
int install_syscall_filter() {
#if defined(__x86_64__) || defined(__aarch64__)
  constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | EPERM, kAllow = SECCOMP_RET_ALLOW;
  constexpr uint32_t kArgLow = offsetof(seccomp_data, args[0]);  // the flags' low half (little-endian)
  // Jump offsets count the instructions skipped; each comment names the instruction's index.
  sock_filter program[] = {
      /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kNativeArch, 1, 0),
      /* 2 */ BPF_STMT(BPF_RET | BPF_K, kRefuse),  // another ABI (x86's int 0x80): its numbers differ
      /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
#if defined(__x86_64__)
      /* 4 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 9, 0),  // x32's numbers: refused (14)
#else
      /* 4 */ BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0),
#endif
      /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
      /* 6 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),  // its flags are in memory: libc retries with clone
      /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 6, 0),  // refused (14)
      // Joining a namespace that exists already (a user namespace another process of the uid made,
      // reached through /proc or a passed descriptor) is as good as making one: refused outright.
      /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_setns, 5, 0),            // refused (14)
      /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_unshare, 1, 0),          // flags (11)
      /* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 2),           // flags (11), else allowed (13)
      /* 11 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArgLow),
      /* 12 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWUSER, 1, 0),
      /* 13 */ BPF_STMT(BPF_RET | BPF_K, kAllow),
      /* 14 */ BPF_STMT(BPF_RET | BPF_K, kRefuse),
  };
  sock_fprog fprog{static_cast<unsigned short>(sizeof program / sizeof program[0]), program};
  // Without CAP_SYS_ADMIN the kernel takes a filter only under no_new_privs (set already where
  // capabilities were dropped).
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0) return errno;
  return 0;
#else
  return EINVAL;
#endif
}

}  // namespace

void apply_sandbox_plan(const Plan& plan, int error_fd) {
  if (plan.new_group && ::setpgid(0, 0) != 0) child_fail(error_fd, kStageSetpgid);
  if (plan.nice) ::setpriority(PRIO_PROCESS, 0, *plan.nice);  // best effort: only the CPU's order changes
  child_sandbox(plan, error_fd);
  // After the mounts, so that a writable cwd is the writable bind mount.
  if (!plan.cwd.empty() && ::chdir(plan.cwd.c_str()) != 0) child_fail(error_fd, kStageChdir);
  child_drop_privileges(plan, error_fd);
  if (plan.syscall_filter) {
    if (int err = install_syscall_filter(); err != 0) child_skipped(error_fd, kStepSyscallFilter, 0, err);
  }
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json limits = nlohmann::json::array(), mounts = nlohmann::json::array();
  for (const Plan::Limit& l : plan.limits) limits.push_back({l.resource, l.soft, l.hard});
  for (const Plan::ReadOnlyPath& m : plan.readonly_mounts) mounts.push_back({m.path, m.bind_first});
  nlohmann::json json = {{"cwd", plan.cwd}, {"new_group", plan.new_group}, {"limits", limits},
                         {"cgroup_procs", plan.cgroup_procs}, {"new_netns", plan.new_netns},
                         {"read_only", plan.read_only}, {"drop_caps", plan.drop_caps},
                         {"new_pidns", plan.new_pidns}, {"syscall_filter", plan.syscall_filter},
                         {"writable", plan.writable}, {"readonly_mounts", mounts}};
  nlohmann::json tmpfs = nlohmann::json::array();
  for (const Plan::Tmpfs& t : plan.tmpfs) tmpfs.push_back({t.path, t.options});
  json["tmpfs"] = tmpfs;
  if (plan.nice) json["nice"] = *plan.nice;
  return json;
}

Plan plan_from_json(const nlohmann::json& json) {
  Plan plan;
  plan.cwd = json.at("cwd").get<std::string>();
  plan.new_group = json.at("new_group").get<bool>();
  if (json.contains("nice")) plan.nice = json["nice"].get<int>();
  for (const auto& l : json.at("limits")) plan.limits.push_back({l.at(0).get<int>(), l.at(1).get<rlim_t>(), l.at(2).get<rlim_t>()});
  plan.cgroup_procs = json.at("cgroup_procs").get<std::string>();
  plan.new_netns = json.at("new_netns").get<bool>();
  plan.read_only = json.at("read_only").get<bool>();
  plan.drop_caps = json.at("drop_caps").get<bool>();
  plan.new_pidns = json.at("new_pidns").get<bool>();
  plan.syscall_filter = json.at("syscall_filter").get<bool>();
  plan.writable = json.at("writable").get<std::vector<std::string>>();
  for (const auto& m : json.at("readonly_mounts")) plan.readonly_mounts.push_back({m.at(0).get<std::string>(), m.at(1).get<bool>()});
  for (const auto& t : json.at("tmpfs")) plan.tmpfs.push_back({t.at(0).get<std::string>(), t.at(1).get<std::string>()});
  return plan;
}

}  // namespace kz::sandbox_plan
