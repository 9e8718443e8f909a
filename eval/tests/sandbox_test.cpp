// The sandbox through the real supervisor and worker: one fixture candidate per thing a candidate
// must not do (eval/tests/fixtures/sandbox_*.py, each saying in its docstring what it does and what
// it should get), and after each, a correct candidate still gets ok from the same Evaluator.
//
// Device "cpu" (eval_sandbox_test, label cpu). Built with KZ_GPU_TESTS this file holds the GPU tests
// instead (eval_sandbox_gpu_test, label gpu: a CUDA fault, then a correct candidate on cuda:0).
// The verdict cache is off throughout: every verdict below comes from a real worker.
//
// Needs KZ_SOURCE_DIR (CTest sets it) to find the suite and fixtures.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/eval/evaluator.h"
#include "kz/eval/sandbox.h"
#include "kz/task/task.h"
#include "test_support.h"

namespace kz {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using test::source_dir;

constexpr const char* kRelu = "suite/kzbench/level1/02_relu.py";
constexpr const char* kTritonRelu = "suite/examples/triton/02_relu.py";
const std::string kFixtures = "eval/tests/fixtures/";

std::string dump(const Verdict& v) { return to_json(v).dump(2); }
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  }

  // Default options (the sandbox on, with its defaults), few trials, no verdict cache.
  static EvalOptions options() {
    EvalOptions o;
    o.trials = 2;
    o.cache.enabled = false;
    return o;
  }

  static Evaluator make_evaluator(const EvalOptions& o) {
    auto evaluator = Evaluator::create(o);
    if (!evaluator.ok()) throw std::runtime_error("Evaluator::create: " + evaluator.status().to_string());
    return std::move(evaluator).value();
  }

  static std::string fixture(const std::string& name) {
    auto source = read_file(source_dir() / (kFixtures + name));
    if (!source.ok()) ADD_FAILURE() << "read_file(" << name << "): " << source.status().to_string();
    return source.ok() ? *source : std::string();
  }

  static Verdict evaluate(const Evaluator& evaluator, const std::string& label, const std::string& source,
                          const std::string& ref = kRelu) {
    auto task = load_task_file(source_dir() / ref);
    if (!task.ok()) {
      ADD_FAILURE() << "load_task_file(" << ref << "): " << task.status().to_string();
      return make_verdict(EvalStatus::infra_error, {}, "no task");
    }
    auto verdict = evaluator.evaluate(*task, Candidate{label, source});
    if (!verdict.ok()) {
      ADD_FAILURE() << "evaluate(" << label << ") could not run: " << verdict.status().to_string();
      return make_verdict(EvalStatus::infra_error, {}, verdict.status().message());
    }
    return *verdict;
  }

  static Verdict evaluate_fixture(const Evaluator& evaluator, const std::string& name) {
    return evaluate(evaluator, kFixtures + name, fixture(name));
  }

  // The correct Triton candidate, after whatever the previous evaluation did.
  static void expect_next_is_ok(const Evaluator& evaluator) {
    auto source = read_file(source_dir() / kTritonRelu);
    ASSERT_TRUE(source.ok());
    Verdict v = evaluate(evaluator, kTritonRelu, *source);
    EXPECT_EQ(status_name(v.status), std::string("ok")) << "the next evaluation is unaffected\n" << dump(v);
    EXPECT_TRUE(v.checks.empty()) << dump(v);
    EXPECT_FALSE(v.cached) << dump(v);
  }

  // The status, and that each listed check fired.
  static void expect_verdict(const Verdict& v, EvalStatus status, std::initializer_list<Check> checks) {
    EXPECT_EQ(status_name(v.status), std::string(status_name(status))) << dump(v);
    for (Check c : checks) EXPECT_TRUE(v.has_check(c)) << "check " << check_name(c) << " did not fire\n" << dump(v);
    EXPECT_FALSE(v.correct) << dump(v);
    EXPECT_FALSE(v.cached) << dump(v);
  }
};

std::string quoted(const std::string& text) {
  std::string out;
  out += '"';
  out += text;
  out += '"';
  return out;
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at == std::string::npos) ADD_FAILURE() << "fixture has no '" << from << "'";
  else text.replace(at, from.size(), to);
  return text;
}

