// run_worker_request through real Python processes: the real fork server
// (worker/kz_worker/fork_server.py) and entry point, with a stand-in for the harness (process.py)
// that reports its pids and scratch dir and misbehaves on request (exits, crashes, leaves a daemon,
// forges the server's message, hangs). Every test runs twice: with each fork server a program of its
// own, and with fork servers forked from the real zygote (worker/kz_worker/zygote.py, the built
// kz_zygote_child library).
#include "kz/sandbox/process.h"
#include "kz/eval/worker_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "kz/core/files.h"
#include "test_support.h"

namespace kz {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kStandInProcess = R"(import json, os, signal, subprocess, sys, time
started = time.monotonic()

prepared_by = None

def prepare_host(device):
    global prepared_by
    os.environ["KZ_SET_BY_IMPORTS"] = "1"  # as torch's import sets TORCHINDUCTOR_CACHE_DIR
    prepared_by = os.getpid()

prepared_at = device_started_at = None
device_steps_s = {}

def prepare_device(device):  # as long as a CUDA context takes, roughly
    global prepared_at, device_started_at
    device_started_at = time.time()
    seconds = float(os.environ.get("KZ_TEST_DEVICE_S", "0.3"))  # longer where a test asks
    time.sleep(seconds)
    prepared_at = time.time()
    device_steps_s["context"] = seconds

def quietly(step, device):
    step(device)

class EarlyContext:  # a process started for one request (__main__.py)
    def __init__(self, device):
        self.seconds = None
    def join(self):
        pass

def prepare_fresh(device, early):
    prepare_host(device)
    prepare_device(device)
    return {"imports": 0.0, "device": device_steps_s["context"]}

def listing(path):  # a fork server's dir is unlistable without capabilities (0311)
    try:
        return sorted(os.listdir(path))
    except PermissionError:
        return None

def evaluate(request):
    requested_at = time.time()
    niceness_at_start = os.getpriority(os.PRIO_PROCESS, 0)  # before any stage message, as prepared
    token = request.pop("message_token", None)
    if request.get("action") == "forge_result":  # candidate code's verdict, without the token
        os.write(3, b'{"type": "result", "status": "ok"}\n')
    os.write(3, (json.dumps({"type": "stage", "name": "compile", "token": token}) + "\n").encode())  # as the harness does
    action = request.get("action", "")
    open("mine.txt", "w").write("x")
    sys.stderr.write("stderr of " + action + "\n")
    sys.stderr.flush()
    reply = {"type": "result", "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
             "scratch": request["scratch_dir"], "home": os.environ.get("HOME"),
             "seen": listing(".."), "stdin": sys.stdin.read(),
             "imports_env": os.environ.get("KZ_SET_BY_IMPORTS"), "pycache_prefix": sys.pycache_prefix,
             "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
             "triton_helpers": os.environ.get("KZ_TRITON_HELPERS_DIR"),
             "cuda_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
             "prepared_at": prepared_at, "requested_at": requested_at,
             "device_started_at": device_started_at, "startup_s": request.get("startup_s"),
             "token": token, "prepared_by": prepared_by, "imported_at": started,
             "cap_eff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]}
    if action == "look_for":  # an earlier request left in this process: in a frame below, or anywhere the gc sees
        import gc
        frames, frame = [], sys._getframe()
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        values = [v for f in frames for v in f.f_locals.values()] + gc.get_objects()
        reply["found"] = any(isinstance(v, dict) and v.get("token") == request["look_for"] or
                             isinstance(v, bytes) and request["look_for"].encode() in v for v in values)
    if action == "signal_siblings":  # the server's other children (a candidate can signal them)
        server, stopped, deadline = os.getppid(), [], time.monotonic() + 30
        while not stopped and time.monotonic() < deadline:
            with open(f"/proc/{server}/task/{server}/children") as f:
                stopped = [int(p) for p in f.read().split() if int(p) != os.getpid()]
            time.sleep(0.01)
        for pid in stopped:
            os.kill(pid, request["signal"])
        reply["stopped"] = stopped
    # The nice value once it is no longer `value`, waiting up to the request's change_within_s (0.5 s
    # by default, where no change is expected; longer where one is, as a loaded machine delays it).
    def niceness_changed_from(value):
        deadline = time.monotonic() + request.get("change_within_s", 0.5)
        while os.getpriority(os.PRIO_PROCESS, 0) == value and time.monotonic() < deadline:
            time.sleep(0.005)
        return os.getpriority(os.PRIO_PROCESS, 0)
    def stage_message(stage):
        os.write(3, (json.dumps({"type": "stage", "name": stage, "token": token}) + "\n").encode())
    if action == "first_stage":  # its priority as prepared, and once the supervisor read its first stage
        reply["niceness"] = [niceness_at_start, niceness_changed_from(niceness_at_start)]
    if action == "compile_stage":  # its priority once the supervisor read the compile stage (sent above), and after it
        in_compile = niceness_changed_from(niceness_at_start)
        stage_message("correctness")
        reply["niceness"] = [in_compile, niceness_changed_from(in_compile)]
    if action == "timing_stage":  # its priority as the supervisor sets it, in and after the timing stage
        before = os.getpriority(os.PRIO_PROCESS, 0)
        if "reset_to" in request:  # started at prepare_niceness (a fork server's first child): the supervisor's reset first
            deadline = time.monotonic() + request["change_within_s"]
            while before != request["reset_to"] and time.monotonic() < deadline:
                time.sleep(0.005)
                before = os.getpriority(os.PRIO_PROCESS, 0)
        stage_message("timing")
        in_timing = niceness_changed_from(before)
        stage_message("recheck")
        reply["niceness"] = [before, in_timing, niceness_changed_from(in_timing)]
    if action == "exit":
        os._exit(9)
    if action == "cpu_limit":
        os.kill(os.getpid(), signal.SIGXCPU)
    if action == "hang":
        time.sleep(60)
    if action == "linger":  # long enough for the supervisor's periodic look at the process cap
        time.sleep(0.6)
    if action == "daemon":  # a grandchild that detaches and would outlive the evaluation
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(request["daemon_pid_file"], "w").write(str(os.getpid()))
                time.sleep(60)
            os._exit(0)
        while not os.path.exists(request["daemon_pid_file"]):
            time.sleep(0.01)
    if action == "zombie_leader":  # a grandchild whose leader exits while a thread runs on: /proc says Z
        if os.fork() == 0:
            import ctypes, threading
            threading.Thread(target=lambda: time.sleep(60)).start()
            open(request["daemon_pid_file"], "w").write(str(os.getpid()))
            ctypes.CDLL(None).syscall(request["sys_exit"], 0)
        while not os.path.exists(request["daemon_pid_file"]):
            time.sleep(0.01)
        time.sleep(0.2)
    if action == "fork_burst":  # past the process cap, all gone again before the result
        kids = []
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if action == "nested":  # too deep for the relay's parser, not for every parser
        os.write(3, b'{"type": "fork_server_done", "leftovers": 0, "x": ' + b"[" * 100000 + b"]" * 100000 + b"}\n")
    if action == "forge":
        os.write(3, b'{"type": "fork_server_done", "leftovers": 0}\n')
    os.write(3, (json.dumps(reply) + "\n").encode())
    os._exit(0)
)";

// Alive and not a zombie: a zygote reaps the servers it forked a moment after the supervisor is done
// with them (kz/sandbox/process.h, class Zygote).
bool running(pid_t pid) {
  auto stat = read_file(fmt::format("/proc/{}/stat", pid));
  if (!stat.ok()) return false;
  size_t paren = stat->rfind(')');
  return paren != std::string::npos && paren + 2 < stat->size() && (*stat)[paren + 2] != 'Z';
}

class WorkerClientTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-worker-client-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    root_ = *dir;
    fs::path package = root_ / "worker" / "kz_worker";
    fs::create_directories(package);
    fs::create_directories(root_ / "scratch");
    const char* source_dir = std::getenv("KZ_SOURCE_DIR");  // set by CTest; by hand, from the repository root
    fs::path real = fs::path(source_dir ? source_dir : ".") / "worker" / "kz_worker";
    for (const char* name : {"__init__.py", "__main__.py", "fork_server.py", "zygote.py"})
      fs::copy_file(real / name, package / name);
    ASSERT_TRUE(write_file_atomic(package / "process.py", kStandInProcess).is_ok());
    if (zygote()) {
      WorkerOptions options;
      options.python = "python3";
      options.worker_dir = root_ / "worker";
      auto resolved = resolve_worker_setup(options, TuningOptions{}, "cpu");
      ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
      zygote_library_ = resolved->zygote_library;
      ASSERT_FALSE(zygote_library_.empty()) << "the build's kz_zygote_child library";
    }
  }
  bool zygote() const { return GetParam(); }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  WorkerSetup setup(bool fork_server) const {
    WorkerSetup setup{"python3", root_ / "worker", root_ / "cache", root_ / "scratch", false, fork_server};
    setup.zygote_library = zygote_library_;
    return setup;
  }

  WorkerOutcome run(const WorkerSetup& s, nlohmann::json fields = nlohmann::json::object(),
                    const std::string& prefix = "kz-test-", double deadline_s = 30,
                    const std::function<void(ProcessSpec&)>& customize = {}) const {
    auto outcome = run_worker_request(
        s, prefix,
        [&](const fs::path& scratch) {  // called again for a retried request
          nlohmann::json request = fields;
          if (!request.contains("scratch_dir")) request["scratch_dir"] = scratch.string();  // unless a test breaks it
          request["device"] = "cpu";
          return request;
        },
        [=](const std::string&) { return deadline_s; }, customize);
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    return outcome.ok() ? *outcome : WorkerOutcome{};
  }

  nlohmann::json result(const WorkerSetup& s, nlohmann::json fields = nlohmann::json::object(),
                        const std::string& prefix = "kz-test-") const {
    WorkerOutcome outcome = run(s, std::move(fields), prefix);
    EXPECT_EQ(outcome.kind, WorkerOutcome::Kind::result) << outcome.message;
    return outcome.result;
  }

  // A request served by a fork server whose children take 2 s to prepare their device: a request
  // handed over at once reaches its child while it prepares, even on a loaded machine.
  nlohmann::json served_by_slow_device() const {
    auto slow_device = [](ProcessSpec& spec) { spec.env["KZ_TEST_DEVICE_S"] = "2"; };
    WorkerOutcome outcome = run(setup(true), nlohmann::json::object(), "kz-test-slow-device-", 30, slow_device);
    EXPECT_EQ(outcome.kind, WorkerOutcome::Kind::result) << outcome.message;
    return outcome.result;
  }

  fs::path root_;
  fs::path zygote_library_;
};

