// /proc scans and small-file I/O for the supervisor (proc_scan.h), and parent_process
// (kz/sandbox/process.h). Kept apart from the spawning code: these are plain reads of kernel
// files, used by the process-count cap, the group kill and the cgroups alike.
#include "proc_scan.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "kz/sandbox/process.h"

namespace kz {
namespace detail {

std::optional<std::string> read_small_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

bool write_small_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = errno;
  ::close(fd);
  errno = err;
  return n == static_cast<ssize_t>(text.size());
}

std::vector<std::string_view> stat_fields(std::string_view text) {
  std::vector<std::string_view> fields;
  size_t paren = text.rfind(')');
  if (paren == std::string_view::npos) return fields;
  size_t pos = paren + 1;
  while (pos < text.size()) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    size_t end = text.find(' ', pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) fields.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return fields;
}

long long to_ll(std::string_view text) {
  long long value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') break;
    value = value * 10 + (c - '0');
  }
  return text.size() > 0 && text[0] == '-' ? -to_ll(text.substr(1)) : value;
}

uint64_t count_group_tasks(pid_t pgid) {
  uint64_t tasks = 0;
  for_each_group_member(pgid, [&](pid_t, const std::vector<std::string_view>& f) {
    if (f.size() > 17) tasks += static_cast<uint64_t>(std::max(1LL, to_ll(f[17])));
  });
  return tasks;
}

bool group_has_live_members(pid_t pgid) {
  if (::kill(-pgid, 0) != 0) return false;  // no member at all: the usual case, without a /proc scan
  bool live = false;
  for_each_group_member(pgid, [&](pid_t, const std::vector<std::string_view>& f) { live |= f[0] != "Z" && f[0] != "X"; });
  return live;
}

uint64_t count_user_tasks(uid_t uid) {
  uint64_t tasks = 0;
  for_each_process([&](pid_t pid) {
    std::string dir = "/proc/" + std::to_string(pid);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || st.st_uid != uid) return;
    auto text = read_small_file(dir + "/stat");
    auto f = text ? stat_fields(*text) : std::vector<std::string_view>{};
    tasks += f.size() > 17 ? static_cast<uint64_t>(std::max(1LL, to_ll(f[17]))) : 1;
  });
  return tasks;
}

double process_cpu_seconds(pid_t pid) {
  auto text = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  if (!text) return -1;
  auto f = stat_fields(*text);
  if (f.size() < 13) return -1;
  return static_cast<double>(to_ll(f[11]) + to_ll(f[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace detail

std::optional<pid_t> parent_process(pid_t pid) {
  auto text = detail::read_small_file("/proc/" + std::to_string(pid) + "/stat");
  auto f = text ? detail::stat_fields(*text) : std::vector<std::string_view>{};
  if (f.size() < 2) return std::nullopt;
  return static_cast<pid_t>(detail::to_ll(f[1]));
}

}  // namespace kz