#ifndef KZ_GPU_TESTS

// What this machine gives a sandboxed child (root, namespaces allowed, ...).
SandboxReport sandbox_probe() {
  ProcessSpec spec;
  spec.argv = {"true"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.cwd = "/tmp";
  spec.read_only_filesystem = true;
  spec.writable_paths = {"/tmp"};
  spec.new_pid_namespace = true;
  auto proc = Process::spawn(spec);
  if (!proc.ok()) return {};
  proc->wait_for(5s);
  return proc->sandbox();
}

bool read_only_mounts_available() { return sandbox_probe().filesystem_read_only; }

// Own PID namespaces, and a root supervisor (whose scratch dirs' parent is unlistable to workers).
bool sandbox_isolates_pids() { return ::geteuid() == 0 && sandbox_probe().pids_isolated; }

// Live processes whose name (/proc/<pid>/comm) is `name`, waiting up to 30 s for killed ones to go.
int live_processes_named(const std::string& name) {
  int found = 0;
  for (int attempt = 0; attempt < 300; ++attempt) {  // up to 30 s: a loaded machine
    found = 0;
    for (const auto& process : test::live_processes()) found += process.read("comm") == name + "\n";
    if (found == 0) return 0;
    std::this_thread::sleep_for(100ms);
  }
  return found;
}

// A TCP listener on the supervisor's loopback, for the socket fixture to aim at.
class LoopbackListener {
 public:
  LoopbackListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      ADD_FAILURE() << "listener failed";
    port_ = ntohs(addr.sin_port);
  }
  ~LoopbackListener() { ::close(fd_); }
  int port() const { return port_; }
  bool accepted() {
    int c = ::accept(fd_, nullptr, nullptr);
    if (c < 0) return false;
    ::close(c);
    return true;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ---- processes ---------------------------------------------------------------------------------

TEST_F(SandboxTest, ForkBombIsStoppedByTheProcessCap) {
  EvalOptions o = options();
  o.sandbox.max_processes = 128;  // the default (2048) is above the fixture's 2000 forks
  Evaluator evaluator = make_evaluator(o);
  auto started = std::chrono::steady_clock::now();
  Verdict v = evaluate_fixture(evaluator, "sandbox_fork_bomb.py");
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::process_limit});
  EXPECT_TRUE(contains(v.message, "128")) << v.message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 120s);
  EXPECT_EQ(live_processes_named("kzforkbomb"), 0) << "every forked child dies with the worker's group";
  expect_next_is_ok(evaluator);
}

TEST_F(SandboxTest, SubprocessFromTheCandidateIsRecorded) {
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate_fixture(evaluator, "sandbox_subprocess.py");
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::process_spawn});
  EXPECT_TRUE(contains(v.message, "subprocess.Popen")) << v.message;
  expect_next_is_ok(evaluator);
}

TEST_F(SandboxTest, SignallingTheSupervisorIsRefused) {
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate_fixture(evaluator, "sandbox_signal_parent.py");
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::process_signal});
  expect_next_is_ok(evaluator);
}

TEST_F(SandboxTest, OsExitInForwardIsACrash) {
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate_fixture(evaluator, "sandbox_exit.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::worker_crashed});
  EXPECT_TRUE(contains(v.message, "exit code 0")) << v.message;
  expect_next_is_ok(evaluator);
}

// ---- CPU time and memory -----------------------------------------------------------------------

TEST_F(SandboxTest, InfiniteLoopHitsTheCpuLimit) {
  EvalOptions o = options();
  o.sandbox.cpu_time_s = 15;        // the worker's startup takes a few CPU seconds of it
  o.timeouts.correctness_s = 300;   // so the CPU limit, not the deadline, ends it
  Evaluator evaluator = make_evaluator(o);
  auto started = std::chrono::steady_clock::now();
  Verdict v = evaluate_fixture(evaluator, "sandbox_infinite_loop.py");
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::cpu_limit});
  EXPECT_EQ(v.stage, "correctness") << dump(v);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 120s);
  expect_next_is_ok(evaluator);
}

