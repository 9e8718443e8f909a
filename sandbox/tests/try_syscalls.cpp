// Test helper: tries the system calls the sandbox's seccomp filter refuses (ProcessSpec::
// syscall_filter), and two it must leave alone, and prints one "name=result" line each: "ok", an
// errno name, "crashed" or "n/a". sandbox_test's SubprocessSandbox tests run it with and without the
// filter.
#include <fcntl.h>
#include <linux/io_uring.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace {

const char* result(long returned) { return returned >= 0 ? "ok" : strerrorname_np(errno); }

// Runs `call` in a forked child (a user namespace it makes, or a crash, stays there) and prints
// what it returned: the child passes the errno (or 0) as its exit code.
template <typename Call>
void in_child(const char* name, Call call) {
  pid_t pid = ::fork();
  if (pid == 0) {
    long returned = call();
    ::_exit(returned >= 0 ? 0 : errno);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) {
    std::printf("%s=crashed\n", name);
  } else {
    int err = WEXITSTATUS(status);
    std::printf("%s=%s\n", name, err == 0 ? "ok" : strerrorname_np(err));
  }
}

}  // namespace

int main() {
  in_child("unshare_user", [] { return static_cast<long>(::unshare(CLONE_NEWUSER)); });
  in_child("clone_user", [] {
    long pid = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
    if (pid == 0) ::_exit(0);
    if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
    return pid;
  });
  // Its own user namespace: EINVAL (it is in it already) without the filter, EPERM with it.
  in_child("setns_user", [] {
    int fd = ::open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -1L : static_cast<long>(::setns(fd, CLONE_NEWUSER));
  });
  // No arguments: EINVAL from a kernel that has clone3, ENOSYS from the filter (or an old kernel).
  std::printf("clone3=%s\n", result(::syscall(SYS_clone3, nullptr, 0)));
  io_uring_params params{};
  long ring = ::syscall(SYS_io_uring_setup, 1, &params);
  std::printf("io_uring=%s\n", result(ring));
  if (ring >= 0) ::close(static_cast<int>(ring));
#if defined(__x86_64__)
  // getpid through the 32-bit ABI (its number 20); a kernel without it faults the child.
  in_child("int80", [] {
    long returned = 20;
    asm volatile("int $0x80" : "+a"(returned) : : "memory");
    if (returned < 0) errno = static_cast<int>(-returned);
    return returned;
  });
#else
  std::printf("int80=n/a\n");
#endif
  bool threaded = false;
  std::thread([&] { threaded = true; }).join();
  std::printf("thread=%s\n", threaded ? "ok" : "failed");
  in_child("fork", [] { return 0L; });
  return 0;
}
