// What the supervisor reads from /proc and writes to small kernel files (cgroup knobs): a process
// group's members and tasks, a user's tasks, a process's CPU time. The process-count cap polls
// these where no pids cgroup is available, and kill_and_reap waits on them for a killed group to end.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kz::detail {

// A whole small file (procfs, cgroupfs); nullopt where it cannot be opened.
std::optional<std::string> read_small_file(const std::string& path);
// Writes `text` to an existing file in one write(); false (errno says why) where it fails.
bool write_small_file(const std::string& path, const std::string& text);

// The fields of /proc/<pid>/stat after the command name: [0] is field 3 (state).
std::vector<std::string_view> stat_fields(std::string_view text);

// The leading decimal integer of `text` (a '-' sign allowed), 0 where there is none.
long long to_ll(std::string_view text);

// Calls fn(pid) for every process in /proc.
template <class Fn>
void for_each_process(Fn fn) {
  DIR* dir = ::opendir("/proc");
  if (!dir) return;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    fn(static_cast<pid_t>(to_ll(entry->d_name)));
  }
  ::closedir(dir);
}

// Calls fn(pid, fields) with the /proc/<pid>/stat fields (stat_fields) of every process in process
// group `pgid`, zombies included.
template <class Fn>
void for_each_group_member(pid_t pgid, Fn fn) {
  for_each_process([&](pid_t pid) {
    auto text = read_small_file("/proc/" + std::to_string(pid) + "/stat");
    if (!text) return;
    auto f = stat_fields(*text);
    if (f.size() > 2 && to_ll(f[2]) == pgid) fn(pid, f);
  });
}

// Tasks (threads included, zombies counted) of the processes in process group `pgid`.
uint64_t count_group_tasks(pid_t pgid);

// Whether a process of group `pgid` still runs (zombies do not count: they hold nothing but a pid).
bool group_has_live_members(pid_t pgid);

// Tasks of the processes owned by `uid` (what RLIMIT_NPROC counts, near enough).
uint64_t count_user_tasks(uid_t uid);

// User + system CPU seconds of a process (a zombie too, until reaped); -1 if unreadable.
double process_cpu_seconds(pid_t pid);

}  // namespace kz::detail
