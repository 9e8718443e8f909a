// Filesystem helpers on raw POSIX calls, so every failure carries the path and strerror(errno).
#include "kz/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <system_error>
#include <vector>

namespace kz {
namespace {

Status errno_status(const char* what, const fs::path& path, int err) {
  std::string msg = std::string(what) + " " + path.string() + ": " + std::strerror(err);
  return err == ENOENT ? not_found(std::move(msg)) : io_error(std::move(msg));
}

// Writes all of `data`, retrying on short writes and EINTR.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int open_retry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do fd = ::open(path, flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

Status read_file_chunks(const fs::path& path, const std::function<void(std::string_view)>& chunk) {
  int fd = open_retry(path.c_str(), O_RDONLY);
  if (fd < 0) return errno_status("reading", path, errno);
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return errno_status("reading", path, err);
    }
    if (n == 0) break;
    chunk(std::string_view(buf, static_cast<size_t>(n)));
  }
  ::close(fd);
  return Status::ok();
}

Result<std::string> read_file(const fs::path& path) {
  std::string out;
  KZ_RETURN_IF_ERROR(read_file_chunks(path, [&](std::string_view piece) { out.append(piece); }));
  return out;
}

Status fsync_path(const fs::path& path) {
  int fd = open_retry(path.c_str(), O_RDONLY);
  if (fd < 0) return errno_status("opening", path, errno);
  int rc;
  do rc = ::fsync(fd);
  while (rc != 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  return rc == 0 ? Status::ok() : errno_status("fsync", path, err);
}

Status write_file_atomic(const fs::path& path, std::string_view content) {
  // pid + a per-process counter: concurrent writers (processes or threads) never share a temp.
  static std::atomic<unsigned> counter{0};
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno_status("writing", tmp, errno);
  // fsync before rename: after a crash the file is either the old or the complete new one.
  bool ok = write_all(fd, content) && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return errno_status("writing", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return errno_status("renaming to", path, err);
  }
  return Status::ok();
}

Status append_line(const fs::path& path, std::string_view line) {
  int fd = open_retry(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return errno_status("appending to", path, errno);
  // One write() of line+'\n' keeps concurrent appenders from interleaving within a line.
  std::string buf(line);
  buf.push_back('\n');
  bool ok = write_all(fd, buf) && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  return ok ? Status::ok() : errno_status("appending to", path, err);
}

Status make_unlistable_dir(const fs::path& dir) {
  const mode_t mode = ::geteuid() == 0 ? 0311 : 0700;
  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  if (ec) return io_error("creating directory " + dir.parent_path().string() + ": " + ec.message());
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return errno_status("creating directory", dir, errno);
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0) return errno_status("checking", dir, errno);
  if (!S_ISDIR(info.st_mode) || info.st_uid != ::geteuid())
    return io_error(dir.string() + " is not a directory of this user's own (a symlink, or another user's?)");
  if ((info.st_mode & 07777) != mode && ::chmod(dir.c_str(), mode) != 0) return errno_status("chmod", dir, errno);
  return Status::ok();
}

Result<fs::path> make_unique_dir(const fs::path& parent, std::string_view prefix) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return io_error("creating directory " + parent.string() + ": " + ec.message());
  std::string templ = (parent / (std::string(prefix) + "XXXXXX")).string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return errno_status("creating directory in", parent, errno);
  return fs::path(buf.data());
}

}  // namespace kz
