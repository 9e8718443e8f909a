// The parent's side of the child's read-only mount namespace: which mounts to remount read-only
// (from the parent's /proc/self/mountinfo, which the child's new namespace copies) and the mount
// data of a fresh tmpfs. Prepared before fork, so the child only mounts (sandbox_plan.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sandbox_plan.h"

namespace kz::detail {

// A fresh tmpfs's mount data: its size, and files at most one per 16 KiB of it (at least 1024). tmpfs
// bounds its inodes by half the RAM's pages otherwise, and an inode's kernel memory is not counted in
// `size`: a million empty files would take ~1 GB of it, and as long to remove between requests.
std::string tmpfs_options(uint64_t size_bytes);

// Whether `path` is `dir` or lies below it (both canonical).
bool is_under(const std::string& path, const std::string& dir);

// Paths to remount read-only: every mount in our namespace but the writable paths, what lies
// under them, and autofs (remounting it could trigger or break automounts). procfs stays writable
// (CUDA's driver fails to start on a read-only /proc: error 304, seen on the H200 host), but its
// global knobs do not: /proc/sys and /proc/sysrq-trigger, which root writes without capabilities.
// Under a fresh /proc (`fresh_proc`: a new PID namespace) the parent's mounts below /proc are not
// there to remount: their paths are bound onto themselves first, as /proc/sys is.
std::vector<sandbox_plan::Plan::ReadOnlyPath> mounts_to_protect(const std::vector<std::string>& writable, bool fresh_proc);

}  // namespace kz::detail
