// The pids cgroups behind the process-count cap (cgroups.h): finding or making the base (v2 or v1),
// clearing what supervisors that are gone left there, and reading and removing one process's
// cgroup. A process is moved into its cgroup by the child itself (sandbox_plan.h, the cgroup step).
#include "cgroups.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "proc_scan.h"

namespace kz::detail {

std::string pids_cgroup_base(std::string& why) {
  static std::mutex mutex;
  static std::string base, reason;
  static bool done = false;
  if (const char* off = std::getenv("KZ_SANDBOX_NO_CGROUP"); off && *off && std::string(off) != "0") {
    why = "disabled by KZ_SANDBOX_NO_CGROUP";  // tests and debugging: the polling path
    return "";
  }
  std::lock_guard lock(mutex);
  if (!done) {
    done = true;
    auto make_base = [&](const std::string& dir) -> bool {
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        reason = fmt::format("mkdir {}: {}", dir, std::strerror(errno));
        return false;
      }
      return true;
    };
    if (auto controllers = read_small_file("/sys/fs/cgroup/cgroup.controllers")) {
      std::string dir = "/sys/fs/cgroup/kernelzero";
      std::istringstream words(*controllers);
      bool has_pids = false;
      for (std::string word; words >> word;) has_pids |= word == "pids";
      if (!has_pids) {
        reason = "cgroup v2 without the pids controller";
      } else if (make_base(dir)) {
        auto root_control = read_small_file("/sys/fs/cgroup/cgroup.subtree_control").value_or("");
        if (root_control.find("pids") == std::string::npos)
          write_small_file("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
        if (write_small_file(dir + "/cgroup.subtree_control", "+pids")) base = dir;
        else reason = fmt::format("enabling pids in {}: {}", dir, std::strerror(errno));
      }
    } else if (::access("/sys/fs/cgroup/pids/cgroup.procs", F_OK) == 0) {
      std::string dir = "/sys/fs/cgroup/pids/kernelzero";
      if (make_base(dir)) base = dir;
    } else {
      reason = "no pids cgroup controller mounted";
    }
    if (!base.empty()) {
      // Remove what supervisors that are gone left behind (their groups were killed, or are empty).
      if (DIR* dir = ::opendir(base.c_str())) {
        while (dirent* entry = ::readdir(dir)) {
          pid_t owner = static_cast<pid_t>(to_ll(entry->d_name));
          if (owner > 0 && owner != ::getpid() && ::kill(owner, 0) != 0 && errno == ESRCH)
            ::rmdir((base + "/" + entry->d_name).c_str());
        }
        ::closedir(dir);
      }
    }
  }
  why = reason;
  return base;
}

std::vector<pid_t> cgroup_members(const std::string& dir) {
  std::vector<pid_t> pids;
  std::istringstream in(read_small_file(dir + "/cgroup.procs").value_or(""));
  for (long long pid; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

void remove_cgroup(const std::string& dir) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    for (pid_t pid : cgroup_members(dir)) ::kill(pid, SIGKILL);
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

long long cgroup_max_events(const std::string& dir) {
  auto text = read_small_file(dir + "/pids.events");
  if (!text) return 0;
  size_t pos = text->find("max ");
  return pos == std::string::npos ? 0 : to_ll(std::string_view(*text).substr(pos + 4));
}

}  // namespace kz::detail
