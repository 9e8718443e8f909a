// Integration tests of the evaluation engine: the real supervisor (kz::Evaluator) driving the real
// Python worker on device "cpu", one fixture candidate per failure mode.
//
// Fixtures live in eval/tests/fixtures/ (each says in its docstring what it should trigger); the
// correct candidates are the suite's own examples. On the CPU, triton candidates run under the
// Triton interpreter, cuda-rtc candidates are compiled by NVRTC only, and cuda (load_inline)
// candidates really build with nvcc: those are slow (minutes) and are compiled into a separate
// target, eval_cuda_compile_test (this file built with KZ_CUDA_COMPILE_TESTS, label "slow").
//
// Needs KZ_SOURCE_DIR (CTest sets it) to find the suite and fixtures.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/eval/evaluator.h"
#include "kz/task/task.h"
#include "test_support.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

using test::have_nvcc;
using test::source_dir;

class EvaluatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  }

  // Default options (device cpu, format auto), but few trials to keep the interpreter quick.
  static EvalOptions options(int trials = 2) {
    EvalOptions o;
    o.trials = trials;
    return o;
  }

  static Evaluator make_evaluator(const EvalOptions& o) {
    auto evaluator = Evaluator::create(o);
    // Fatal for the test (GoogleTest reports the exception), not for the whole binary.
    if (!evaluator.ok()) throw std::runtime_error("Evaluator::create: " + evaluator.status().to_string());
    return std::move(evaluator).value();
  }

  static Task reference(const std::string& relative) {
    auto task = load_task_file(source_dir() / relative);
    if (!task.ok()) {
      ADD_FAILURE() << "load_task_file(" << relative << "): " << task.status().to_string();
      return Task{};
    }
    return *task;
  }

  static Candidate candidate(const std::string& relative) {
    auto source = read_file(source_dir() / relative);
    if (!source.ok()) ADD_FAILURE() << "read_file(" << relative << "): " << source.status().to_string();
    return Candidate{relative, source.ok() ? *source : std::string()};
  }

  static Verdict evaluate(const Evaluator& evaluator, const std::string& ref, const std::string& cand,
                          EvalMode mode = EvalMode::full) {
    auto verdict = evaluator.evaluate(reference(ref), candidate(cand), mode);
    if (!verdict.ok()) {
      ADD_FAILURE() << "evaluate(" << cand << ") could not run: " << verdict.status().to_string();
      return make_verdict(EvalStatus::infra_error, {}, verdict.status().message());
    }
    return *verdict;
  }

  static Verdict evaluate(const std::string& ref, const std::string& cand, EvalOptions o = options()) {
    return evaluate(make_evaluator(o), ref, cand);
  }
};

constexpr const char* kRelu = "suite/kzbench/level1/02_relu.py";
constexpr const char* kTritonRelu = "suite/examples/triton/02_relu.py";
const std::string kFixtures = "eval/tests/fixtures/";

// The whole verdict, for failure messages.
std::string dump(const Verdict& v) { return to_json(v).dump(2); }

[[maybe_unused]] void expect_ok(const Verdict& v) {
  EXPECT_EQ(status_name(v.status), std::string("ok")) << dump(v);
  EXPECT_TRUE(v.checks.empty()) << dump(v);
  EXPECT_TRUE(v.correct) << dump(v);
  EXPECT_TRUE(v.compiled) << dump(v);
  EXPECT_EQ(v.trials_passed, v.trials) << dump(v);
  EXPECT_FALSE(v.speedup.has_value()) << "no timing on the CPU\n" << dump(v);
}