TEST_F(SandboxTest, HugeAllocationHitsTheMemoryLimit) {
  EvalOptions o = options();
  o.sandbox.memory_mb = 16384;  // below the fixture's 64 GB whatever the machine's overcommit policy
  Evaluator evaluator = make_evaluator(o);
  Verdict v = evaluate_fixture(evaluator, "sandbox_huge_alloc.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::memory_limit});
  expect_next_is_ok(evaluator);
}

// ---- network and files -------------------------------------------------------------------------

TEST_F(SandboxTest, SocketConnectionIsRefused) {
  LoopbackListener listener;
  Evaluator evaluator = make_evaluator(options());
  std::string source = replace_once(fixture("sandbox_socket.py"), "PORT = 0", "PORT = " + std::to_string(listener.port()));
  Verdict v = evaluate(evaluator, "sandbox_socket.py", source);
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::network_access});
  EXPECT_FALSE(listener.accepted()) << "nothing reached the supervisor's loopback";
  expect_next_is_ok(evaluator);
}

TEST_F(SandboxTest, WriteOutsideScratchIsRefused) {
  fs::path escape = fs::temp_directory_path() / ("kz_sandbox_escape_" + std::to_string(::getpid()));
  fs::remove(escape);
  Evaluator evaluator = make_evaluator(options());
  std::string source = replace_once(fixture("sandbox_write_outside.py"), "\"/tmp/kz_sandbox_escape\"",
                                    quoted(escape.string()));
  Verdict v = evaluate(evaluator, "sandbox_write_outside.py", source);
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::filesystem_write});
  EXPECT_TRUE(contains(v.message, escape.string())) << v.message;
  EXPECT_FALSE(fs::exists(escape)) << "the file was written";
  fs::remove(escape);
  expect_next_is_ok(evaluator);
}

// Many files, each under the per-file limit: the supervisor's look at the scratch dir stops them,
// by bytes and by count; the default bound lets the same candidate pass.
TEST_F(SandboxTest, FillingTheScratchDirIsStopped) {
  EvalOptions by_bytes = options(), by_files = options(), by_default = options();
  by_bytes.sandbox.scratch_mb = 16;  // the fixture writes 50 MiB
  by_files.sandbox.scratch_mb = 0;
  by_files.sandbox.scratch_files = 120;  // in 200 files (and a dir); a clean evaluation keeps far fewer
  for (const EvalOptions& o : {by_bytes, by_files}) {
    Evaluator evaluator = make_evaluator(o);
    Verdict v = evaluate_fixture(evaluator, "sandbox_fill_scratch.py");
    expect_verdict(v, EvalStatus::sandbox_violation, {Check::scratch_limit});
    EXPECT_TRUE(contains(v.message, o.sandbox.scratch_mb ? "more than 16 MB" : "more than 120 files")) << v.message;
    expect_next_is_ok(evaluator);
  }
  Verdict within = evaluate_fixture(make_evaluator(by_default), "sandbox_fill_scratch.py");
  EXPECT_EQ(status_name(within.status), std::string("ok")) << "50 MiB is within the default bound\n" << dump(within);
}

// A file removed while the worker keeps it open: no walk of the scratch dir finds it, the look at
// the worker's open files does; the default bound lets the same candidate pass.
TEST_F(SandboxTest, FillingTheScratchDirThroughARemovedFileIsStopped) {
  EvalOptions small = options(), by_default = options();
  small.sandbox.scratch_mb = 16;  // the fixture writes 50 MiB
  Evaluator evaluator = make_evaluator(small);
  Verdict v = evaluate_fixture(evaluator, "sandbox_fill_removed_file.py");
  expect_verdict(v, EvalStatus::sandbox_violation, {Check::scratch_limit});
  EXPECT_TRUE(contains(v.message, "more than 16 MB")) << v.message;
  EXPECT_TRUE(contains(v.message, "in files removed but still open or mapped")) << v.message;
  expect_next_is_ok(evaluator);
  Verdict within = evaluate_fixture(make_evaluator(by_default), "sandbox_fill_removed_file.py");
  EXPECT_EQ(status_name(within.status), std::string("ok")) << "50 MiB is within the default bound\n" << dump(within);
}