INSTANTIATE_TEST_SUITE_P(ForkServers, WorkerClientTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "FromAZygote" : "OnTheirOwn"; });

TEST_P(WorkerClientTest, ForkServerRunsEachRequestInAFreshChild) {
  auto first = result(setup(true));
  auto second = result(setup(true));
  ASSERT_TRUE(first.contains("pid") && second.contains("pid")) << first.dump() << second.dump();
  EXPECT_EQ(first["ppid"], second["ppid"]) << "the same server forked both";
  EXPECT_NE(first["pid"], second["pid"]) << "every request gets its own process";
  EXPECT_EQ(first["cwd"], first["scratch"]) << "the child runs in the request's scratch dir";
  EXPECT_EQ(first["home"], first["scratch"]);
  EXPECT_NE(first["scratch"], second["scratch"]);
  EXPECT_EQ(fs::path(first["scratch"].get<std::string>()).parent_path(),
            fs::path(second["scratch"].get<std::string>()).parent_path())
      << "both inside the server's scratch dir";
  EXPECT_EQ(second["seen"], nlohmann::json::array({fs::path(second["scratch"].get<std::string>()).filename()}))
      << "nothing of the first request is left for the second";
  EXPECT_EQ(second["stdin"], "") << "a child cannot read the server's next requests";
  EXPECT_TRUE(second["imports_env"].is_null()) << "the child gets the supervisor's environment, not the imports'";

  auto other_kind = result(setup(true), nlohmann::json::object(), "kz-other-");
  EXPECT_NE(other_kind["ppid"], first["ppid"]) << "a server of another kind (scratch prefix) is not taken";
}

