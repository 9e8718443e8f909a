// The pids cgroups that cap a sandboxed process's task count (ResourceLimits::max_processes): one
// per process under a base the supervisor makes once. Where no cgroup can be used, the caller
// falls back to polling the process group (proc_scan.h) and says why.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace kz::detail {

// The pids cgroups: <base>/<supervisor pid>-<n>, one per sandboxed process with a task cap.
// base: /sys/fs/cgroup/kernelzero (v2, pids enabled in its subtree) or
// /sys/fs/cgroup/pids/kernelzero (v1). Empty with a reason when neither can be used.
std::string pids_cgroup_base(std::string& why);

// The processes in cgroup `dir`.
std::vector<pid_t> cgroup_members(const std::string& dir);

// Kills every process of the cgroup, then removes it (bounded: about 1 s).
void remove_cgroup(const std::string& dir);

// How often a fork was refused at pids.max ("max N" in pids.events).
long long cgroup_max_events(const std::string& dir);

}  // namespace kz::detail