// The status, and that each listed check fired (others may fire too).
void expect_verdict(const Verdict& v, EvalStatus status, std::initializer_list<Check> checks) {
  EXPECT_EQ(status_name(v.status), std::string(status_name(status))) << dump(v);
  for (Check c : checks) EXPECT_TRUE(v.has_check(c)) << "check " << check_name(c) << " did not fire\n" << dump(v);
  EXPECT_FALSE(v.correct) << dump(v);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#ifndef KZ_CUDA_COMPILE_TESTS

// ---- construction ------------------------------------------------------------------------------

TEST_F(EvaluatorTest, CreateFailsForMissingWorkerDir) {
  EvalOptions o = options();
  o.worker.worker_dir = "/nonexistent/kz-worker";
  auto evaluator = Evaluator::create(o);
  ASSERT_FALSE(evaluator.ok());
  EXPECT_TRUE(contains(evaluator.status().message(), "worker")) << evaluator.status().message();
}

TEST_F(EvaluatorTest, CreateFailsForMissingPython) {
  EvalOptions o = options();
  o.worker.python = "/nonexistent/bin/python";
  auto evaluator = Evaluator::create(o);
  ASSERT_FALSE(evaluator.ok());
  EXPECT_TRUE(contains(evaluator.status().message(), "/nonexistent/bin/python")) << evaluator.status().message();
}

// ---- triton: correct and wrong -----------------------------------------------------------------

TEST_F(EvaluatorTest, TritonCorrectIsOk) {
  EvalOptions o = options();
  o.cache.enabled = false;  // a real run: its own stage times and wall time
  Verdict v = evaluate(kRelu, kTritonRelu, o);
  expect_ok(v);
  EXPECT_EQ(v.format, "triton");
  EXPECT_EQ(v.device, "cpu");
  EXPECT_EQ(v.task_id, "02_relu");
  EXPECT_EQ(v.trials, 2);
  EXPECT_EQ(v.stage, "correctness");
  EXPECT_NE(v.seed, 0u) << "a fresh seed is drawn when none is fixed";
  EXPECT_LE(v.max_abs_error, 1e-6);
  // Where the time went, stage by stage, in order; together they are the worker's whole run.
  std::vector<std::string> stages;
  double total = 0;
  for (const auto& [stage, seconds] : v.profile.stage_s) {
    stages.push_back(stage);
    EXPECT_GE(seconds, 0.0) << stage;
    total += seconds;
  }
  EXPECT_EQ(stages, (std::vector<std::string>{"startup", "load_reference", "compile", "correctness"})) << dump(v);
  EXPECT_LE(total, v.profile.wall_s) << dump(v);
  EXPECT_GT(total, 0.5 * v.profile.wall_s) << dump(v);
  // The correctness stage's parts, measured by the worker: within the stage's own seconds. The
  // supervisor times a stage between its messages' arrivals, the worker its parts by its own clock:
  // the messages' latencies (ms idle; more on a loaded machine, through a fork server's relay) are
  // the slack.
  constexpr double kMessageSlackS = 0.5;
  std::vector<std::string> parts;
  double parts_total = 0;
  for (const auto& [part, seconds] : v.profile.correctness_s) {
    parts.push_back(part);
    parts_total += seconds;
  }
  EXPECT_EQ(parts, (std::vector<std::string>{"audit", "replay_probe", "trials"})) << dump(v);
  EXPECT_LE(parts_total, v.profile.stage_s.back().second + kMessageSlackS) << dump(v);
  // The load_reference stage's parts likewise (nlohmann's object keeps them sorted by name).
  parts.clear();
  parts_total = 0;
  for (const auto& [part, seconds] : v.profile.load_reference_s) {
    parts.push_back(part);
    parts_total += seconds;
  }
  EXPECT_EQ(parts, (std::vector<std::string>{"build", "import", "inputs", "warm_up"})) << dump(v);
  // The compile stage's likewise: no NVRTC for a Triton candidate.
  double compile_total = 0;
  std::vector<std::string> compile_parts;
  for (const auto& [part, seconds] : v.profile.compile_s) {
    compile_parts.push_back(part);
    compile_total += seconds;
  }
  EXPECT_EQ(compile_parts, (std::vector<std::string>{"construct", "import", "to_device"})) << dump(v);
  const auto& ran = v.profile.stage_s;
  auto compile_stage = std::find_if(ran.begin(), ran.end(), [](const auto& s) { return s.first == "compile"; });
  ASSERT_NE(compile_stage, ran.end()) << dump(v);
  EXPECT_LE(compile_total, compile_stage->second + kMessageSlackS) << dump(v);
  auto stage = std::find_if(ran.begin(), ran.end(), [](const auto& s) { return s.first == "load_reference"; });
  ASSERT_NE(stage, ran.end()) << dump(v);
  EXPECT_LE(parts_total, stage->second + kMessageSlackS) << dump(v);
  EXPECT_TRUE(v.profile.gpu_wait_by_stage_s.empty()) << "the CPU takes no GPU lock: " << dump(v);
  // Its CPU seconds, reported by the worker: a fork server's child counts its own run, not the
  // server's imports (the wait for the server, in wall_s, is where those went).
  std::map<std::string, double> cpu(v.profile.cpu_s.begin(), v.profile.cpu_s.end());
  ASSERT_TRUE(cpu.contains("worker") && cpu.contains("subprocesses")) << dump(v);
  std::map<std::string, double> startup(v.profile.startup_s.begin(), v.profile.startup_s.end());
  ASSERT_TRUE(startup.contains("server")) << "served by a fork server: " << dump(v);
  EXPECT_GT(cpu["worker"], 0.01) << dump(v);
  EXPECT_LT(cpu["worker"], 2 * (v.profile.wall_s - startup["server"]))
      << "at most both cores, after the server: " << dump(v);
  EXPECT_GE(cpu["subprocesses"], 0.0) << dump(v);
}

// [tuning] fork_server through the real worker: the server imports torch and Triton (interpreter
// mode, set before the import) once; every evaluation runs in a child forked from it, so its start
// costs no imports, and its verdict is the one a worker started for it gives.
TEST_F(EvaluatorTest, ForkServerGivesTheSameVerdictsWithoutTheImports) {
  EvalOptions o = options();
  o.cache.enabled = false;
  o.seed = 12345;  // the same inputs on both paths
  o.tuning.fork_server = "always";
  Evaluator evaluator = make_evaluator(o);
  ASSERT_TRUE(evaluator.start_fork_servers(1).is_ok());
  double forked_startup_s = 1e9;  // the quickest of the runs after the first (which may wait for the imports)
  for (int run = 0; run < 3; ++run) {
    Verdict v = evaluate(evaluator, kRelu, kTritonRelu);
    expect_ok(v);
    ASSERT_FALSE(v.profile.stage_s.empty()) << dump(v);
    EXPECT_EQ(v.profile.stage_s.front().first, "startup");
    if (run > 0) forked_startup_s = std::min(forked_startup_s, v.profile.stage_s.front().second);
    // Where the start-up went: the wait for the server (the supervisor's clock) and for its child's
    // device (the child's), both inside the stage.
    std::map<std::string, double> parts(v.profile.startup_s.begin(), v.profile.startup_s.end());
    ASSERT_TRUE(parts.contains("server") && parts.contains("device")) << dump(v);
    EXPECT_GE(parts["server"], 0.0);
    EXPECT_GE(parts["device"], 0.0);
    EXPECT_LE(parts["server"] + parts["device"], v.profile.stage_s.front().second + 1e-3) << dump(v);
  }
  Verdict wrong = evaluate(evaluator, kRelu, kFixtures + "triton_wrong.py");
  EXPECT_EQ(wrong.status, EvalStatus::incorrect) << dump(wrong);

  o.tuning.fork_server = "never";
  Verdict fresh = evaluate(make_evaluator(o), kRelu, kFixtures + "triton_wrong.py");
  ASSERT_FALSE(fresh.profile.stage_s.empty()) << dump(fresh);
  // A worker started for one request: its own imports and device, no server.
  std::map<std::string, double> own(fresh.profile.startup_s.begin(), fresh.profile.startup_s.end());
  EXPECT_TRUE(own.contains("imports") && own.contains("device") && !own.contains("server")) << dump(fresh);
  EXPECT_LE(own["imports"] + own["device"], fresh.profile.stage_s.front().second + 1e-3) << dump(fresh);
  // Relative, not a wall-time bound: on a loaded machine both slow down, the imports more.
  EXPECT_LT(forked_startup_s, fresh.profile.stage_s.front().second) << "a forked child starts without the imports";
  EXPECT_EQ(fresh.status, wrong.status) << dump(fresh);
  EXPECT_EQ(fresh.checks, wrong.checks) << dump(fresh);
  EXPECT_EQ(fresh.max_abs_error, wrong.max_abs_error) << "same seed, same inputs, same outputs\n" << dump(fresh);
}

// The `cuda` pre-builds' compile-only requests run on fork servers of their own kind
// (KZ_WORKER_ROLE=build), which skip the audit's machinery: a pre-build never takes a server prepared
// for an evaluation, and an evaluation never lands on a build server, whichever is idle.
TEST_F(EvaluatorTest, CompileOnlyRequestsRunOnBuildServersOfTheirOwn) {
  EvalOptions o = options();
  o.cache.enabled = false;
  o.tuning.fork_server = "always";
  Evaluator evaluator = make_evaluator(o);
  ASSERT_TRUE(evaluator.start_fork_servers(1).is_ok());  // an evaluation server, idle when the pre-build comes
  const std::string probe = kFixtures + "worker_role_probe.py";
  for (int round = 0; round < 2; ++round) {  // the second round finds an idle server of each kind
    Verdict built = evaluate(evaluator, kRelu, probe, EvalMode::compile_only);
    EXPECT_EQ(built.status, EvalStatus::runtime_error) << dump(built);
    EXPECT_TRUE(contains(built.message, "worker role: build; audit machinery prepared: False")) << dump(built);
    Verdict evaluated = evaluate(evaluator, kRelu, probe);
    EXPECT_EQ(evaluated.status, EvalStatus::runtime_error) << dump(evaluated);
    EXPECT_TRUE(contains(evaluated.message, "worker role: evaluation; audit machinery prepared: True"))
        << dump(evaluated);
  }
}

// Whether some kz evaluation worker process (a fork server, its zygote or child, a worker; not a
// build server, which runs at [tuning] prebuild_niceness) runs at nice value `nice`, within `wait`:
// its command line names kz_worker, its environment no build role.
bool a_kz_evaluation_worker_runs_at(int nice, std::chrono::seconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  do {
    for (const auto& process : test::live_processes()) {
      if (process.nice != nice || !contains(process.cmdline, "kz_worker")) continue;
      std::string environment = process.read("environ");
      if (!environment.empty() && !contains(environment, "KZ_WORKER_ROLE=build")) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

// [tuning] prepare_niceness: the worker starts and prepares at that increment (an idle fork server
// shows it), and the candidate's constructor runs at the supervisor's own nice value, from a fork
// server or in a worker of its own; with [tuning] compile_niceness, at that value (its compile stage).
TEST_F(EvaluatorTest, TheCandidateRunsAtTheSupervisorsNiceValue) {
  errno = 0;
  int own = getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  if (!nice_value_allowed(std::max(own - 7, -20)) || !nice_value_allowed(-9))
    GTEST_SKIP() << "lowering a nice value needs CAP_SYS_NICE";
  for (int compile_niceness : {0, -9}) {
    for (const char* fork_server : {"always", "never"}) {
      EvalOptions o = options();
      o.cache.enabled = false;
      o.tuning.fork_server = fork_server;
      o.tuning.prepare_niceness = -7;  // not the default (-5): a server made by another test has that
      o.tuning.compile_niceness = compile_niceness;
      Evaluator evaluator = make_evaluator(o);
      if (std::string(fork_server) == "always" && compile_niceness == 0) {
        ASSERT_TRUE(evaluator.start_fork_servers(1).is_ok());
        EXPECT_TRUE(a_kz_evaluation_worker_runs_at(std::max(own - 7, -20), std::chrono::seconds(30)))
            << "the idle server and its child prepare at the increment";
      }
      Verdict v = evaluate(evaluator, kRelu, kFixtures + "worker_nice_probe.py");
      EXPECT_EQ(v.status, EvalStatus::runtime_error) << dump(v);
      // The message's last line (the traceback above it quotes the fixture's source, with "%d").
      const std::string mark = "candidate runs at nice ";
      size_t at = v.message.rfind(mark);
      ASSERT_NE(at, std::string::npos) << dump(v);
      EXPECT_EQ(v.message.substr(at, v.message.find(" (", at) - at),
                mark + std::to_string(compile_niceness == 0 ? own : compile_niceness))
          << "fork_server " << fork_server << ", compile_niceness " << compile_niceness << ": " << v.message.substr(at);
    }
  }
}

TEST_F(EvaluatorTest, TritonWrongValuesAreIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_wrong.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::output_mismatch});
  EXPECT_EQ(v.stage, "correctness");
  EXPECT_EQ(v.trials_passed, 0);
  EXPECT_TRUE(v.compiled) << dump(v);  // it ran: only the values are wrong
}

TEST_F(EvaluatorTest, TritonExceptionInForwardIsRuntimeError) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_raises.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::forward_failed});
  EXPECT_TRUE(contains(v.message, "kz-fixture: deliberate failure in forward")) << v.message;
}