// Bytecode compiled by scripts/setup.sh for an interpreter without its own reaches every worker, a
// fork server's children and fresh workers alike; without one, Python keeps its own __pycache__.
TEST_P(WorkerClientTest, WorkersGetTheBytecodePrefix) {
  for (bool fork_server : {true, false}) {
    WorkerSetup with = setup(fork_server);
    with.bytecode_prefix = root_ / "pycache";
    EXPECT_EQ(result(with)["pycache_prefix"], (root_ / "pycache").string()) << "fork server: " << fork_server;
    EXPECT_TRUE(result(setup(fork_server))["pycache_prefix"].is_null()) << "fork server: " << fork_server;
  }
}

// Each request's Triton cache is its own, in its scratch dir (fork server's child or fresh worker),
// and the driver helper that setup built reaches it (worker/kz_worker/triton_helpers.py).
TEST_P(WorkerClientTest, EachRequestHasItsOwnTritonCacheAndTheSetupHelpers) {
  for (bool fork_server : {true, false}) {
    WorkerSetup with = setup(fork_server);
    with.triton_helpers_dir = root_ / "triton-helpers";
    auto first = result(with), second = result(with);
    for (const auto& reply : {first, second}) {
      EXPECT_EQ(reply["triton_cache"], (fs::path(reply["scratch"].get<std::string>()) / "triton").string())
          << "fork server: " << fork_server;
      EXPECT_EQ(reply["triton_helpers"], (root_ / "triton-helpers").string()) << "fork server: " << fork_server;
    }
    EXPECT_NE(first["triton_cache"], second["triton_cache"]) << "fork server: " << fork_server;
    EXPECT_TRUE(result(setup(fork_server))["triton_helpers"].is_null()) << "fork server: " << fork_server;
  }
}

// Sets an environment variable for one scope (nullptr: unset), restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// [worker] cuda_connections reaches every worker, a fork server's child or a fresh one, as
// CUDA_DEVICE_MAX_CONNECTIONS before any import; 0 leaves the driver's default (and the supervisor's
// own value never reaches a worker: its environment is scrubbed).
TEST_P(WorkerClientTest, WorkersGetTheirCudaConnections) {
  for (bool fork_server : {true, false}) {
    WorkerSetup with = setup(fork_server);
    with.cuda_connections = 1;
    EXPECT_EQ(result(with)["cuda_connections"], "1") << "fork server: " << fork_server;
    ScopedEnv supervisors("CUDA_DEVICE_MAX_CONNECTIONS", "4");
    EXPECT_TRUE(result(setup(fork_server))["cuda_connections"].is_null()) << "fork server: " << fork_server;
  }
}

// How long the niceness probes wait for a change the supervisor makes from another process, where
// one is expected (they return as soon as it shows): a loaded CI machine can take a while.
constexpr double kChangeWithin = 10.0;

// [tuning] timing_niceness: the supervisor gives the worker's process group that nice value for its timing
// stage and its own back at the next stage, a fork server's child or a fresh worker. Needs
// CAP_SYS_NICE (root), as in the supervisor on a GPU host; the test says so where it is missing.
TEST_P(WorkerClientTest, TheTimingStageRunsAtItsNiceness) {
  if (!nice_value_allowed(-7)) GTEST_SKIP() << "lowering a nice value to -7 needs CAP_SYS_NICE (root)";
  for (bool fork_server : {true, false}) {
    WorkerSetup boosted = setup(fork_server);
    boosted.timing_niceness = -7;
    auto niceness = result(boosted, {{"action", "timing_stage"}, {"change_within_s", kChangeWithin}})["niceness"];
    int own = getpriority(PRIO_PROCESS, 0);
    EXPECT_EQ(niceness, nlohmann::json::array({own, -7, own})) << "fork server: " << fork_server;
    // The server serves its next request at its own priority, and 0 leaves the priority alone.
    EXPECT_EQ(result(setup(fork_server), {{"action", "timing_stage"}})["niceness"],
              nlohmann::json::array({own, own, own}))
        << "fork server: " << fork_server;
  }
}

// [tuning] compile_niceness: likewise for the compile stage, a fork server's child or a fresh worker.
TEST_P(WorkerClientTest, TheCompileStageRunsAtItsNiceness) {
  if (!nice_value_allowed(-6)) GTEST_SKIP() << "lowering a nice value to -6 needs CAP_SYS_NICE (root)";
  int own = getpriority(PRIO_PROCESS, 0);
  for (bool fork_server : {true, false}) {
    WorkerSetup boosted = setup(fork_server);
    boosted.compile_niceness = -6;
    EXPECT_EQ(result(boosted, {{"action", "compile_stage"}, {"change_within_s", kChangeWithin}})["niceness"],
              nlohmann::json::array({-6, own}))
        << "fork server: " << fork_server;
    EXPECT_EQ(result(setup(fork_server), {{"action", "compile_stage"}})["niceness"], nlohmann::json::array({own, own}))
        << "0 leaves it alone; fork server: " << fork_server;
    // Prepared at an increment too: the compile stage's value, then the supervisor's.
    boosted.prepare_niceness = -3;
    EXPECT_EQ(result(boosted, {{"action", "compile_stage"}, {"change_within_s", kChangeWithin}})["niceness"],
              nlohmann::json::array({-6, own}))
        << "prepared apart; fork server: " << fork_server;
  }
}

