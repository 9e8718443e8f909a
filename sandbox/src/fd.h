// An owned file descriptor and the deadline arithmetic of poll loops, shared by the process side
// (process.cpp: pipes, pidfds) and the zygote's control socket (zygote_channel.cpp). Header-only:
// a few lines each.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace kz::detail {

using Clock = std::chrono::steady_clock;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);  // no EINTR retry: on Linux the fd is gone either way
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Milliseconds until `deadline` for poll(): 0 once it passed, never more than poll takes.
inline int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

}  // namespace kz::detail