// Under TRITON_INTERPRET=1 there is no Triton frontend: the unknown tl function only fails while
// the kernel is interpreted in forward, as an AttributeError wrapped in
// triton.runtime.errors.InterpreterError. The worker classifies that as compile_error (as on a GPU,
// where the frontend raises a CompilationError), not as a runtime error of forward.
TEST_F(EvaluatorTest, TritonKernelFrontendErrorIsCompileError) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_compile_error.py");
  expect_verdict(v, EvalStatus::compile_error, {Check::kernel_compile});
  EXPECT_FALSE(v.has_check(Check::forward_failed)) << dump(v);
  EXPECT_TRUE(contains(v.message, "relu_does_not_exist")) << v.message;
}

// ---- hangs and crashes: the supervisor's job ---------------------------------------------------

TEST_F(EvaluatorTest, HangingForwardTimesOutAndNextEvaluationIsOk) {
  EvalOptions o = options();
  o.timeouts.correctness_s = 5;
  Evaluator evaluator = make_evaluator(o);

  auto started = std::chrono::steady_clock::now();
  Verdict v = evaluate(evaluator, kRelu, kFixtures + "triton_hang.py");
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  expect_verdict(v, EvalStatus::timeout, {Check::stage_timeout});
  EXPECT_EQ(v.stage, "correctness") << dump(v);
  EXPECT_TRUE(contains(v.message, "correctness")) << v.message;
  EXPECT_LT(elapsed, 30.0) << "the worker must be killed at the 5 s deadline";
  EXPECT_GE(elapsed, 5.0) << "the deadline cannot pass before 5 s";
  ASSERT_FALSE(v.profile.stage_s.empty()) << dump(v);
  EXPECT_EQ(v.profile.stage_s.back().first, "correctness") << dump(v);
  EXPECT_GE(v.profile.stage_s.back().second, 5.0) << "the stage that timed out ran to its deadline\n" << dump(v);

  expect_ok(evaluate(evaluator, kRelu, kTritonRelu));
}