// [tuning] prepare_niceness: a worker starts and prepares its device at that nice value, and the
// supervisor sets it to its own at the first stage message, before the request's code; a fork
// server's group stays there, so its next request is prepared and run at the supervisor's. Root only.
TEST_P(WorkerClientTest, OnlyThePreparationRunsAtThePrepareNiceness) {
  int own = getpriority(PRIO_PROCESS, 0);
  if (!nice_value_allowed(std::max(own - 6, -20)) || !nice_value_allowed(-7))
    GTEST_SKIP() << "lowering a nice value needs CAP_SYS_NICE (root)";
  for (bool fork_server : {true, false}) {
    WorkerSetup favoured = setup(fork_server);
    favoured.prepare_niceness = -6;
    auto first = result(favoured, {{"action", "first_stage"}, {"change_within_s", kChangeWithin}});
    EXPECT_EQ(first["niceness"], nlohmann::json::array({std::max(own - 6, -20), own})) << "fork server: " << fork_server;
    // A fork server's next child is not reniced: the short wait where nothing changes.
    auto next = result(favoured, {{"action", "first_stage"}, {"change_within_s", fork_server ? 0.5 : kChangeWithin}});
    if (fork_server) {
      ASSERT_EQ(next["ppid"], first["ppid"]) << "the same server again";
      EXPECT_EQ(next["niceness"], nlohmann::json::array({own, own})) << "its next child was prepared at the supervisor's";
    } else {
      EXPECT_EQ(next["niceness"], first["niceness"]) << "a new worker, prepared at the increment again";
    }
    // With a timing boost too: the supervisor's value once it read the first stage message, the
    // timing stage's, then the supervisor's again.
    favoured.timing_niceness = -7;
    EXPECT_EQ(result(favoured, {{"action", "timing_stage"}, {"reset_to", own}, {"change_within_s", kChangeWithin}})["niceness"],
              nlohmann::json::array({own, -7, own}))
        << "fork server: " << fork_server;
  }
  EXPECT_EQ(result(setup(true), {{"action", "first_stage"}})["niceness"], nlohmann::json::array({own, own}))
      << "0: no increment";
}

// resolve_worker_setup takes the prefix only once setup finished it (its marker), and only for the
// interpreter it was made with: another interpreter's own bytecode would be hidden by it.
TEST_P(WorkerClientTest, TheBytecodePrefixIsTheBuildInterpretersOnceComplete) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "run through ctest";
  fs::path prefix = root_ / "pycache";
  fs::create_directories(prefix);
  ScopedEnv no_python("KZ_PYTHON", nullptr);
  ScopedEnv at("KZ_BYTECODE_PREFIX", prefix.c_str());
  WorkerOptions options;
  options.worker_dir = fs::path(source_dir) / "worker";
  auto unfinished = resolve_worker_setup(options, TuningOptions{}, "cpu");
  ASSERT_TRUE(unfinished.ok()) << unfinished.status().to_string();
  EXPECT_TRUE(unfinished->bytecode_prefix.empty()) << "no marker: compiling did not finish";

  ASSERT_TRUE(write_file_atomic(prefix / ".kz-complete", "python\n").is_ok());
  auto finished = resolve_worker_setup(options, TuningOptions{}, "cpu");
  ASSERT_TRUE(finished.ok()) << finished.status().to_string();
  EXPECT_EQ(finished->bytecode_prefix, prefix);

  options.python = "python3";  // not the build's interpreter
  auto other = resolve_worker_setup(options, TuningOptions{}, "cpu");
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_TRUE(other->bytecode_prefix.empty());
}

// Setup's Triton helpers are handed over only once setup finished them (their marker).
TEST_P(WorkerClientTest, TritonHelpersAreHandedOverOnceComplete) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "run through ctest";
  fs::path helpers = root_ / "triton-helpers";
  fs::create_directories(helpers);
  ScopedEnv at("KZ_TRITON_HELPERS_DIR", helpers.c_str());
  WorkerOptions options;
  options.worker_dir = fs::path(source_dir) / "worker";
  auto unfinished = resolve_worker_setup(options, TuningOptions{}, "cuda:0");
  ASSERT_TRUE(unfinished.ok()) << unfinished.status().to_string();
  EXPECT_TRUE(unfinished->triton_helpers_dir.empty()) << "no marker: setup did not finish";
  ASSERT_TRUE(write_file_atomic(helpers / ".kz-complete", "").is_ok());
  auto finished = resolve_worker_setup(options, TuningOptions{}, "cuda:0");
  ASSERT_TRUE(finished.ok()) << finished.status().to_string();
  EXPECT_EQ(finished->triton_helpers_dir, helpers);
}

// The next request's child is forked as soon as a child has its request and its device, and prepares
// its own device (the stand-in's prepare_device takes 0.3 s) while the server relays or waits.
TEST_P(WorkerClientTest, TheNextChildPreparesBeforeItsRequest) {
  auto first = result(setup(true));
  // The spare: forked ~0.3 s after the first request, ready 0.3 s later (~0.6 s; more room for a
  // loaded CI machine).
  std::this_thread::sleep_for(2000ms);
  auto second = result(setup(true));
  ASSERT_TRUE(second.contains("prepared_at") && second["prepared_at"].is_number()) << second.dump();
  EXPECT_EQ(second["ppid"], first["ppid"]);
  EXPECT_GE(second["requested_at"].get<double>() - second["prepared_at"].get<double>(), 0.2)
      << "prepared while the server waited, not after the request came";
}

