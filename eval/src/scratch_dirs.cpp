#include "kz/eval/scratch_dirs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "kz/core/files.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLockPrefix = "owner-";
constexpr const char* kLockSuffix = ".lock";

// The owner token in a lock file's name, or "" when `name` is none.
std::string token_of_lock(const std::string& name) {
  const std::string prefix = kLockPrefix, suffix = kLockSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  return name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
}

// Takes this process's lock under `parent`: made under a temporary name, locked, then renamed, so no
// sweeper ever sees it unlocked. The descriptor stays open (and locked) until the process exits.
Result<std::string> take_owner_lock(const fs::path& parent) {
  std::random_device random;
  std::string token = fmt::format("{:08x}{:04x}", random(), random() & 0xffff);
  fs::path staging = parent / fmt::format(".{}{}{}", kLockPrefix, token, kLockSuffix);
  int fd = ::open(staging.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return io_error(fmt::format("making {}: {}", staging.string(), std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 ||
      ::rename(staging.c_str(), (parent / (kLockPrefix + token + kLockSuffix)).c_str()) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(staging.c_str());
    return io_error(fmt::format("taking the scratch owner lock in {}: {}", parent.string(), std::strerror(err)));
  }
  return token;  // fd deliberately left open: the lock lives as long as this process
}

bool ends_a_path(char c) { return std::isspace(static_cast<unsigned char>(c)) || std::strchr("'\"`<>()[]{},;:", c); }

}  // namespace

std::string scrub_scratch_paths(const std::string& text) {
  static const std::string kMark = "/kz-scratch-";
  auto component_end = [&](size_t from) {
    while (from < text.size() && text[from] != '/' && !ends_a_path(text[from])) ++from;
    return from;
  };
  auto next_is = [&](size_t at, const char* prefix) {
    return at < text.size() && text[at] == '/' && text.compare(at + 1, std::strlen(prefix), prefix) == 0;
  };
  std::string out;
  size_t done = 0;
  for (size_t at = text.find(kMark); at != std::string::npos; at = text.find(kMark, done)) {
    size_t start = at;  // back to the path's start
    while (start > done && !ends_a_path(text[start - 1])) --start;
    size_t end = component_end(at + 1);                          // kz-scratch-<uid>
    if (next_is(end, "")) end = component_end(end + 1);           // the worker's dir
    if (next_is(end, "request-")) end = component_end(end + 1);   // a fork server's request dir
    out.append(text, done, start - done);
    out += "<scratch>";
    done = end;
  }
  out.append(text, done, std::string::npos);
  return out;
}

Result<fs::path> scratch_parent(const fs::path& scratch_root) {
  fs::path parent = scratch_root / fmt::format("kz-scratch-{}", ::geteuid());
  KZ_RETURN_IF_ERROR(make_unlistable_dir(parent).with_context("making the scratch dirs' parent"));
  return parent;
}

int sweep_dead_owners(const fs::path& parent) {
  std::error_code error;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(parent, error)) names.push_back(entry.path().filename().string());
  int removed = 0;
  for (const std::string& name : names) {
    std::string token = token_of_lock(name);
    if (token.empty()) continue;
    int fd = ::open((parent / name).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its owner is gone
      const std::string mark = "-" + token + "-";
      for (const std::string& other : names)
        if (other.find(mark) != std::string::npos && fs::remove_all(parent / other, error) > 0 && !error) ++removed;
      ::unlink((parent / name).c_str());
    }
    ::close(fd);
  }
  return removed;
}

Result<fs::path> make_scratch_dir(const fs::path& scratch_root, const std::string& prefix, bool keep) {
  auto parent = scratch_parent(scratch_root);
  if (!parent.ok()) return parent.status();
  if (keep) return make_unique_dir(*parent, prefix);
  static std::mutex mutex;
  static std::map<fs::path, std::string> tokens;  // per parent: a process may use several roots
  std::string token;
  {
    std::lock_guard lock(mutex);
    auto it = tokens.find(*parent);
    if (it == tokens.end()) {
      sweep_dead_owners(*parent);
      auto taken = take_owner_lock(*parent);
      if (!taken.ok()) return taken.status();
      it = tokens.emplace(*parent, *taken).first;
    }
    token = it->second;
  }
  return make_unique_dir(*parent, prefix + token + "-");
}

}  // namespace kz