// A user namespace would give a candidate's process its capabilities back (mounts of its own):
// only the seccomp filter stops it, C code being invisible to the audit hook. Without the filter
// the same candidate is ok, so the refusal is the filter's.
TEST_F(SandboxTest, AUserNamespaceIsRefused) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the fixture calls x86-64's clone";
#endif
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate_fixture(evaluator, "sandbox_user_namespace.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "clone(CLONE_NEWUSER): Operation not permitted")) << v.message;
  expect_next_is_ok(evaluator);
  EvalOptions unfiltered = options();
  unfiltered.sandbox.syscall_filter = false;
  Verdict made = evaluate_fixture(make_evaluator(unfiltered), "sandbox_user_namespace.py");
  if (made.status != EvalStatus::ok && contains(made.message, "clone(CLONE_NEWUSER)"))
    GTEST_SKIP() << "this machine refuses user namespaces anyway: " << made.message;
  EXPECT_EQ(status_name(made.status), std::string("ok")) << dump(made);
}

// C code is invisible to the audit hook: only the read-only mount namespace stops this one.
TEST_F(SandboxTest, CLevelWriteOutsideScratchHitsTheReadOnlyMounts) {
  if (!read_only_mounts_available()) GTEST_SKIP() << "no read-only mount namespace on this machine (not root?)";
  fs::path escape = fs::temp_directory_path() / ("kz_sandbox_escape_c_" + std::to_string(::getpid()));
  fs::remove(escape);
  Evaluator evaluator = make_evaluator(options());
  std::string source = replace_once(fixture("sandbox_ctypes_write.py"), "\"/tmp/kz_sandbox_escape_c\"",
                                    quoted(escape.string()));
  Verdict v = evaluate(evaluator, "sandbox_ctypes_write.py", source);
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "Read-only file system")) << v.message;
  EXPECT_FALSE(fs::exists(escape)) << "the file was written";
  fs::remove(escape);
  expect_next_is_ok(evaluator);
}

// Kept `cuda` builds (extension_builds_dir) are read-only to every worker: a GRPO sibling cannot
// overwrite another candidate's library between its pre-build and its evaluation.
TEST_F(SandboxTest, AnotherCandidatesKeptBuildIsOutOfReach) {
  if (!read_only_mounts_available()) GTEST_SKIP() << "no read-only mount namespace on this machine (not root?)";
  fs::path cache = fs::temp_directory_path() / ("kz_sandbox_cache_" + std::to_string(::getpid()));
  fs::path library = extension_builds_dir(cache) / "a-sibling" / "relu_ext" / "relu_ext.so";
  fs::create_directories(library.parent_path());
  ASSERT_TRUE(write_file_atomic(library, "the sibling's library").is_ok());
  EvalOptions o = options();
  o.worker.cache_dir = cache;
  Evaluator evaluator = make_evaluator(o);
  std::string source = replace_once(fixture("sandbox_ctypes_write.py"), "\"/tmp/kz_sandbox_escape_c\"",
                                    quoted(library.string()));
  Verdict v = evaluate(evaluator, "sandbox_ctypes_write.py", source);
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "Read-only file system")) << v.message;
  auto kept = read_file(library);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, "the sibling's library");
  expect_next_is_ok(evaluator);
  fs::remove_all(cache);
}

// Triton imports C modules from its cache (its driver helper, a launcher per kernel signature):
// each request has its own cache, in its scratch dir, whether a fork server's child or a worker
// started for it runs the request, and the cache every worker once shared is out of reach.
TEST_F(SandboxTest, TritonCacheIsTheRequestsOwn) {
  for (const char* fork_server : {"always", "never"}) {
    EvalOptions o = options();
    o.tuning.fork_server = fork_server;
    Evaluator evaluator = make_evaluator(o);
    Verdict v = evaluate_fixture(evaluator, "sandbox_triton_cache_dir.py");
    expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
    EXPECT_TRUE(contains(v.message, "triton_cache=triton absolute=True end")) << fork_server << ": " << v.message;
    expect_next_is_ok(evaluator);
  }
  if (!read_only_mounts_available()) GTEST_SKIP() << "no read-only mount namespace on this machine (not root?)";
  fs::path cache = fs::temp_directory_path() / ("kz_sandbox_cache_" + std::to_string(::getpid()));
  fs::path helper = cache / "triton" / "SOMEKEY" / "cuda_utils.so";  // where an older kz shared Triton's cache
  fs::create_directories(helper.parent_path());
  EvalOptions o = options();
  o.worker.cache_dir = cache;
  Evaluator evaluator = make_evaluator(o);
  std::string source = replace_once(fixture("sandbox_ctypes_write.py"), "\"/tmp/kz_sandbox_escape_c\"",
                                    quoted(helper.string()));
  Verdict v = evaluate(evaluator, "sandbox_ctypes_write.py", source);
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "Read-only file system")) << v.message;
  EXPECT_FALSE(fs::exists(helper));
  fs::remove_all(cache);
}