// A new server's first child is still preparing its device when its request comes (a cold batch's
// first wave): the next spare is forked only once that child's first message says it is prepared, so
// the two do not make their CUDA contexts side by side.
TEST_P(WorkerClientTest, TheNextChildPreparesOnlyOnceThePreviousIsPrepared) {
  auto first = served_by_slow_device();
  auto second = served_by_slow_device();
  ASSERT_TRUE(first.contains("prepared_at") && second.contains("device_started_at")) << first.dump() << second.dump();
  ASSERT_EQ(second["ppid"], first["ppid"]) << "the same server";
  ASSERT_GT(first["startup_s"].value("device", 0.0), 0.0)
      << "the first child was handed its request while preparing (else this test shows nothing): " << first.dump();
  EXPECT_GE(second["device_started_at"].get<double>(), first["prepared_at"].get<double>())
      << "the spare prepared beside the child it follows";
}

// A request waits for its child's device only where it was handed over while the child prepared
// (fork_server.run_child's startup_s "device"): a spare that was ready costs it nothing.
TEST_P(WorkerClientTest, ARequestWaitsForItsChildsDeviceOnlyWhileItPrepares) {
  auto first = served_by_slow_device();
  ASSERT_GT(first["startup_s"].value("device", 0.0), 0.0) << "handed over while preparing: " << first.dump();
  std::this_thread::sleep_for(4000ms);  // the next spare's 2 s preparation ends first
  auto later = served_by_slow_device();
  ASSERT_EQ(later["ppid"], first["ppid"]) << "the same server";
  ASSERT_EQ(later["startup_s"].value("device", -1.0), 0.0) << "its child was ready: " << later.dump();
}

// The spare for the next request is forked while this one runs, but after the server dropped it:
// nothing of this request (its source, its seed) is an object in the next candidate's process.
TEST_P(WorkerClientTest, TheNextChildHoldsNothingOfThePreviousRequest) {
  auto first = result(setup(true), {{"token", "kz-previous-request"}});
  auto second = result(setup(true), {{"action", "look_for"}, {"look_for", "kz-previous-request"}});
  ASSERT_TRUE(second.contains("found")) << second.dump();
  EXPECT_EQ(second["ppid"], first["ppid"]) << "the same server";
  EXPECT_FALSE(second["found"].get<bool>());
}

// A spare child runs no candidate code, but a candidate can signal it (same uid, same process
// group): one that is stopped or killed is replaced, never handed the next request.
TEST_P(WorkerClientTest, ASpareStoppedOrKilledByACandidateIsReplaced) {
  for (int sig : {SIGSTOP, SIGKILL}) {
    auto stopper = result(setup(true), {{"action", "signal_siblings"}, {"signal", sig}});
    ASSERT_TRUE(stopper.contains("stopped")) << stopper.dump();
    ASSERT_EQ(stopper["stopped"].size(), 1u) << "the spare forked beside it: " << stopper.dump();
    int spare = stopper["stopped"][0].get<int>();
    auto next = result(setup(true));
    ASSERT_TRUE(next.contains("pid")) << next.dump();
    EXPECT_NE(next["pid"].get<int>(), spare) << "signal " << sig;
    EXPECT_EQ(next["ppid"], stopper["ppid"]) << "the same server, signal " << sig;
    EXPECT_FALSE(fs::exists(fs::path("/proc") / std::to_string(spare))) << "the spare is gone, signal " << sig;
  }
}

TEST_P(WorkerClientTest, ChildDeathIsACrashAndTheServerGoesOn) {
  auto before = result(setup(true));
  WorkerOutcome exited = run(setup(true), {{"action", "exit"}});
  EXPECT_EQ(exited.kind, WorkerOutcome::Kind::crashed);
  EXPECT_NE(exited.message.find("exit code 9"), std::string::npos) << exited.message;
  EXPECT_NE(exited.message.find("stderr of exit"), std::string::npos) << exited.message;
  EXPECT_EQ(exited.message.find("stderr of \n"), std::string::npos) << "only this request's stderr: " << exited.message;

  WorkerOutcome cpu = run(setup(true), {{"action", "cpu_limit"}});
  EXPECT_EQ(cpu.kind, WorkerOutcome::Kind::crashed);
  EXPECT_EQ(cpu.limit_hit, LimitHit::cpu_time) << cpu.message;

  auto after = result(setup(true));
  EXPECT_EQ(after["ppid"], before["ppid"]) << "the server survived its children's deaths";
}

TEST_P(WorkerClientTest, ProcessesAChildLeftBehindAreKilledBeforeTheNextRequest) {
  fs::path pid_file = root_ / "daemon.pid";
  auto outcome = result(setup(true), {{"action", "daemon"}, {"daemon_pid_file", pid_file.string()}});
  ASSERT_TRUE(outcome.contains("pid")) << outcome.dump();
  auto pid = read_file(pid_file);
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  EXPECT_NE(::kill(std::stoi(*pid), 0), 0) << "the detached daemon is gone once the request is answered";
  auto next = result(setup(true));
  EXPECT_EQ(next["ppid"], outcome["ppid"]);
}

TEST_P(WorkerClientTest, ThreadGroupWhoseLeaderExitedIsKilledToo) {
#if defined(__x86_64__)
  const int sys_exit = 60;
#elif defined(__aarch64__)
  const int sys_exit = 93;
#else
  GTEST_SKIP() << "SYS_exit's number is known here for x86-64 and arm64 only";
#endif
  fs::path pid_file = root_ / "leader.pid";
  auto outcome = result(setup(true), {{"action", "zombie_leader"}, {"daemon_pid_file", pid_file.string()},
                                      {"sys_exit", sys_exit}});
  ASSERT_TRUE(outcome.contains("pid")) << outcome.dump();
  auto pid = read_file(pid_file);
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  EXPECT_FALSE(fs::exists(fs::path("/proc") / *pid))
      << "a process that /proc shows as a zombie while its thread runs on is gone before the next request";
}

