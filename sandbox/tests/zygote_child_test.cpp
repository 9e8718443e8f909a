// kz_zygote_child_setup (sandbox/src/zygote_child.cpp), loaded as a zygote loads it, under a seccomp
// filter that refuses what some machines refuse: the child still closes every descriptor it must
// not keep (the zygote's control socket would let a candidate ask for an unsandboxed process), or
// fails closed where it cannot.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "refuse_syscalls.h"

namespace {

using ChildSetup = int (*)(const char*, const int*, int);

// The sandbox plan that changes nothing: only the descriptors are at stake here.
constexpr const char* kRequest =
    R"({"plan": {"cwd": "", "new_group": false, "limits": [], "cgroup_procs": "", "new_netns": false,
                 "read_only": false, "drop_caps": false, "new_pidns": false, "syscall_filter": false, "writable": [],
                 "readonly_mounts": [], "tmpfs": []},
        "fds": ["stdin", "stdout", "stderr", "error"]})";

constexpr int kClosedAll = 0, kLeftOpen = 1, kReturnedError = 2, kNoFilter = 3;

ChildSetup load_setup() {
  void* library = ::dlopen(KZ_ZYGOTE_CHILD_LIBRARY, RTLD_NOW);
  return library ? reinterpret_cast<ChildSetup>(::dlsym(library, "kz_zygote_child_setup")) : nullptr;
}

// Refuses close_range (EPERM), and with `no_open` also open and openat (EACCES): /proc/self/fd
// cannot be listed then.
bool refuse_syscalls(bool no_open) {
  std::vector<std::pair<long, int>> refused = {{SYS_close_range, EPERM}};
  if (no_open) refused.insert(refused.end(), {{SYS_open, EACCES}, {SYS_openat, EACCES}});
  return kz::testing::refuse_syscalls(refused);
}

struct ChildEnd {
  int status = -1;        // the child's exit code, -1 if a signal ended it
  std::string record;     // what it wrote on its error pipe
};

// Forks a child that opens a few descriptors as a zygote's would be (a socket, pipes, one far up),
// refuses syscalls as above, runs the set-up and exits with kClosedAll or kLeftOpen (descriptors
// from 3 on still open), kReturnedError, or kNoFilter.
ChildEnd run_child(ChildSetup setup, bool no_open) {
  int error_pipe[2];
  if (::pipe(error_pipe) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(error_pipe[0]);
    int sockets[2], extra[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets) != 0 || ::pipe(extra) != 0) ::_exit(kReturnedError);
    ::dup2(sockets[0], 77);  // the zygote's control socket, say, far up
    if (!refuse_syscalls(no_open) || ::syscall(SYS_close_range, 1000, 1001, 0) == 0) ::_exit(kNoFilter);
    int fds[] = {0, 1, 2, error_pipe[1]};
    if (setup(kRequest, fds, 4) != 0) ::_exit(kReturnedError);
    for (int fd = 3; fd < 256; ++fd) {
      if (::fcntl(fd, F_GETFD) != -1) ::_exit(kLeftOpen);
    }
    ::_exit(kClosedAll);
  }
  ::close(error_pipe[1]);
  ChildEnd end;
  char buffer[256];
  for (ssize_t n; (n = ::read(error_pipe[0], buffer, sizeof buffer)) > 0;) end.record.append(buffer, n);
  ::close(error_pipe[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  end.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return end;
}

TEST(ZygoteChild, WithCloseRangeRefusedEveryOtherDescriptorIsStillClosed) {
  ChildSetup setup = load_setup();
  ASSERT_NE(setup, nullptr) << ::dlerror();
  ChildEnd end = run_child(setup, false);
  if (end.status == kNoFilter) GTEST_SKIP() << "no seccomp filter here";
  EXPECT_EQ(end.status, kClosedAll) << "1: a descriptor from 3 on was left open; 2: the set-up failed";
  EXPECT_TRUE(end.record.empty()) << "no failure record";
}

TEST(ZygoteChild, WithCloseRangeRefusedAndNoProcTheSetUpFailsClosed) {
  ChildSetup setup = load_setup();
  ASSERT_NE(setup, nullptr) << ::dlerror();
  ChildEnd end = run_child(setup, true);
  if (end.status == kNoFilter) GTEST_SKIP() << "no seccomp filter here";
  EXPECT_EQ(end.status, 127) << "the child must not go on with descriptors it could not close";
  ASSERT_EQ(end.record.size(), 16u) << "one failure record";
  int32_t record[4];
  std::memcpy(record, end.record.data(), sizeof record);
  EXPECT_EQ(record[0], 0) << "kFailed";
  EXPECT_EQ(record[1], 1) << "kStageDup2: putting its descriptors in place";
}

}  // namespace
