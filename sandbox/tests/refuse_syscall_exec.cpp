// kz_refuse_syscall_exec SYSCALL -- PROGRAM [ARGS...]: runs PROGRAM with SYSCALL refused (EPERM) by a
// seccomp filter, for tests of what a process does on a machine that refuses it (a zygote that
// cannot setns back to its own PID namespace). SYSCALL: setns, unshare or close_range. Exits 126
// where the filter cannot be installed, 127 where PROGRAM cannot be run.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "refuse_syscalls.h"

int main(int argc, char** argv) {
  static const std::map<std::string, long> kSyscalls = {
      {"setns", SYS_setns}, {"unshare", SYS_unshare}, {"close_range", SYS_close_range}};
  if (argc < 4 || std::strcmp(argv[2], "--") != 0 || !kSyscalls.contains(argv[1])) {
    std::fprintf(stderr, "usage: %s setns|unshare|close_range -- PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  if (!kz::testing::refuse_syscalls({{kSyscalls.at(argv[1]), EPERM}})) {
    std::perror("kz_refuse_syscall_exec: installing the seccomp filter");
    return 126;
  }
  ::execvp(argv[3], argv + 3);
  std::perror("kz_refuse_syscall_exec: exec");
  return 127;
}