TEST_P(WorkerClientTest, ProcessCapCrossedInOneRequestIsNotChargedToTheNext) {
  auto capped = [](ProcessSpec& spec) { spec.limits.max_processes = 8; };
  WorkerOutcome burst = run(setup(true), {{"action", "fork_burst"}}, "kz-test-", 30, capped);
  if (burst.sandbox.process_cap == "cgroup") {  // it counts the forks it refused; polling may miss a burst
    EXPECT_EQ(burst.limit_hit, LimitHit::processes) << "the burst is charged to its own request: " << burst.message;
  }
  WorkerOutcome next = run(setup(true), {{"action", "linger"}}, "kz-test-", 30, capped);
  EXPECT_EQ(next.kind, WorkerOutcome::Kind::result) << next.message;
  EXPECT_EQ(next.limit_hit, LimitHit::none) << "the previous request's burst is not this one's";
}

TEST_P(WorkerClientTest, MessageTooDeepToParseIsAProtocolError) {
  WorkerOutcome nested = run(setup(true), {{"action", "nested"}});
  EXPECT_EQ(nested.kind, WorkerOutcome::Kind::protocol_error) << nested.message;
  EXPECT_NE(nested.message.find("invalid_message"), std::string::npos) << nested.message;
}

// A child that cannot set up (here: its scratch dir is missing) fails before any candidate code:
// not the candidate's failure, so the request runs once more before it is reported.
TEST_P(WorkerClientTest, ServerFailureBeforeTheChildsFirstMessageIsRetried) {
  WorkerOutcome failed = run(setup(true), {{"scratch_dir", (root_ / "missing").string()}});
  EXPECT_EQ(failed.kind, WorkerOutcome::Kind::crashed) << failed.message;
  EXPECT_NE(failed.message.find("could not set up"), std::string::npos) << failed.message;
  auto next = result(setup(true));  // the same server: its third request (the failed one ran twice)
  ASSERT_TRUE(next.contains("scratch")) << next.dump();
  // request-<n>-<16 random hex>: a name a candidate cannot guess (worker_client.cpp)
  std::string name = fs::path(next["scratch"].get<std::string>()).filename().string();
  EXPECT_EQ(name.rfind("request-3-", 0), 0u) << name;
  EXPECT_EQ(name.size(), std::string("request-3-").size() + 16) << name;
}

TEST_P(WorkerClientTest, ForgedServerMessageIsAProtocolError) {
  WorkerOutcome forged = run(setup(true), {{"action", "forge"}});
  EXPECT_EQ(forged.kind, WorkerOutcome::Kind::protocol_error) << forged.message;
  EXPECT_NE(forged.message.find("forged_message"), std::string::npos) << forged.message;
}

// Candidate code that writes a verdict of its own on the message pipe does not know the request's
// token: the supervisor refuses the message, on a fork server and on a worker started for it.
TEST_P(WorkerClientTest, AMessageWithoutTheRequestsTokenIsAForgery) {
  for (bool fork_server : {true, false}) {
    WorkerOutcome forged = run(setup(fork_server), {{"action", "forge_result"}});
    EXPECT_EQ(forged.kind, WorkerOutcome::Kind::forged) << forged.message;
    EXPECT_NE(forged.message.find("without the request's token"), std::string::npos) << forged.message;
    EXPECT_EQ(forged.stage, "startup");
  }
  auto honest = result(setup(true));
  EXPECT_FALSE(honest.contains("token")) << "the supervisor strips the token: " << honest.dump();
}

TEST_P(WorkerClientTest, TimeoutKillsTheServerAndTheNextRequestGetsANewOne) {
  auto before = result(setup(true));
  WorkerOutcome hung = run(setup(true), {{"action", "hang"}}, "kz-test-", 1.0);
  EXPECT_EQ(hung.kind, WorkerOutcome::Kind::timeout) << hung.message;
  auto after = result(setup(true));
  ASSERT_TRUE(after.contains("ppid")) << after.dump();
  EXPECT_NE(after["ppid"], before["ppid"]) << "the killed server is not reused";
}

TEST_P(WorkerClientTest, ServerKilledWhileIdleIsReplaced) {
  auto first = result(setup(true));
  ASSERT_EQ(::kill(first["ppid"].get<int>(), SIGKILL), 0);
  std::this_thread::sleep_for(200ms);
  auto next = result(setup(true));
  ASSERT_TRUE(next.contains("ppid")) << next.dump();
  EXPECT_NE(next["ppid"], first["ppid"]);
}

TEST_P(WorkerClientTest, IdleServersBeyondTheCapAreKilled) {
  WorkerSetup capped = setup(true);
  capped.max_idle_servers = 1;
  nlohmann::json first, second;
  std::thread other([&] { first = result(capped, {{"action", "linger"}}); });
  second = result(capped, {{"action", "linger"}});  // at the same time: two servers
  other.join();
  ASSERT_TRUE(first.contains("ppid") && second.contains("ppid")) << first.dump() << second.dump();
  ASSERT_NE(first["ppid"], second["ppid"]);
  int alive = 0;
  for (const auto& run : {first, second}) alive += running(run["ppid"].get<int>());
  EXPECT_EQ(alive, 1) << "one server kept idle, the other killed when its request ended";
}