TEST_F(EvaluatorTest, SegfaultingWorkerIsRuntimeErrorAndNextEvaluationIsOk) {
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate(evaluator, kRelu, kFixtures + "triton_segfault.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::worker_crashed});
  EXPECT_EQ(v.stage, "correctness") << dump(v);
  EXPECT_TRUE(contains(v.message, "signal 11") || contains(v.message, "Segmentation")) << v.message;
  // The stderr it quotes held bytes that are not UTF-8: the verdict must still serialise.
  EXPECT_TRUE(contains(v.message, "garbage before the crash")) << v.message;
  EXPECT_NO_THROW((void)to_json(v).dump());

  expect_ok(evaluate(evaluator, kRelu, kTritonRelu));
}

// Processes whose command line contains `marker`, waiting up to 5 s for killed ones to go.
int live_processes_with(const std::string& marker) {
  int found = 0;
  for (int attempt = 0; attempt < 50; ++attempt) {
    found = 0;
    for (const auto& process : test::live_processes()) found += contains(process.cmdline, marker);
    if (found == 0) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return found;
}

// Nothing a candidate starts outlives its worker: the supervisor kills the whole process group,
// on a deadline and after a crash alike.
TEST_F(EvaluatorTest, ChildOfATimedOutWorkerIsKilled) {
  EvalOptions o = options();
  o.timeouts.correctness_s = 5;
  Verdict v = evaluate(kRelu, kFixtures + "triton_hang_with_child.py", o);
  expect_verdict(v, EvalStatus::timeout, {Check::stage_timeout});
  EXPECT_EQ(live_processes_with("kz-fixture-orphan-probe-hang"), 0);
}

TEST_F(EvaluatorTest, ChildOfACrashedWorkerIsKilled) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_segfault_with_child.py");
  expect_verdict(v, EvalStatus::runtime_error, {Check::worker_crashed});
  EXPECT_EQ(live_processes_with("kz-fixture-orphan-probe-segfault"), 0);
}

// ---- malformed candidates ----------------------------------------------------------------------

TEST_F(EvaluatorTest, NoModelNewIsFormatError) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_no_model_new.py");
  expect_verdict(v, EvalStatus::format_error, {Check::no_model_new});
  EXPECT_EQ(v.format, "triton");
}