// The GPU locks' files are the supervisor's: a candidate that could unlink or replace one would
// split the lock (later workers locking another file), and timings would overlap.
TEST_F(SandboxTest, GpuLockFilesAreOutOfReach) {
  if (!read_only_mounts_available()) GTEST_SKIP() << "no read-only mount namespace on this machine (not root?)";
  fs::path cache = fs::temp_directory_path() / ("kz_sandbox_locks_" + std::to_string(::getpid()));
  ASSERT_TRUE(make_gpu_lock_files(gpu_lock_dir(cache), {"GPU-test"}).is_ok());
  EvalOptions o = options();
  o.worker.cache_dir = cache;
  Evaluator evaluator = make_evaluator(o);
  fs::path lock = gpu_lock_dir(cache) / (gpu_lock_file_stem("GPU-test") + ".lock");
  std::string source = replace_once(fixture("sandbox_ctypes_write.py"), "\"/tmp/kz_sandbox_escape_c\"",
                                    quoted(lock.string()));
  Verdict v = evaluate(evaluator, "sandbox_ctypes_write.py", source);
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "Read-only file system")) << v.message;
  auto kept = read_file(lock);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, "");
  fs::remove_all(cache);
}

// A candidate must not read the source of a candidate evaluated beside it (a GRPO sibling's correct
// kernel, copied, earns the sibling's reward). Every request's candidate.py sits in its scratch dir,
// which same-uid workers could otherwise list under /tmp and reach through /proc/<pid>/cwd. The
// scratch dirs' parent is unlistable and each worker has its own PID namespace and /proc (docs/evaluation.md, "Sandbox"). Where this machine cannot make either, the
// test is skipped rather than passed.
TEST_F(SandboxTest, ASiblingsSourceIsOutOfReach) {
  if (!sandbox_isolates_pids()) GTEST_SKIP() << "no PID namespace with its own /proc on this machine";
  EvalOptions o = options();
  o.worker.scratch_root = "/tmp";  // the fixture looks where the default puts scratch dirs
  o.sandbox.shm_mb = 0;            // the host's /dev/shm: the sibling's marker must reach the spy
  Evaluator evaluator = make_evaluator(o);
  std::string sibling = "# kz-sibling-" + std::to_string(std::random_device{}()) + "\n" +
                        *read_file(source_dir() / kTritonRelu);
  const fs::path running = "/dev/shm/kz-test-sibling-running";  // the spy waits for it
  fs::remove(running);
  Verdict spied;
  std::thread spy([&] { spied = evaluate_fixture(evaluator, "sandbox_reads_sibling_source.py"); });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::string slow = replace_once(sibling, "class ModelNew(nn.Module):", "import time\n\nclass ModelNew(nn.Module):");
  slow = replace_once(slow, "    def forward(self, x):\n",
                      "    def forward(self, x):\n        open('" + running.string() + "', 'w').close()\n"
                      "        time.sleep(5)\n");
  Verdict beside = evaluate(evaluator, "sibling", slow);
  spy.join();
  EXPECT_EQ(status_name(beside.status), std::string("ok")) << dump(beside);
  expect_verdict(spied, EvalStatus::runtime_error, {Check::forward_failed});
  fs::remove(running);
  EXPECT_TRUE(contains(spied.message, "sibling sources found: [] end")) << spied.message;
  EXPECT_TRUE(contains(spied.message, "own server dir unlistable")) << spied.message;
  EXPECT_FALSE(contains(spied.message, "kz-scratch-")) << "a scratch path reached the verdict: " << spied.message;
}