TEST_P(WorkerClientTest, StartedServersTakeTheFirstRequests) {
  ASSERT_TRUE(start_fork_servers(setup(true), "kz-test-", {}, 2).is_ok());
  std::this_thread::sleep_for(3000ms);  // they start meanwhile (~0.5 s idle; room for a loaded machine)
  double sent_at = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  auto first = result(setup(true));
  ASSERT_TRUE(first.contains("imported_at")) << first.dump();
  // The same clock (CLOCK_MONOTONIC) on both sides; not a duration, which a loaded machine stretches.
  EXPECT_LT(first["imported_at"].get<double>(), sent_at) << "forked from a server prepared before the request";
}

// eval-suite ends its servers before it exits: every idle one and every zygote, their scratch dirs
// removed, and a later request starts its own again.
TEST_P(WorkerClientTest, StoppedServersAndZygotesAreGoneAndTheNextRequestStartsAgain) {
  nlohmann::json first, second;
  std::thread beside([&] { first = result(setup(true), {{"action", "linger"}}); });
  second = result(setup(true), {{"action", "linger"}});  // at once: two servers
  beside.join();
  ASSERT_TRUE(first.contains("ppid") && second.contains("ppid")) << first.dump() << second.dump();
  ASSERT_NE(first["ppid"], second["ppid"]);
  EXPECT_GE(stop_fork_servers(), 2);
  std::vector<pid_t> ended = {first["ppid"].get<int>(), second["ppid"].get<int>()};
  if (zygote()) ended.push_back(first["prepared_by"].get<int>());
  for (pid_t pid : ended) EXPECT_FALSE(running(pid)) << pid << " outlived stop_fork_servers";
  std::error_code error;
  std::vector<std::string> left;
  for (const auto& entry : fs::recursive_directory_iterator(root_ / "scratch", error))
    if (entry.path().filename().string().starts_with("kz-test-")) left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty()) << "the servers' and zygote's scratch dirs are removed; left: " << fmt::format("{}", fmt::join(left, ", "));
  EXPECT_EQ(stop_fork_servers(), 0) << "nothing left to stop";
  auto next = result(setup(true));
  ASSERT_TRUE(next.contains("ppid")) << next.dump();
  EXPECT_NE(next["ppid"], first["ppid"]);
  EXPECT_NE(next["ppid"], second["ppid"]);
  if (zygote()) EXPECT_NE(next["prepared_by"], first["prepared_by"]) << "a new zygote";
}

// A zygote that dies before its first fork (here: its library is missing) costs no verdict: servers
// of that kind start on their own, with one warning that says why, not one per server or batch.
TEST_P(WorkerClientTest, ServersStartOnTheirOwnWhereTheirZygoteFailsWithOneWarning) {
  if (!zygote()) GTEST_SKIP() << "no zygote on this side";
  WorkerSetup broken = setup(true);
  broken.zygote_library = root_ / "no-such-kz_zygote_child.so";
  ::testing::internal::CaptureStderr();
  auto first = result(broken, nlohmann::json::object(), "kz-no-zygote-");
  EXPECT_TRUE(start_fork_servers(broken, "kz-no-zygote-", {}, 1).is_ok());  // as eval-suite's next batch
  auto second = result(broken, nlohmann::json::object(), "kz-no-zygote-");
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(first.contains("pid") && second.contains("pid")) << first.dump() << second.dump();
  EXPECT_NE(first["pid"], second["pid"]);
  size_t at = warnings.find("kz: worker zygote:");
  ASSERT_NE(at, std::string::npos) << warnings;
  EXPECT_EQ(warnings.find("kz: worker zygote:", at + 1), std::string::npos) << "warned again:\n" << warnings;
  EXPECT_NE(warnings.find("no-such-kz_zygote_child.so"), std::string::npos) << "says why:\n" << warnings;
}

TEST_P(WorkerClientTest, ServersOfAKindArePreparedOnceByTheirZygote) {
  if (!zygote()) GTEST_SKIP() << "servers on their own prepare each for itself";
  auto without_capabilities = [](ProcessSpec& spec) { spec.drop_capabilities = true; };
  ASSERT_TRUE(start_fork_servers(setup(true), "kz-test-zygote-", without_capabilities, 2).is_ok());
  auto request = [&] {
    WorkerOutcome outcome = run(setup(true), {{"action", "linger"}}, "kz-test-zygote-", 30, without_capabilities);
    EXPECT_EQ(outcome.kind, WorkerOutcome::Kind::result) << outcome.message;
    return outcome.result;
  };
  nlohmann::json first, second;
  std::thread beside([&] { first = request(); });  // at once: two servers
  second = request();
  beside.join();
  ASSERT_TRUE(first.contains("prepared_by") && second.contains("prepared_by")) << first.dump() << second.dump();
  EXPECT_NE(first["ppid"], second["ppid"]) << "two servers";
  EXPECT_EQ(first["prepared_by"], second["prepared_by"]) << "both forked from the process that prepared";
  EXPECT_NE(first["prepared_by"], first["ppid"]) << "not prepared by the server itself";
  EXPECT_NE(first["prepared_by"], ::getpid());
  EXPECT_TRUE(first["imports_env"].is_null()) << "the server has the supervisor's environment, not the zygote's";
  EXPECT_EQ(first["home"], first["scratch"]);
  // Forked, never exec'd: the capabilities go with the sandbox's own step, not with an exec.
  EXPECT_EQ(first["cap_eff"], "0000000000000000") << "a zygote's server kept its capabilities";
}

// Drops CAP_SYS_ADMIN from this process and all it execs, as a container's root lacks it: the
// namespaces and mounts are then refused.
void drop_cap_sys_admin() {
  ASSERT_EQ(::prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0), 0);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  ASSERT_EQ(::syscall(SYS_capget, &header, data), 0);
  data[0].effective &= ~(1u << CAP_SYS_ADMIN);
  data[0].permitted &= ~(1u << CAP_SYS_ADMIN);
  ASSERT_EQ(::syscall(SYS_capset, &header, data), 0);
}