TEST_F(EvaluatorTest, InvalidPythonIsCompileError) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_syntax_error.py");
  expect_verdict(v, EvalStatus::compile_error, {Check::python_syntax});
  EXPECT_TRUE(contains(v.message, "line 10")) << "the message points at the syntax error\n" << v.message;
  EXPECT_EQ(v.stage, "syntax_check") << "refused before any worker started\n" << dump(v);
  EXPECT_TRUE(v.profile.stage_s.empty()) << dump(v);
}

// The supervisor's syntax check answers as the worker would have: the same status, checks and
// message as with it off, where the worker's own compile finds the error.
TEST_F(EvaluatorTest, SyntaxCheckGivesTheWorkersVerdict) {
  EvalOptions off = options();
  off.tuning.syntax_check = false;
  Verdict by_worker = evaluate(kRelu, kFixtures + "triton_syntax_error.py", off);
  Verdict by_checker = evaluate(kRelu, kFixtures + "triton_syntax_error.py");
  EXPECT_EQ(by_worker.stage, "compile") << dump(by_worker);
  EXPECT_EQ(by_checker.stage, "syntax_check") << dump(by_checker);
  EXPECT_EQ(by_checker.status, by_worker.status);
  EXPECT_EQ(by_checker.checks, by_worker.checks);
  EXPECT_EQ(by_checker.message, by_worker.message);
  // A valid candidate passes the check and is evaluated by the worker.
  expect_ok(evaluate(kRelu, kTritonRelu));
}

TEST_F(EvaluatorTest, NoKernelFormatUnderAutoIsFormatError) {
  Verdict v = evaluate(kRelu, kFixtures + "no_kernel_format.py");
  expect_verdict(v, EvalStatus::format_error, {Check::format_unrecognised});
}

// ---- inputs must not change --------------------------------------------------------------------

TEST_F(EvaluatorTest, KernelWritingIntoItsInputIsIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_inplace_returns_input.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::input_mutated});
}

TEST_F(EvaluatorTest, CorrectOutputButMutatedInputIsIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_mutates_input.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::input_mutated});
}

// ---- output checks -----------------------------------------------------------------------------

// The reference is x * 1e-6: all zeros are within atol=1e-4 elementwise, so only the
// relative-norm rule can catch them.
TEST_F(EvaluatorTest, ZerosForNearZeroReferenceFailTheNormCheck) {
  Verdict v = evaluate(kFixtures + "ref_tiny_output.py", kFixtures + "triton_zeros.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::output_norm_mismatch});
  EXPECT_FALSE(v.has_check(Check::output_mismatch)) << "elementwise it is within atol\n" << dump(v);
}

TEST_F(EvaluatorTest, WrongShapeIsIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_wrong_shape.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::output_shape});
}

TEST_F(EvaluatorTest, WrongDtypeIsIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_wrong_dtype.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::output_dtype});
}