// /dev/shm is the worker's own tmpfs ([sandbox] shm_mb): what a candidate leaves there no later
// candidate finds, on the same fork server (which empties it between requests: both evaluations below
// see the same tmpfs) or in a fresh worker, nothing reaches the host's /dev/shm, and a write past
// shm_mb fails. With shm_mb = 0 (the host's /dev/shm, shared) the same fixture finds the earlier
// candidate's file: what the test looks for is there to find.
TEST_F(SandboxTest, SharedMemoryIsTheWorkersOwnAndBounded) {
  if (!read_only_mounts_available()) GTEST_SKIP() << "no read-only mount namespace on this machine (not root?)";
  const std::string prefix = "kz-shm-leftover-" + std::to_string(std::random_device{}()) + "-";
  std::string source = replace_once(fixture("sandbox_shared_memory.py"), "\"kz-shm-leftover-\"", quoted(prefix));
  source = replace_once(source, "BIG_MB = 64", "BIG_MB = 24");
  auto host_leftovers = [&] {
    int found = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev/shm", ec))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) ++found;
    return found;
  };
  auto device_of = [](const std::string& message) {
    std::smatch m;
    return std::regex_search(message, m, std::regex("shm_dev=(\\d+) end")) ? m[1].str() : std::string("none");
  };
  for (const char* fork_server : {"always", "never"}) {
    EvalOptions o = options();
    o.tuning.fork_server = fork_server;
    o.sandbox.shm_mb = 16;
    Evaluator evaluator = make_evaluator(o);
    Verdict first = evaluate(evaluator, "sandbox_shared_memory.py", source);
    Verdict second = evaluate(evaluator, "sandbox_shared_memory.py", source);
    for (const Verdict* v : {&first, &second}) {
      expect_verdict(*v, EvalStatus::runtime_error, {Check::forward_failed});
      EXPECT_TRUE(contains(v->message, "leftovers=[] big=ENOSPC shm_dev=")) << fork_server << ": " << v->message;
    }
    if (std::string(fork_server) == "always")  // one server, one tmpfs: emptied, not replaced
      EXPECT_EQ(device_of(first.message), device_of(second.message)) << first.message << "\n" << second.message;
    EXPECT_EQ(host_leftovers(), 0) << fork_server << ": a candidate's file reached the host's /dev/shm";
    expect_next_is_ok(evaluator);
  }
  EvalOptions shared = options();
  shared.sandbox.shm_mb = 0;
  Evaluator evaluator = make_evaluator(shared);
  evaluate(evaluator, "sandbox_shared_memory.py", source);
  Verdict after = evaluate(evaluator, "sandbox_shared_memory.py", source);
  EXPECT_TRUE(contains(after.message, "leftovers=['" + prefix)) << after.message;
  EXPECT_TRUE(contains(after.message, "big=written")) << after.message;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
}

// ---- secrets -----------------------------------------------------------------------------------

TEST_F(SandboxTest, SupervisorEnvironmentIsNotVisible) {
  std::string secret = "kz-secret-" + std::to_string(std::random_device{}());
  ::setenv("KZ_TEST_SECRET", secret.c_str(), 1);
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate_fixture(evaluator, "sandbox_env_secret.py");
  ::unsetenv("KZ_TEST_SECRET");
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "kz-fixture: secret=None")) << v.message;
  EXPECT_FALSE(contains(v.message, secret)) << "the candidate saw the supervisor's secret\n" << v.message;
  EXPECT_FALSE(contains(v.message, "parent_environ=")) << "the supervisor's /proc/<pid>/environ was readable\n"
                                                       << v.message;
  expect_next_is_ok(evaluator);
}

// ---- off ---------------------------------------------------------------------------------------

// [sandbox] enabled = false: only the process group, the scrubbed environment and the deadlines.
TEST_F(SandboxTest, DisabledSandboxRecordsNothing) {
  EvalOptions o = options();
  o.sandbox.enabled = false;
  Evaluator evaluator = make_evaluator(o);
  Verdict v = evaluate_fixture(evaluator, "sandbox_subprocess.py");
  EXPECT_EQ(status_name(v.status), std::string("ok")) << dump(v);
}

#else  // KZ_GPU_TESTS: eval_sandbox_gpu_test

