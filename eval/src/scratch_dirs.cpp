#include "kz/eval/scratch_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <string_view>
#include <vector>

#include "kz/core/files.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLockPrefix = "owner-";
constexpr const char* kLockSuffix = ".lock";

constexpr size_t kTokenLength = 12;  // hex digits
constexpr size_t kUniqueLength = 6;  // mkdtemp's XXXXXX

bool is_token(std::string_view text) {
  return text.size() == kTokenLength &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); });
}

// The owner token in a lock file's name, or "" when `name` is none (exactly owner-<12 hex>.lock:
// a planted "owner-eval.lock" must not make every kz-eval-* dir look like a dead owner's).
std::string token_of_lock(const std::string& name) {
  const std::string prefix = kLockPrefix, suffix = kLockSuffix;
  if (name.size() != prefix.size() + kTokenLength + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  std::string token = name.substr(prefix.size(), kTokenLength);
  return is_token(token) ? token : "";
}

// Whether `name` is a scratch dir of `token`'s: <prefix>-<token>-XXXXXX.
bool owned_by(const std::string& name, const std::string& token) {
  const std::string mark = "-" + token + "-";
  return name.size() > mark.size() + kUniqueLength &&
         name.compare(name.size() - kUniqueLength - mark.size(), mark.size(), mark) == 0;
}

// Takes this process's lock under `parent`: made under a temporary name, locked, then renamed, so no
// sweeper ever sees it unlocked. The descriptor stays open (and locked) until the process exits.
Result<std::string> take_owner_lock(const fs::path& parent) {
  std::random_device random;
  std::string token = fmt::format("{:08x}{:04x}", random(), random() & 0xffff);  // kTokenLength
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

bool ends_a_path(char c) {
  return !(std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("._~+/-", c)));
}

}  // namespace

std::string request_dir_name(int n) {
  return fmt::format("request-{}-{:08x}{:08x}", n, std::random_device{}(), std::random_device{}());
}

std::string scrub_scratch_paths(const std::string& text) {
  static const std::string kMark = "/kz-scratch-";
  auto component_end = [&](size_t from) {
    while (from < text.size() && text[from] != '/' && !ends_a_path(text[from])) ++from;
    return from;
  };
  auto after_slashes = [&](size_t at) {  // "a//b" names a/b too
    while (at < text.size() && text[at] == '/') ++at;
    return at;
  };
  auto next_is = [&](size_t at, const char* prefix) {
    return at < text.size() && text[at] == '/' && text.compare(after_slashes(at), std::strlen(prefix), prefix) == 0;
  };
  std::string out;
  size_t done = 0;
  for (size_t at = text.find(kMark); at != std::string::npos; at = text.find(kMark, done)) {
    size_t start = at;  // back to the path's start: its first '/' ("-I/tmp/..." keeps its "-I")
    while (start > done && !ends_a_path(text[start - 1])) --start;
    start = std::min(text.find('/', start), at);
    size_t end = component_end(at + 1);                          // kz-scratch-<uid>
    if (next_is(end, "")) end = component_end(after_slashes(end));          // the worker's dir
    if (next_is(end, "request-")) end = component_end(after_slashes(end));  // a fork server's request dir
    out.append(text, done, start - done);
    out += "<scratch>";
    done = end;
  }
  out.append(text, done, std::string::npos);
  // What is left of a path cut before its kz-scratch part (a traceback or stderr kept by its tail):
  // a worker's dir or a request dir by its name alone.
  static const std::regex kBareNames(
      R"((?:[A-Za-z0-9._~+-]*/)*(?:kz-[a-z]+-[0-9a-f]{12}-[A-Za-z0-9]{6}|request-[0-9]+-[0-9a-f]{16}))");
  return std::regex_replace(out, kBareNames, "<scratch>");
}

Result<fs::path> scratch_parent(const fs::path& scratch_root) {
  fs::path parent = scratch_root / fmt::format("kz-scratch-{}", ::geteuid());
  KZ_RETURN_IF_ERROR(make_unlistable_dir(parent).with_context("making the scratch dirs' parent"));
  return parent;
}