TEST_P(WorkerClientTest, RequiredIsolationTheMachineRefusesIsAnError) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the test drops CAP_SYS_ADMIN to see the namespaces refused";
  auto isolated = [](ProcessSpec& spec) {
    spec.new_network_namespace = spec.read_only_filesystem = spec.new_pid_namespace = true;
    spec.drop_capabilities = true;
    spec.writable_paths = {spec.cwd, "/dev/shm"};
  };
  WorkerSetup required = setup(true);
  required.require_isolation = true;
  WorkerOutcome granted = run(required, nlohmann::json::object(), "kz-test-isolated-", 30, isolated);
  EXPECT_EQ(granted.kind, WorkerOutcome::Kind::result) << "with the capability every isolation holds: "
                                                       << granted.message;
  auto refused = [&](const WorkerSetup& s) {
    drop_cap_sys_admin();
    auto outcome = run_worker_request(
        s, "kz-test-refused-", [](const fs::path& scratch) {
          return nlohmann::json{{"scratch_dir", scratch.string()}, {"device", "cpu"}};
        },
        [](const std::string&) { return 30.0; }, isolated);
    std::fprintf(stderr, "%s\n", outcome.ok() ? "the request ran" : outcome.status().message().c_str());
    std::_Exit(outcome.ok() ? 0 : 3);
  };
  EXPECT_EXIT(refused(required), ::testing::ExitedWithCode(3),
              zygote() ? "did not get its own network namespace.*its own PID namespace.*require_isolation.*"
                         "own PID namespace: unshare\\(CLONE_NEWPID\\)"  // the zygote's refusal, not a fallback's
                       : "did not get its own network namespace.*its own PID namespace.*require_isolation");
  WorkerSetup tolerant = setup(true);  // the default: it runs without, with notes
  EXPECT_EXIT(refused(tolerant), ::testing::ExitedWithCode(0), "the request ran");
}

// The scratch dirs (anywhere under `scratch_root`, named `prefix`...) that live processes are in.
std::set<std::string> dirs_with_processes(const fs::path& scratch_root, const std::string& prefix) {
  std::set<std::string> dirs;
  for (const auto& process : test::live_processes()) {
    std::error_code error;
    fs::path cwd = fs::read_symlink(process.dir() / "cwd", error);
    if (error || !cwd.string().starts_with(scratch_root.string() + "/")) continue;
    for (const auto& part : cwd)
      if (part.string().starts_with(prefix)) dirs.insert(part.string());
  }
  return dirs;
}

// A zygote that cannot return to its own PID namespace after forking a server into a new one (setns
// refused, as some container profiles refuse it) would fork the next server into that server's
// namespace, beside its candidates. It ends instead: the request is served by a server started on
// its own, with a warning that says why, and the server the zygote forked before ending does not
// outlive it (its pipes were the supervisor's, which closes them).
TEST_P(WorkerClientTest, AZygoteThatCannotSetnsBackEndsAndServersStartOnTheirOwn) {
  if (!zygote()) GTEST_SKIP() << "servers on their own make no zygote";
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the zygote makes a PID namespace for each server";
  if (std::system(fmt::format("'{}' setns -- true", KZ_REFUSE_SYSCALL_EXEC).c_str()) != 0)
    GTEST_SKIP() << "no seccomp filter here";
  fs::path python = root_ / "python3-without-setns";
  ASSERT_TRUE(write_file_atomic(python, fmt::format("#!/bin/sh\nexec '{}' setns -- python3 \"$@\"\n",
                                                    KZ_REFUSE_SYSCALL_EXEC)).is_ok());
  fs::permissions(python, fs::perms::owner_all);
  WorkerSetup s = setup(true);
  s.python = python.string();
  auto own_pid_namespace = [](ProcessSpec& spec) {  // with its own /proc, which needs the read-only mounts
    spec.new_pid_namespace = spec.read_only_filesystem = true;
    spec.writable_paths = {spec.cwd, "/dev/shm"};
  };
  ::testing::internal::CaptureStderr();
  WorkerOutcome outcome = run(s, nlohmann::json::object(), "kz-test-no-setns-", 30, own_pid_namespace);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(outcome.kind, WorkerOutcome::Kind::result) << outcome.message << "\n" << warnings;
  EXPECT_NE(warnings.find("kz: worker zygote:"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("setns to its own PID namespace: Operation not permitted"), std::string::npos)
      << "says why:\n" << warnings;
  // Left: the server that answered, idle, with its next child, both in its scratch dir.
  std::set<std::string> dirs;
  for (auto deadline = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(50ms))
    if ((dirs = dirs_with_processes(root_ / "scratch", "kz-test-no-setns-")).size() <= 1) break;
  EXPECT_EQ(dirs.size(), 1u) << "a server forked by the zygote before it ended lives on: " << fmt::format("{}", fmt::join(dirs, ", "));
}

TEST_P(WorkerClientTest, WithoutForkServerEachRequestStartsItsWorker) {
  auto first = result(setup(false));
  double sent_at = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  auto second = result(setup(false));
  ASSERT_TRUE(first.contains("pid") && second.contains("pid")) << first.dump() << second.dump();
  EXPECT_NE(first["pid"], second["pid"]);
  EXPECT_EQ(first["ppid"], ::getpid()) << "no server: each worker is started for its request by the supervisor";
  EXPECT_EQ(first["cwd"], first["scratch"]);
  EXPECT_FALSE(fs::exists(first["scratch"].get<std::string>())) << "removed after the evaluation";
  // The same clock (CLOCK_MONOTONIC) on both sides: not a duration, which a loaded machine stretches.
  EXPECT_GE(second["imported_at"].get<double>(), sent_at) << "started for the second request";
}

}  // namespace
}  // namespace kz