TEST_F(SandboxTest, IllegalMemoryAccessIsRuntimeErrorAndNextEvaluationIsOk) {
  EvalOptions o = options();
  o.device = "cuda:0";
  o.timing.runs = 10;
  Evaluator evaluator = make_evaluator(o);
  Verdict v = evaluate_fixture(evaluator, "sandbox_cuda_rtc_illegal_address.py");
  expect_verdict(v, EvalStatus::runtime_error, {});
  EXPECT_TRUE(v.has_check(Check::forward_failed) || v.has_check(Check::worker_crashed)) << dump(v);
  EXPECT_TRUE(contains(v.message, "illegal") || contains(v.message, "signal")) << v.message;

  auto source = read_file(source_dir() / "suite/examples/cuda-rtc/02_relu.py");
  ASSERT_TRUE(source.ok());
  Verdict next = evaluate(evaluator, "suite/examples/cuda-rtc/02_relu.py", *source);
  EXPECT_EQ(status_name(next.status), std::string("ok")) << dump(next);
  EXPECT_TRUE(next.speedup.has_value()) << dump(next);
}

// The sandbox must not get in the way of real GPU work (CUDA in a mount namespace without
// capabilities, Triton's and nvcc's builds under the limits): examples of each format stay ok.
TEST_F(SandboxTest, ExamplesOfEachFormatStayOkUnderTheSandbox) {
  EvalOptions o = options();
  o.device = "cuda:0";
  o.timing.runs = 10;
  Evaluator evaluator = make_evaluator(o);
  for (const char* example : {"triton/02_relu", "triton/07_softmax", "triton/11_matmul", "cuda-rtc/07_softmax",
                              "cuda-rtc/18_add_layernorm", "cuda/02_relu"}) {
    std::string stem = fs::path(example).filename().string();
    std::string ref = std::stoi(stem.substr(0, 2)) <= 15 ? "suite/kzbench/level1/" : "suite/kzbench/level2/";
    std::string path = std::string("suite/examples/") + example + ".py";
    auto source = read_file(source_dir() / path);
    ASSERT_TRUE(source.ok()) << path;
    Verdict v = evaluate(evaluator, path, *source, ref + stem + ".py");
    EXPECT_EQ(status_name(v.status), std::string("ok")) << dump(v);
  }
}

// A candidate plants a library where Triton looks for its driver helper, in its own cache and in
// the one workers once shared (sandbox_triton_poisons_helper.py): the Triton candidate evaluated
// next, on the same fork servers, never loads it.
TEST_F(SandboxTest, PlantedTritonHelperNeverLoadsInTheNextEvaluation) {
  fs::path cache = fs::temp_directory_path() / ("kz_sandbox_gpu_cache_" + std::to_string(::getpid()));
  fs::create_directories(cache / "triton");
  fs::path marker = fs::path("/dev/shm") / ("kz_triton_planted_" + std::to_string(::getpid()));
  fs::remove(marker);
  EvalOptions o = options();
  o.device = "cuda:0";
  o.timing.runs = 10;
  o.worker.cache_dir = cache;
  o.sandbox.shm_mb = 0;  // the host's /dev/shm: a planted library's marker must reach the test
  Evaluator evaluator = make_evaluator(o);
  std::string source = replace_once(fixture("sandbox_triton_poisons_helper.py"), "\"/dev/shm/kz_triton_poisoned\"",
                                    quoted(marker.string()));
  source = replace_once(source, "\"/nonexistent/triton\"", quoted((cache / "triton").string()));
  Verdict planted = evaluate(evaluator, "sandbox_triton_poisons_helper.py", source);
  EXPECT_FALSE(fs::exists(marker)) << "the planting candidate loaded its own library\n" << dump(planted);
  for (int i = 0; i < 3; ++i) {  // more than one fork server may be idle
    auto next = read_file(source_dir() / kTritonRelu);
    ASSERT_TRUE(next.ok());
    Verdict v = evaluate(evaluator, kTritonRelu, *next);
    EXPECT_EQ(status_name(v.status), std::string("ok")) << dump(v);
  }
  EXPECT_FALSE(fs::exists(marker)) << "a later Triton evaluation loaded the planted helper";
  fs::remove(marker);
  fs::remove_all(cache);
}

#endif

}  // namespace
}  // namespace kz