int sweep_dead_owners(const fs::path& parent) {
  std::error_code error;
  std::vector<std::string> names;
  for (auto it = fs::directory_iterator(parent, error); !error && it != fs::directory_iterator(); it.increment(error))
    names.push_back(it->path().filename().string());
  int removed = 0;
  for (const std::string& name : names) {
    std::string token = token_of_lock(name);
    if (token.empty()) continue;
    int fd = ::open((parent / name).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat info {};
    bool ours = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_uid == ::geteuid();
    if (ours && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its owner is gone
      bool all_gone = true;
      for (const std::string& other : names) {
        if (!owned_by(other, token)) continue;
        fs::remove_all(parent / other, error);
        if (error) all_gone = false;  // the lock stays: a later sweep tries again
        else ++removed;
      }
      if (all_gone) ::unlink((parent / name).c_str());
    }
    ::close(fd);
  }
  return removed;
}

namespace {

// What scratch_over_bound has seen so far, and its verdict once one is reached.
struct ScratchWalk {
  const ScratchBound& bound;
  uint64_t bytes = 0, entries = 0;
  uint64_t removed_bytes = 0;  // of `bytes`: files removed from the dir but still open or mapped
  std::optional<std::string> over = std::nullopt;

  bool count(const struct stat& info, bool removed = false) {
    uint64_t size = static_cast<uint64_t>(info.st_blocks) * 512;
    bytes += size;
    removed_bytes += removed ? size : 0;
    ++entries;
    if (bound.max_bytes > 0 && bytes > bound.max_bytes)
      over = fmt::format("its scratch dir held more than {} MB (sandbox.scratch_mb){}", bound.max_bytes >> 20,
                         removed_bytes > 0 ? fmt::format(", {:.1f} MB of it in files removed but still open or mapped",
                                                         double(removed_bytes) / (1 << 20))
                                           : "");
    else if (bound.max_entries > 0 && entries > bound.max_entries)
      over = fmt::format("its scratch dir held more than {} files (sandbox.scratch_files)", bound.max_entries);
    return !over;
  }
  bool refuse(const std::string& why) {
    over = "its scratch dir could not be measured: " + why;
    return false;
  }
};

constexpr int kMaxScratchDepth = 64;  // deeper is no build's and would cost a descriptor a level

// Counts what directory `fd` (owned, closed here) holds, through descriptors: no path is ever
// resolved again, so neither depth nor name length hides anything, and no link is followed. An
// entry gone since listed is skipped (the candidate may be removing files); any other error is
// a verdict, since a tree the supervisor cannot read is one it cannot bound. False once `walk`
// has its verdict.
bool walk_directory(int fd, int depth, ScratchWalk& walk) {
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    ::close(fd);
    return walk.refuse(fmt::format("opening a directory: {}", std::strerror(errno)));
  }
  bool going = true;
  while (going) {
    errno = 0;
    struct dirent* entry = ::readdir(dir);
    if (!entry) {
      if (errno != 0) going = walk.refuse(fmt::format("reading a directory: {}", std::strerror(errno)));
      break;
    }
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    struct stat info {};
    if (::fstatat(::dirfd(dir), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) going = walk.refuse(fmt::format("{}: {}", entry->d_name, std::strerror(errno)));
      continue;
    }
    going = walk.count(info);
    if (!going || !S_ISDIR(info.st_mode)) continue;
    if (depth + 1 > kMaxScratchDepth) {
      going = walk.refuse(fmt::format("directories nested deeper than {}", kMaxScratchDepth));
      continue;
    }
    int child = ::openat(::dirfd(dir), entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0) {
      if (errno != ENOENT) going = walk.refuse(fmt::format("{}: {}", entry->d_name, std::strerror(errno)));
      continue;
    }
    going = walk_directory(child, depth + 1, walk);
  }
  ::closedir(dir);
  return going;
}

// How a look finds the files removed from the scratch dir that its holders still hold. An open
// file counts where it lies on the scratch dir's filesystem (`device`): a worker can write nowhere
// else there (the read-only mounts), and its link's text may name no path under the dir (one past
// PATH_MAX cannot be read; a mount of its own shows another). A mapping counts where its path in
// maps lies under the dir (`prefix`: its real path and "/"), so that a library replaced beside it
// while a long-lived server maps the old one is not the worker's.
struct RemovedFileSearch {
  dev_t device;
  std::string prefix;
  std::set<std::pair<dev_t, ino_t>> seen;  // each file once, however many hold it
  ScratchWalk& walk;

  // Counts the file behind /proc link `link` where it is a regular file with no name left (a file
  // named "... (deleted)" has one), once; false once `walk` has its verdict.
  bool count(const fs::path& link, bool on_device_only) {
    struct stat info {};
    if (::stat(link.c_str(), &info) != 0) return true;  // closed, unmapped or refused meanwhile
    if (!S_ISREG(info.st_mode) || info.st_nlink != 0 || (on_device_only && info.st_dev != device)) return true;
    return !seen.insert({info.st_dev, info.st_ino}).second || walk.count(info, true);
  }
};

// Whether this process may follow /proc/<pid>/map_files links (CAP_SYS_ADMIN, or CAP_CHECKPOINT_RESTORE,
// in the first user namespace; root in a container often has neither), asked of its own until the
// answer is a yes or a refusal (another error, a descriptor short or a mapping gone, asks again).
bool map_files_followable() {
  static std::atomic<int> known{-1};  // -1: not known yet, 0: refused, 1: followable
  if (known >= 0) return known == 1;
  DIR* dir = ::opendir("/proc/self/map_files");
  int answer = dir ? -1 : (errno == EPERM || errno == EACCES ? 0 : -1);
  while (struct dirent* entry = dir ? ::readdir(dir) : nullptr) {
    if (entry->d_name[0] == '.') continue;
    struct stat info {};
    if (::stat((std::string("/proc/self/map_files/") + entry->d_name).c_str(), &info) == 0) answer = 1;
    else if (errno == EPERM || errno == EACCES) answer = 0;
    break;
  }
  if (dir) ::closedir(dir);
  if (answer >= 0) known = answer;
  return answer == 1;
}

// map_files' name for a maps line's range ("start-end", without maps' zero padding, which
// map_files refuses), or "" where the line starts with none.
std::string map_files_name(std::string_view line) {
  unsigned long long start = 0, end = 0;
  size_t dash = line.find('-'), space = line.find(' ');
  if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) return {};
  auto first = std::from_chars(line.data(), line.data() + dash, start, 16);
  auto second = std::from_chars(line.data() + dash + 1, line.data() + space, end, 16);
  if (first.ec != std::errc() || second.ec != std::errc()) return {};
  return fmt::format("{:x}-{:x}", start, end);
}

