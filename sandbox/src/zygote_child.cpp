// kz_zygote_child: the shared library a zygote (worker/kz_worker/zygote.py) loads, so that its
// children apply to themselves the very sandbox steps Process::spawn's children do
// (sandbox_plan.h), not a second copy of them in Python.
#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include <cerrno>
#include <map>
#include <string>

#include "sandbox_plan.h"

namespace {
using namespace kz::sandbox_plan;

constexpr int kHighFd = 10;  // received descriptors move here first, clear of the 0..4 targets

// Closes every descriptor from `first` on but `keep`: the child keeps only its own. Any of the
// zygote's left open (its control socket above all: a candidate holding it could ask for an
// unsandboxed process) is an escape, so where close_range is refused (kernels before 5.9, seccomp
// profiles) the descriptors /proc/self/fd lists are closed one by one; false where neither works.
bool close_all_from(int first, int keep) {
  bool ranged = (keep <= first || ::syscall(SYS_close_range, first, keep - 1, 0) == 0) &&
                ::syscall(SYS_close_range, std::max(first, keep + 1), ~0U, 0) == 0;
  if (ranged) return true;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  std::vector<int> open;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    int fd = std::atoi(entry->d_name);
    if (fd >= first && fd != keep && fd != ::dirfd(dir)) open.push_back(fd);
  }
  ::closedir(dir);
  for (int fd : open) ::close(fd);
  return true;
}
}  // namespace

// Called by a zygote's child right after the fork, before it runs anything of its own.
// `request` is the zygote's spawn request ({"plan": ..., "fds": [names]}), `fds` the descriptors it
// came with, in the order of its "fds" names (the error pipe last). Puts stdin, stdout, stderr,
// the message pipe and the control socket at 0..4, closes every other descriptor (the zygote's
// socket and its other children's pidfds among them: the caller forgets its Python objects for
// them first), applies the plan and closes the error pipe: EOF tells the supervisor the child is
// set up. Returns 0; a fatal step writes its record and _exit(127)s; -1 where the request does
// not parse (nothing was changed).
extern "C" int kz_zygote_child_setup(const char* request_text, const int* fds, int nfds) {
  static const std::map<std::string, int> kTargets = {{"stdin", 0}, {"stdout", 1}, {"stderr", 2}, {"message", 3},
                                                      {"control", 4}};
  auto request = nlohmann::json::parse(request_text, nullptr, false);
  if (!request.is_object() || !request.contains("plan") || !request.contains("fds") ||
      !request["fds"].is_array() || static_cast<int>(request["fds"].size()) != nfds || nfds < 1 ||
      request["fds"].back() != "error") {
    errno = EINVAL;
    return -1;
  }
  Plan plan;
  try {
    plan = plan_from_json(request["plan"]);
  } catch (const nlohmann::json::exception&) {
    errno = EINVAL;
    return -1;
  }
  int high[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  if (nfds > 8) return errno = EINVAL, -1;
  for (int i = 0; i < nfds; ++i) high[i] = ::fcntl(fds[i], F_DUPFD, kHighFd);
  int error_fd = high[nfds - 1];
  if (error_fd < 0) return -1;
  int first_free = 3;
  for (int i = 0; i + 1 < nfds; ++i) {
    auto target = kTargets.find(request["fds"][i].get<std::string>());
    if (target == kTargets.end() || high[i] < 0 || ::dup2(high[i], target->second) < 0)
      child_fail(error_fd, kStageDup2);
    first_free = std::max(first_free, target->second + 1);
  }
  errno = 0;
  if (!close_all_from(first_free, error_fd)) child_fail(error_fd, kStageDup2);
  apply_sandbox_plan(plan, error_fd);
  ::close(error_fd);
  return 0;
}
