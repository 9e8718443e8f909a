// Subprocess: output capture, exit codes and signals, deadlines, process-group kills, the fd 3
// message pipe, stdin delivery, large outputs, spawn errors and environment isolation.
#include "kz/core/subprocess.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

namespace kz {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ProcessSpec sh(const std::string& script) {
  ProcessSpec spec;
  spec.argv = {"sh", "-c", script};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  return spec;
}

RunResult run_ok(const ProcessSpec& spec, std::chrono::milliseconds timeout = 10s) {
  auto r = run_process(spec, timeout);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : RunResult{};
}

// Running (not dead, not a zombie). An orphaned grandchild is reaped by init, which may be slow
// to do so, so a zombie counts as dead.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Polls until `pid` is dead or the deadline passes.
bool dies_within(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (!alive(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return !alive(pid);
}

TEST(Subprocess, CapturesStdoutAndStderr) {
  RunResult r = run_ok(sh("echo out; echo err >&2"));
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(r.exit.exited);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_EQ(r.stdout_text, "out\n");
  EXPECT_EQ(r.stderr_text, "err\n");
}

TEST(Subprocess, ReportsExitCode) {
  RunResult r = run_ok(sh("exit 3"));
  EXPECT_TRUE(r.exit.exited);
  EXPECT_EQ(r.exit.exit_code, 3);
  EXPECT_EQ(r.exit.describe(), "exit code 3");
}

TEST(Subprocess, DescribesDeathBySignal) {
  RunResult r = run_ok(sh("kill -SEGV $$"));
  EXPECT_FALSE(r.exit.exited);
  EXPECT_EQ(r.exit.term_signal, SIGSEGV);
  EXPECT_EQ(r.exit.describe(), "killed by signal 11 (Segmentation fault)");
}

TEST(Subprocess, TimeoutKillsWithinDeadline) {
  ProcessSpec spec;
  spec.argv = {"sleep", "100"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  auto start = Clock::now();
  RunResult r = run_ok(spec, 200ms);
  auto elapsed = Clock::now() - start;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit.term_signal, SIGKILL);
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 2s);
}

TEST(Subprocess, KillGroupReachesGrandchild) {
  auto proc = Process::spawn(sh("sleep 100 & echo $!; sleep 100"));
  ASSERT_TRUE(proc.ok()) << proc.status().to_string();
  // Wait for the grandchild's pid on stdout.
  auto deadline = Clock::now() + 5s;
  while (proc->stdout_tail().find('\n') == std::string::npos && Clock::now() < deadline) {
    ASSERT_FALSE(proc->wait_for(20ms).has_value());
  }
  pid_t grandchild = std::atoi(proc->stdout_tail().c_str());
  ASSERT_GT(grandchild, 0) << proc->stdout_tail();
  ASSERT_TRUE(alive(grandchild));
  ExitInfo info = proc->kill_and_reap();
  EXPECT_EQ(info.term_signal, SIGKILL);
  EXPECT_TRUE(dies_within(grandchild, 2s));
}

TEST(Subprocess, DestructorKillsRunningGroup) {
  pid_t child;
  {
    auto proc = Process::spawn(sh("sleep 100"));
    ASSERT_TRUE(proc.ok());
    child = proc->pid();
    EXPECT_FALSE(proc->wait_for(50ms).has_value());
    EXPECT_TRUE(alive(child));
  }
  EXPECT_NE(::kill(child, 0), 0);  // killed and reaped: not even a zombie remains
}

TEST(Subprocess, MessagePipeLinesInOrderThenEof) {
  ProcessSpec spec = sh("echo a >&3; echo out; echo b >&3; printf tail >&3");
  spec.message_pipe = true;
  auto proc = Process::spawn(spec);
  ASSERT_TRUE(proc.ok()) << proc.status().to_string();
  std::string line;
  ASSERT_EQ(proc->read_message(line, 5s), Process::ReadEvent::line);
  EXPECT_EQ(line, "a");
  ASSERT_EQ(proc->read_message(line, 5s), Process::ReadEvent::line);
  EXPECT_EQ(line, "b");
  ASSERT_EQ(proc->read_message(line, 5s), Process::ReadEvent::line);
  EXPECT_EQ(line, "tail");
  EXPECT_EQ(proc->read_message(line, 5s), Process::ReadEvent::eof);
  auto exit = proc->wait_for(5s);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(proc->stdout_tail(), "out\n");  // stdout never mixes into messages
}

TEST(Subprocess, MessageReadTimesOut) {
  ProcessSpec spec = sh("sleep 100");
  spec.message_pipe = true;
  auto proc = Process::spawn(spec);
  ASSERT_TRUE(proc.ok());
  std::string line;
  auto start = Clock::now();
  EXPECT_EQ(proc->read_message(line, 150ms), Process::ReadEvent::timeout);
  EXPECT_GE(Clock::now() - start, 150ms);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(Subprocess, NoFd3WithoutMessagePipe) {
  RunResult r = run_ok(sh("echo x >&3"));
  EXPECT_NE(r.exit.exit_code, 0);  // fd 3 is closed in the child
}

TEST(Subprocess, StdinDelivered) {
  ProcessSpec spec;
  spec.argv = {"cat"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.stdin_data = "hello\nworld";
  RunResult r = run_ok(spec);
  EXPECT_EQ(r.stdout_text, "hello\nworld");
}

TEST(Subprocess, EmptyStdinIsEof) {
  RunResult r = run_ok(sh("cat; echo done"), 5s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.stdout_text, "done\n");
}

TEST(Subprocess, LargeStdinNoDeadlock) {
  ProcessSpec spec;
  spec.argv = {"cat"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.stdin_data.resize(1 << 20);
  for (size_t i = 0; i < spec.stdin_data.size(); ++i) spec.stdin_data[i] = char('a' + i % 26);
  spec.output_tail_bytes = 2 << 20;
  RunResult r = run_ok(spec, 20s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(r.stdout_text == spec.stdin_data) << r.stdout_text.size();
}

TEST(Subprocess, ChildIgnoringStdinDoesNotHurtParent) {
  ProcessSpec spec = sh("exit 0");
  spec.stdin_data = std::string(4 << 20, 'x');  // EPIPE, not SIGPIPE, in the parent
  RunResult r = run_ok(spec, 10s);
  EXPECT_EQ(r.exit.exit_code, 0);
}

TEST(Subprocess, HugeStdoutDrainedAndTailCapped) {
  ProcessSpec spec = sh("head -c 10485760 /dev/zero | tr '\\0' x; printf END");
  spec.output_tail_bytes = 1000;
  RunResult r = run_ok(spec, 20s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 0);
  ASSERT_EQ(r.stdout_text.size(), 1000u);
  EXPECT_EQ(r.stdout_text.substr(997), "END");
  EXPECT_EQ(r.stdout_text.substr(0, 997), std::string(997, 'x'));
}

TEST(Subprocess, MissingProgramNamedInStatus) {
  ProcessSpec spec;
  spec.argv = {"kz_no_such_program_xyz"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  auto r = Process::spawn(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kz_no_such_program_xyz"), std::string::npos)
      << r.status().message();
  auto r2 = run_process(spec, 1s);
  EXPECT_FALSE(r2.ok());
}

TEST(Subprocess, BadCwdIsAnError) {
  ProcessSpec spec = sh("true");
  spec.cwd = "/kz/no/such/dir";
  auto r = Process::spawn(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/kz/no/such/dir"), std::string::npos);
}

TEST(Subprocess, CwdApplied) {
  ProcessSpec spec = sh("pwd");
  spec.cwd = "/";
  EXPECT_EQ(run_ok(spec).stdout_text, "/\n");
}

TEST(Subprocess, EnvironmentNotInherited) {
  ::setenv("KZ_PARENT_ONLY", "leak", 1);
  RunResult r = run_ok(sh("echo \"[$KZ_PARENT_ONLY][$KZ_GIVEN]\""));
  EXPECT_EQ(r.stdout_text, "[][]\n");
  ProcessSpec spec = sh("echo \"[$KZ_PARENT_ONLY][$KZ_GIVEN]\"");
  spec.env["KZ_GIVEN"] = "yes";
  EXPECT_EQ(run_ok(spec).stdout_text, "[][yes]\n");
  ::unsetenv("KZ_PARENT_ONLY");
}

TEST(Subprocess, CurrentEnvironmentReadsEnviron) {
  ::setenv("KZ_CURRENT_ENV_TEST", "a=b", 1);
  auto env = current_environment();
  EXPECT_EQ(env["KZ_CURRENT_ENV_TEST"], "a=b");
  ::unsetenv("KZ_CURRENT_ENV_TEST");
}

TEST(Subprocess, PathFromChildEnvFallsBackToParent) {
  ProcessSpec spec;
  spec.argv = {"true"};  // no PATH in spec.env: the parent's PATH finds it
  auto r = run_process(spec, 5s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->exit.exit_code, 0);
  spec.env = {{"PATH", "/kz/nowhere"}};  // the child's PATH wins
  EXPECT_FALSE(run_process(spec, 5s).ok());
}

TEST(Subprocess, WaitForTimesOutThenSucceeds) {
  auto proc = Process::spawn(sh("sleep 0.3; exit 7"));
  ASSERT_TRUE(proc.ok());
  EXPECT_FALSE(proc->wait_for(50ms).has_value());
  auto exit = proc->wait_for(5s);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 7);
}

TEST(Subprocess, MovedProcessKeepsOwnership) {
  auto proc = Process::spawn(sh("exit 5"));
  ASSERT_TRUE(proc.ok());
  Process moved = std::move(*proc);
  auto exit = moved.wait_for(5s);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 5);
}

}  // namespace
}  // namespace kz