// Subclassing torch.Tensor is refused by the static checks before any worker starts (a subclass
// could fake values lazily); the worker's exact-type rule (output_type) stays as the second line,
// tested in worker/tests/test_correctness.py.
TEST_F(EvaluatorTest, TensorSubclassOutputIsCaught) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_tensor_subclass.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::tensor_subclass});
}

TEST_F(EvaluatorTest, NaNInOutputIsIncorrect) {
  Verdict v = evaluate(kRelu, kFixtures + "triton_nan.py");
  expect_verdict(v, EvalStatus::incorrect, {Check::output_not_finite});
}

// ---- tampering ---------------------------------------------------------------------------------

// torch.allclose / torch.equal / Tensor.__eq__ ... patched at import: refused by the static checks
// (rebinding torch attributes), and the next worker is clean. Without the static scan the identity
// snapshot catches it after the import (harness_patched; eval/tests/cheats/ has hidden variants).
TEST_F(EvaluatorTest, PatchingTorchComparisonsIsCaught) {
  Evaluator evaluator = make_evaluator(options());
  Verdict v = evaluate(evaluator, kRelu, kFixtures + "triton_patches_torch.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::harness_access});
  expect_ok(evaluate(evaluator, kRelu, kTritonRelu));
}

// The four gaps a colleague found (the candidate runs in the worker's own Python process). Each is
// now refused by the static checks; eval/tests/cheats/ holds variants that hide from the static scan
// (tensor_methods_hidden, reference_tampered, function_mode_hidden, forged_result_hidden), run by
// eval_cheats_test: the first three are caught by the worker's dynamic checks, the last one is a
// known hole (docs/evaluation.md).
TEST_F(EvaluatorTest, PatchingTensorMethodsUsedByTheHarnessIsCaught) {
  Verdict v = evaluate(kRelu, kFixtures + "cheat_patches_tensor_methods.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::harness_access});
}

TEST_F(EvaluatorTest, PatchingAnOpTheReferenceCallsIsCaught) {
  Verdict v = evaluate(kRelu, kFixtures + "cheat_patches_reference_op.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::harness_access});
}

TEST_F(EvaluatorTest, TorchFunctionModeLeftActiveIsCaught) {
  Verdict v = evaluate(kRelu, kFixtures + "cheat_torch_function_mode.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::tensor_subclass});
}

TEST_F(EvaluatorTest, ForgedResultMessageIsRejected) {
  Verdict v = evaluate(kRelu, kFixtures + "cheat_forges_result.py");
  expect_verdict(v, EvalStatus::cheat_detected, {Check::harness_access});
}

// ---- torch format (never auto-detected: asked for with format = "torch") -----------------------

TEST_F(EvaluatorTest, ReferenceAsTorchCandidateIsOk) {
  EvalOptions o = options();
  o.format = "torch";
  Verdict v = evaluate(kRelu, kRelu, o);  // no ModelNew: the worker uses its Model
  expect_ok(v);
  EXPECT_EQ(v.format, "torch");
}

TEST_F(EvaluatorTest, WrongTorchCandidateIsIncorrect) {
  EvalOptions o = options();
  o.format = "torch";
  Verdict v = evaluate(kRelu, kFixtures + "torch_wrong.py", o);
  expect_verdict(v, EvalStatus::incorrect, {Check::output_mismatch});
  EXPECT_EQ(v.format, "torch");
}

// ---- cuda-rtc: NVRTC compiles for real, nothing runs without a GPU -----------------------------

TEST_F(EvaluatorTest, CudaRtcCorrectIsCompiledNotRun) {
  Verdict v = evaluate(kRelu, "suite/examples/cuda-rtc/02_relu.py");
  EXPECT_EQ(status_name(v.status), std::string("compiled_not_run")) << dump(v);
  EXPECT_EQ(v.format, "cuda-rtc");
  EXPECT_TRUE(v.compiled) << dump(v);
  EXPECT_FALSE(v.correct) << "never claimed correct without running\n" << dump(v);
  EXPECT_TRUE(v.checks.empty()) << dump(v);
  EXPECT_TRUE(contains(v.message, "NVRTC")) << v.message;
  // The compile stage's parts: NVRTC's own seconds are inside the import and the constructor.
  std::map<std::string, double> parts(v.profile.compile_s.begin(), v.profile.compile_s.end());
  ASSERT_EQ(parts.size(), 4u) << dump(v);
  ASSERT_TRUE(parts.contains("nvrtc")) << dump(v);
  EXPECT_GT(parts["nvrtc"], 0.0) << dump(v);
  EXPECT_LE(parts["nvrtc"], parts["import"] + parts["construct"]) << dump(v);
}

TEST_F(EvaluatorTest, CudaRtcSyntaxErrorIsCompileErrorWithNvrtcLog) {
  Verdict v = evaluate(kRelu, kFixtures + "cuda_rtc_compile_error.py");
  expect_verdict(v, EvalStatus::compile_error, {Check::kernel_compile});
  EXPECT_FALSE(v.compiled) << dump(v);
  // NVRTC's seconds are kept where it failed too.
  std::map<std::string, double> parts(v.profile.compile_s.begin(), v.profile.compile_s.end());
  EXPECT_TRUE(parts.contains("nvrtc") && parts["nvrtc"] > 0.0) << dump(v);
  // NVRTC's own log: file name, line and diagnostic.
  EXPECT_TRUE(contains(v.message, "kz_fixture_bad_relu.cu")) << v.message;
  EXPECT_TRUE(contains(v.message, "error")) << v.message;
}

TEST_F(EvaluatorTest, CudaRtcWithoutModelNewIsFormatError) {
  Verdict v = evaluate(kRelu, kFixtures + "cuda_rtc_no_model_new.py");
  expect_verdict(v, EvalStatus::format_error, {Check::no_model_new});
  EXPECT_EQ(v.format, "cuda-rtc");
}

TEST_F(EvaluatorTest, CudaRtcThatCompilesNothingIsFormatError) {
  Verdict v = evaluate(kRelu, kFixtures + "cuda_rtc_no_kernel.py");
  expect_verdict(v, EvalStatus::format_error, {Check::no_kernel_compiled});
}

// ---- GPU memory: the retry alone after out_of_memory_shared -----------------------------------

// A stand-in worker (kz_worker/__main__.py, a worker started per request) that logs each request's
// gpu_alone and answers by it: infra_error / out_of_memory_shared beside other evaluations, ok once
// alone, unless the candidate's source says `always_out_of_memory`. No GPU needed: the retry is the
// supervisor's, whatever the device.
constexpr const char* kMemoryStandIn = R"(import json, os, sys
request = json.loads(sys.stdin.read())
alone = request.get("gpu_alone", False)
with open(sys.argv[0].replace("__main__.py", "requests.jsonl"), "a") as log:
    log.write(json.dumps({"gpu_alone": alone, "seed": request["seed"]}) + "\n")
def send(message):
    message["token"] = request["message_token"]
    os.write(3, (json.dumps(message) + "\n").encode())
for stage in ("load_reference", "await_memory", "load_reference"):  # as the harness waits for its slots
    send({"type": "stage", "name": stage})
if alone and "always_out_of_memory" not in request["candidate_source"]:
    send({"type": "result", "status": "ok", "compiled": True, "correct": True, "trials_passed": request["trials"],
          "memory": {"alone": True, "slots": 16, "budget_mb": 4096.0, "estimate": "meta"}})
else:
    send({"type": "result", "status": "infra_error", "checks": ["out_of_memory_shared"], "stage": "correctness",
          "message": "CUDA out of memory while other evaluations held 60000 MB on the GPU",
          "memory": {"alone": alone, "slots": 16 if alone else 2, "budget_mb": 4096.0}})
)";

class MemoryRetryTest : public EvaluatorTest {
 protected:
  void SetUp() override {
    EvaluatorTest::SetUp();
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-memory-retry-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    root_ = *dir;
    fs::create_directories(root_ / "worker" / "kz_worker");
    fs::create_directories(root_ / "worker" / "kz_rtc");  // the worker code's other package (worker_code_version)
    ASSERT_TRUE(write_file_atomic(root_ / "worker" / "kz_worker" / "__init__.py", "").is_ok());
    ASSERT_TRUE(write_file_atomic(root_ / "worker" / "kz_worker" / "__main__.py", kMemoryStandIn).is_ok());
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  // The stand-in, started per request, unsandboxed (it logs outside its scratch dir), the verdict
  // cache in the test's own folder.
  Evaluator stand_in_evaluator() const {
    EvalOptions o = options();
    o.worker.python = "python3";
    o.worker.worker_dir = root_ / "worker";
    o.worker.cache_dir = root_ / "cache";
    o.tuning.fork_server = "never";
    o.tuning.syntax_check = false;  // the stand-in has no syntax_check.py
    o.sandbox.enabled = false;
    return make_evaluator(o);
  }

  // Each request's gpu_alone, in order.
  std::vector<bool> requests_alone() const {
    std::vector<bool> alone;
    auto log = read_file(root_ / "worker" / "kz_worker" / "requests.jsonl");
    if (!log.ok()) return alone;
    std::istringstream lines(*log);
    for (std::string line; std::getline(lines, line);) alone.push_back(nlohmann::json::parse(line)["gpu_alone"].get<bool>());
    return alone;
  }

  Verdict evaluate_source(const Evaluator& evaluator, const std::string& extra) const {
    Candidate c = candidate(kTritonRelu);
    c.source += extra;
    auto verdict = evaluator.evaluate(reference(kRelu), c);
    if (!verdict.ok()) {
      ADD_FAILURE() << verdict.status().to_string();
      return make_verdict(EvalStatus::infra_error, {}, verdict.status().message());
    }
    return *verdict;
  }

  fs::path root_;
};

TEST_F(MemoryRetryTest, OutOfMemoryBesideOthersRunsOnceMoreAloneAndThatVerdictStands) {
  Evaluator evaluator = stand_in_evaluator();
  Verdict v = evaluate_source(evaluator, "");
  EXPECT_EQ(requests_alone(), (std::vector<bool>{false, true})) << "once shared, once alone";
  EXPECT_EQ(status_name(v.status), std::string("ok")) << dump(v);
  EXPECT_TRUE(v.checks.empty()) << dump(v);
  EXPECT_TRUE(v.retried_alone) << dump(v);
  EXPECT_TRUE(to_json(v)["retried_alone"].get<bool>());
  ASSERT_TRUE(v.memory) << dump(v);
  EXPECT_EQ(v.memory->alone, true) << "the second run's report";
  EXPECT_EQ(v.memory->slots, 16);
  std::vector<std::string> stages;
  for (const auto& [stage, seconds] : v.profile.stage_s) stages.push_back(stage);
  EXPECT_EQ(stages, (std::vector<std::string>{"startup", "load_reference", "await_memory"}))
      << "load_reference once, its two parts summed around the wait\n" << dump(v);
  EXPECT_EQ(verdict_from_json(to_json(v))->profile.stage_s, v.profile.stage_s) << "the same through JSON";

  // The retried verdict is cached as any other: the next evaluation runs no worker, and says nothing
  // of a retry of its own.
  Verdict again = evaluate_source(evaluator, "");
  EXPECT_TRUE(again.cached) << dump(again);
  EXPECT_FALSE(again.retried_alone) << dump(again);
  EXPECT_EQ(requests_alone().size(), 2u) << "a cache hit";
}

TEST_F(MemoryRetryTest, ASecondOutOfMemoryStandsWithoutAThirdRunAndIsNeverCached) {
  Evaluator evaluator = stand_in_evaluator();
  Verdict v = evaluate_source(evaluator, "\n# always_out_of_memory\n");
  EXPECT_EQ(requests_alone(), (std::vector<bool>{false, true})) << "no third run";
  expect_verdict(v, EvalStatus::infra_error, {Check::out_of_memory_shared});
  EXPECT_TRUE(v.retried_alone) << dump(v);
  EXPECT_TRUE(contains(v.message, "CUDA out of memory")) << v.message;

  Verdict again = evaluate_source(evaluator, "\n# always_out_of_memory\n");
  EXPECT_FALSE(again.cached) << "out_of_memory_shared is never stored\n" << dump(again);
  EXPECT_EQ(requests_alone(), (std::vector<bool>{false, true, false, true}));
}

#else  // KZ_CUDA_COMPILE_TESTS: eval_cuda_compile_test, slow (nvcc through load_inline)

// A fresh compile cache, so load_inline really runs nvcc instead of loading an earlier build.
class FreshCacheEvaluatorTest : public EvaluatorTest {
 protected:
  void SetUp() override {
    EvaluatorTest::SetUp();
    if (!have_nvcc()) GTEST_SKIP() << "nvcc not found";
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-test-cache-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    cache_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!cache_.empty()) fs::remove_all(cache_, ignored);
  }
  EvalOptions fresh_cache_options() const {
    EvalOptions o = options();
    o.worker.cache_dir = cache_;
    return o;
  }
  fs::path cache_;
};

TEST_F(FreshCacheEvaluatorTest, CudaSyntaxErrorIsCompileError) {
  Verdict v = evaluate(kRelu, kFixtures + "cuda_compile_error.py", fresh_cache_options());
  expect_verdict(v, EvalStatus::compile_error, {Check::kernel_compile});
  EXPECT_EQ(v.format, "cuda");
  EXPECT_FALSE(v.compiled) << dump(v);
  // torch's "Error building extension" and nvcc's own diagnostic for the missing semicolon.
  EXPECT_TRUE(contains(v.message, "Error building extension")) << v.message;
  EXPECT_TRUE(contains(v.message, "error: expected a \";\"")) << v.message;
}

TEST_F(FreshCacheEvaluatorTest, CudaCorrectIsCompiledNotRun) {
  Verdict v = evaluate(kRelu, "suite/examples/cuda/02_relu.py", fresh_cache_options());
  EXPECT_EQ(status_name(v.status), std::string("compiled_not_run")) << dump(v);
  EXPECT_EQ(v.format, "cuda");
  EXPECT_TRUE(v.compiled) << dump(v);
  EXPECT_FALSE(v.correct) << dump(v);
  EXPECT_TRUE(v.checks.empty()) << dump(v);
  EXPECT_TRUE(contains(v.message, "nvcc")) << v.message;
}

#endif

}  // namespace
}  // namespace kz