// The files removed from the scratch dir that process `pid` still holds open (/proc/<pid>/fd: the
// thread group leader's table) or mapped (/proc/<pid>/maps, its lines marked "(deleted)" under the
// dir, followed through map_files where that is allowed). They take their disk until the last
// holder lets go, and no walk of the dir finds them. A process gone meanwhile, or one whose /proc
// entries this process may not read, is skipped (fork servers make themselves non-dumpable).
void count_removed_files(pid_t pid, RemovedFileSearch& search) {
  fs::path proc = fs::path("/proc") / std::to_string(pid);
  if (DIR* fds = ::opendir((proc / "fd").c_str())) {
    while (struct dirent* entry = ::readdir(fds))
      if (entry->d_name[0] != '.' && !search.count(proc / "fd" / entry->d_name, true)) break;
    ::closedir(fds);
  }
  if (search.walk.over || !map_files_followable()) return;
  auto maps = read_file(proc / "maps");
  if (!maps.ok()) return;
  constexpr std::string_view kRemoved = " (deleted)";
  for (size_t start = 0, end; start < maps->size(); start = end + 1) {
    end = maps->find('\n', start);
    if (end == std::string::npos) end = maps->size();
    std::string_view line(maps->data() + start, end - start);
    size_t path = line.find('/');  // no field before the path holds one
    if (path == std::string_view::npos || !line.ends_with(kRemoved) || !line.substr(path).starts_with(search.prefix))
      continue;
    std::string name = map_files_name(line);
    if (!name.empty() && !search.count(proc / "map_files" / name, false)) return;
  }
}

}  // namespace

std::optional<std::string> scratch_over_bound(const fs::path& dir, const ScratchBound& bound,
                                              const std::vector<pid_t>& holders) {
  if (!bound.any()) return std::nullopt;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // not there (yet, or any more): nothing held
  struct stat root {};
  int root_error = ::fstat(fd, &root) == 0 ? 0 : errno;
  ScratchWalk walk{bound};
  if (!walk_directory(fd, 0, walk) || holders.empty()) return walk.over;
  if (root_error != 0) {
    walk.refuse(fmt::format("its filesystem: {}", std::strerror(root_error)));
    return walk.over;
  }
  std::error_code error;
  fs::path real = fs::canonical(dir, error);  // what the holders' maps show
  if (error) return walk.over;                // removed meanwhile: nothing held there
  RemovedFileSearch search{root.st_dev, real.string() + "/", {}, walk};
  for (pid_t pid : holders) {
    count_removed_files(pid, search);
    if (walk.over) break;
  }
  return walk.over;
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
      if (!taken.ok())  // no lock (a filesystem without flock?): dirs without a token, never swept
        std::fprintf(stderr, "kz: %s; scratch dirs there will not be swept after this process\n",
                     taken.status().to_string().c_str());
      it = tokens.emplace(*parent, taken.ok() ? *taken : "").first;
    }
    token = it->second;
  }
  return make_unique_dir(*parent, token.empty() ? prefix : prefix + token + "-");
}

}  // namespace kz
