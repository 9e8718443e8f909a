// The read-only mount list and tmpfs mount data (mounts.h), computed by the parent before fork:
// reading /proc/self/mountinfo needs allocation, which the child between fork and exec must not do.
#include "mounts.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include <fmt/format.h>

#include "proc_scan.h"

namespace kz::detail {

using sandbox_plan::Plan;

std::string tmpfs_options(uint64_t size_bytes) {
  return fmt::format("size={},nr_inodes={},mode=1777", size_bytes, std::max<uint64_t>(1024, size_bytes >> 14));
}

bool is_under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         (dir.back() == '/' || path[dir.size()] == '/'));
}

std::vector<Plan::ReadOnlyPath> mounts_to_protect(const std::vector<std::string>& writable, bool fresh_proc) {
  auto unescape = [](const std::string& text) {  // mountinfo writes ' ', '\t', '\n', '\\' as \ooo
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 3 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
        out += static_cast<char>((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0'));
        i += 3;
      } else {
        out += text[i];
      }
    }
    return out;
  };
  std::vector<Plan::ReadOnlyPath> mounts;
  auto add = [&mounts](std::string path, bool bind_first) {
    auto same = [&](const Plan::ReadOnlyPath& m) { return m.path == path; };
    if (std::none_of(mounts.begin(), mounts.end(), same)) mounts.push_back({std::move(path), bind_first});
  };
  std::istringstream info(read_small_file("/proc/self/mountinfo").value_or(""));
  for (std::string line; std::getline(info, line);) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, point, word;
    fields >> id >> parent >> devno >> root >> point;
    while (fields >> word && word != "-") {
    }
    std::string fstype;
    fields >> fstype;
    if (point.empty() || fstype == "autofs") continue;
    point = unescape(point);
    if (std::any_of(writable.begin(), writable.end(), [&](const std::string& w) { return is_under(point, w); })) continue;
    if (fstype == "proc") {
      add(point + "/sys", true);
      add(point + "/sysrq-trigger", true);
    } else {
      add(point, fresh_proc && is_under(point, "/proc"));
    }
  }
  return mounts;
}

}  // namespace kz::detail
