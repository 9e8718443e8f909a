// The verdict cache: SQLite round trips, what the key covers, concurrent writers (threads and
// processes), corrupt files, and hits through the real Evaluator (which then starts no worker).
//
// Needs KZ_SOURCE_DIR (CTest sets it) for the worker and the suite.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kz/core/files.h"
#include "kz/eval/cache.h"
#include "kz/eval/evaluator.h"
#include "kz/task/task.h"
#include "test_support.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

using test::source_dir;

// A fresh folder per test, removed afterwards.
class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-cache-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path db() const { return dir_ / "verdicts.sqlite"; }

  static VerdictCache open(const fs::path& path) {
    auto cache = VerdictCache::open(path);
    if (!cache.ok()) throw std::runtime_error(cache.status().to_string());
    return std::move(cache).value();
  }

  fs::path dir_;
};

Verdict sample_verdict(const std::string& task_id = "02_relu") {
  Verdict v = make_verdict(EvalStatus::incorrect, {Check::output_mismatch}, "max |out - ref| = 1.5");
  v.task_id = task_id;
  v.candidate = "cand.py";
  v.format = "triton";
  v.device = "cuda:0";
  v.compiled = true;
  v.stage = "correctness";
  v.trials = 5;
  v.trials_passed = 2;
  v.max_abs_error = 1.5;
  v.seed = 1234;
  v.speedup = 1.25;
  v.candidate_timing = TimingStats{0.8, 0.81, 0.01, 0.79, 0.9, 0.795, 0.85, 100};
  v.reference_timing = TimingStats{1.0, 1.01, 0.02, 0.98, 1.1, 0.99, 1.05, 100};
  return v;
}

// ---- storage -----------------------------------------------------------------------------------

TEST_F(CacheTest, RoundTripKeepsTheWholeVerdict) {
  VerdictCache cache = open(db());
  Verdict v = sample_verdict();
  ASSERT_TRUE(cache.store("key-1", v).is_ok());
  auto hit = cache.lookup("key-1");
  ASSERT_TRUE(hit.ok()) << hit.status().to_string();
  ASSERT_TRUE(hit->has_value());
  const Verdict& back = **hit;
  EXPECT_TRUE(back.cached);
  Verdict expected = v;
  expected.cached = true;
  EXPECT_EQ(to_json(back), to_json(expected));
  EXPECT_EQ(*cache.size(), 1);
  EXPECT_FALSE(cache.rebuilt());
}

TEST_F(CacheTest, AReplayCarriesNoCpuSeconds) {
  VerdictCache cache = open(db());
  Verdict v = sample_verdict();
  v.profile.cpu_s = {{"worker", 2.5}, {"subprocesses", 7.25}};
  v.profile.prebuild_cpu_s = 9.75;
  ASSERT_TRUE(cache.store("key-1", v).is_ok());
  auto hit = cache.lookup("key-1");
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_TRUE((*hit)->profile.cpu_s.empty()) << "a lookup, not the stored run's CPU";
  EXPECT_FALSE((*hit)->profile.prebuild_cpu_s);
}

// The stored run's memory report stays (diagnostics, as its stage seconds); its retry does not: a
// replay ran no worker at all.
TEST_F(CacheTest, AReplayKeepsTheMemoryReportNotTheRetry) {
  VerdictCache cache = open(db());
  Verdict v = sample_verdict();
  v.memory = MemoryReport{};
  v.memory->budget_mb = 2048;
  v.retried_alone = true;
  ASSERT_TRUE(cache.store("key-1", v).is_ok());
  auto hit = cache.lookup("key-1");
  ASSERT_TRUE(hit.ok() && hit->has_value());
  ASSERT_TRUE((*hit)->memory);
  EXPECT_EQ((*hit)->memory->budget_mb, 2048);
  EXPECT_FALSE((*hit)->retried_alone);
}

TEST_F(CacheTest, UnknownKeyIsAMiss) {
  VerdictCache cache = open(db());
  ASSERT_TRUE(cache.store("key-1", sample_verdict()).is_ok());
  auto miss = cache.lookup("key-2");
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->has_value());
}

TEST_F(CacheTest, StoringAgainReplaces) {
  VerdictCache cache = open(db());
  ASSERT_TRUE(cache.store("k", sample_verdict("first")).is_ok());
  ASSERT_TRUE(cache.store("k", sample_verdict("second")).is_ok());
  EXPECT_EQ(*cache.size(), 1);
  EXPECT_EQ((*cache.lookup("k"))->task_id, "second");
}

TEST_F(CacheTest, SurvivesReopeningAndUsesWal) {
  {
    VerdictCache cache = open(db());
    ASSERT_TRUE(cache.store("k", sample_verdict()).is_ok());
  }
  VerdictCache again = open(db());
  EXPECT_TRUE((*again.lookup("k")).has_value());
  // WAL: the journal file sits next to the database while a connection is open.
  EXPECT_TRUE(fs::exists(db().string() + "-wal"));
}

TEST_F(CacheTest, CreatesMissingFolders) {
  VerdictCache cache = open(dir_ / "a" / "b" / "verdicts.sqlite");
  EXPECT_TRUE(cache.store("k", sample_verdict()).is_ok());
}

TEST_F(CacheTest, UnwritableLocationIsAClearError) {
  auto cache = VerdictCache::open("/proc/kz-no-such-dir/verdicts.sqlite");
  ASSERT_FALSE(cache.ok());
  EXPECT_NE(cache.status().message().find("/proc/kz-no-such-dir"), std::string::npos) << cache.status().message();
}

// ---- corrupt files: moved aside, rebuilt ---------------------------------------------------------

TEST_F(CacheTest, FileThatIsNotADatabaseIsMovedAsideAndRebuilt) {
  ASSERT_TRUE(write_file_atomic(db(), std::string(8192, 'x')).is_ok());
  VerdictCache cache = open(db());
  EXPECT_TRUE(cache.rebuilt());
  EXPECT_TRUE(fs::exists(db().string() + ".corrupt"));
  ASSERT_TRUE(cache.store("k", sample_verdict()).is_ok());
  EXPECT_TRUE((*cache.lookup("k")).has_value());
}

TEST_F(CacheTest, CorruptSchemaPageIsMovedAsideAndRebuilt) {
  {
    VerdictCache cache = open(db());
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(cache.store("k" + std::to_string(i), sample_verdict()).is_ok());
  }
  // Keep the 100-byte SQLite header, garble the rest of page 1 (the schema table).
  std::fstream file(db(), std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(100);
  std::string garbage(3000, '\xA5');
  file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  file.close();
  VerdictCache cache = open(db());
  EXPECT_TRUE(cache.rebuilt());
  EXPECT_EQ(*cache.size(), 0);
  EXPECT_TRUE(cache.store("k", sample_verdict()).is_ok());
}

// ---- concurrency -------------------------------------------------------------------------------

TEST_F(CacheTest, ConcurrentWritersFromThreads) {
  constexpr int kThreads = 8, kPerThread = 50;
  VerdictCache shared = open(db());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one connection, half open their own (as separate processes would).
      std::optional<VerdictCache> own;
      if (t % 2) own.emplace(open(db()));
      VerdictCache& cache = own ? *own : shared;
      for (int i = 0; i < kPerThread; ++i) {
        std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (!cache.store(key, sample_verdict(key)).is_ok()) ++failures;
        auto hit = cache.lookup(key);
        if (!hit.ok() || !hit->has_value() || (*hit)->task_id != key) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*shared.size(), kThreads * kPerThread);
}

TEST_F(CacheTest, ConcurrentWritersFromProcesses) {
  constexpr int kProcesses = 4, kPerProcess = 100;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      auto cache = VerdictCache::open(db());
      if (!cache.ok()) _exit(100);
      for (int i = 0; i < kPerProcess; ++i)
        if (!cache->store("p" + std::to_string(p) + "-" + std::to_string(i), sample_verdict()).is_ok()) ++failures;
      _exit(failures);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child wrote with failures: " << status;
  }
  EXPECT_EQ(*open(db()).size(), kProcesses * kPerProcess);
}

// ---- the key -----------------------------------------------------------------------------------

std::string key_of(const EvalOptions& o, const std::string& ref = "ref", const std::string& cand = "cand",
                   Format format = Format::triton, const std::string& gpu = "", const std::string& code = "c1") {
  return verdict_cache_key(o, {ref, cand, format, gpu, code});
}

TEST(CacheKey, SameInputsSameKey) {
  EXPECT_EQ(key_of(EvalOptions{}), key_of(EvalOptions{}));
  EXPECT_EQ(key_of(EvalOptions{}).size(), 32u);
}

TEST(CacheKey, EveryVerdictInputChangesTheKey) {
  const std::string base = key_of(EvalOptions{});
  EXPECT_NE(base, key_of(EvalOptions{}, "ref2"));
  EXPECT_NE(base, key_of(EvalOptions{}, "ref", "cand2"));
  EXPECT_NE(base, key_of(EvalOptions{}, "ref", "cand", Format::cuda_rtc));
  EXPECT_NE(base, key_of(EvalOptions{}, "ref", "cand", Format::triton, "NVIDIA H200"));
  EXPECT_NE(base, key_of(EvalOptions{}, "ref", "cand", Format::triton, "", "c2"));
  std::vector<std::function<void(EvalOptions&)>> changes = {
      [](EvalOptions& o) { o.device = "cuda:0"; },
      [](EvalOptions& o) { o.trials = 6; },
      [](EvalOptions& o) { o.seed = 42; },
      [](EvalOptions& o) { o.use_cpu_sizes = false; },
      [](EvalOptions& o) { o.size_overrides["N"] = 8; },
      [](EvalOptions& o) { o.tolerance.atol_fp32 = 2e-4; },
      [](EvalOptions& o) { o.tolerance.norm_tol_half = 0.5; },
      [](EvalOptions& o) { o.timing.enabled = false; },
      [](EvalOptions& o) { o.timing.runs = 50; },
      [](EvalOptions& o) { o.timing.warmup_runs = 1; },
      [](EvalOptions& o) { o.timing.input_sets = 2; },
      [](EvalOptions& o) { o.timing.l2_flush_mb = 128; },
      [](EvalOptions& o) { o.timing.launch_spin_us = 50; },
      [](EvalOptions& o) { o.sandbox.enabled = false; },
      [](EvalOptions& o) { o.sandbox.memory_mb = 1024; },
      [](EvalOptions& o) { o.sandbox.network = true; },
      [](EvalOptions& o) { o.sandbox.syscall_filter = false; },
      [](EvalOptions& o) { o.kernel_share = "all"; },
      [](EvalOptions& o) { o.worker.cuda_connections = 0; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    EvalOptions o;
    changes[i](o);
    EXPECT_NE(base, key_of(o)) << "change #" << i << " did not change the key: " << protocol_fingerprint(o);
  }
}

TEST(CacheKey, SettingsThatCannotChangeAVerdictKeepTheKey) {
  EvalOptions o;
  o.timeouts.correctness_s = 7;  // a timeout is never stored
  o.tuning.jobs = 3;
  o.format = "triton";           // the resolved format is a part of its own
  o.worker.keep_scratch = true;
  o.cache.path = "/elsewhere.sqlite";
  EXPECT_EQ(key_of(EvalOptions{}), key_of(o));
}

TEST(CacheKey, WorkerCodeVersionFollowsThePythonFiles) {
  auto dir = make_unique_dir(fs::temp_directory_path(), "kz-worker-version-");
  ASSERT_TRUE(dir.ok());
  fs::create_directories(*dir / "kz_worker");
  fs::create_directories(*dir / "kz_rtc");
  ASSERT_TRUE(write_file_atomic(*dir / "kz_worker" / "harness.py", "x = 1\n").is_ok());
  ASSERT_TRUE(write_file_atomic(*dir / "kz_rtc" / "_nvrtc.py", "y = 1\n").is_ok());
  auto v1 = worker_code_version(*dir);
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(write_file_atomic(*dir / "kz_worker" / "notes.txt", "not code").is_ok());
  EXPECT_EQ(*worker_code_version(*dir), *v1) << "only .py files count";
  ASSERT_TRUE(write_file_atomic(*dir / "kz_rtc" / "_nvrtc.py", "y = 2\n").is_ok());
  auto v2 = worker_code_version(*dir);
  EXPECT_NE(*v2, *v1);
  fs::create_directories(*dir / "kz_worker" / "compile");
  ASSERT_TRUE(write_file_atomic(*dir / "kz_worker" / "compile" / "formats.py", "z = 1\n").is_ok());
  EXPECT_NE(*worker_code_version(*dir), *v2) << "a subpackage's files count";
  fs::remove_all(*dir);
}

TEST(CacheKey, SupervisorVersionIsThisExecutablesHash) {
  EXPECT_EQ(supervisor_version().size(), 32u) << supervisor_version();
  EXPECT_EQ(&supervisor_version(), &supervisor_version()) << "computed once per process";
}

TEST(CacheKey, OnlyRepeatableVerdictsAreCacheable) {
  EXPECT_TRUE(is_cacheable(make_verdict(EvalStatus::ok, {}, "")));
  EXPECT_TRUE(is_cacheable(make_verdict(EvalStatus::incorrect, {Check::output_mismatch}, "")));
  EXPECT_TRUE(is_cacheable(make_verdict(EvalStatus::compile_error, {Check::kernel_compile}, "")));
  EXPECT_TRUE(is_cacheable(make_verdict(EvalStatus::compiled_not_run, {}, "")));
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::infra_error, {Check::reference_failed}, "")));
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::timeout, {Check::stage_timeout}, "")));
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::runtime_error, {Check::worker_crashed}, "")));
  // Memory other evaluations held on the GPU says nothing of the candidate, whatever the status.
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::infra_error, {Check::out_of_memory_shared}, "")));
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::runtime_error, {Check::out_of_memory_shared}, "")));
  EXPECT_FALSE(is_cacheable(make_verdict(EvalStatus::infra_error, {Check::exceeds_gpu_memory}, "")));
  EXPECT_TRUE(is_cacheable(make_verdict(EvalStatus::runtime_error, {Check::memory_limit}, "")))
      << "the candidate's own out-of-memory, the GPU to itself";
}

// ---- through the Evaluator (real worker on the CPU) --------------------------------------------

class CachedEvaluatorTest : public CacheTest {
 protected:
  void SetUp() override {
    CacheTest::SetUp();
    if (source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  }
  EvalOptions options(int trials = 2) const {
    EvalOptions o;
    o.trials = trials;
    o.cache.path = db();
    return o;
  }
  static Evaluator evaluator(const EvalOptions& o) {
    auto e = Evaluator::create(o);
    if (!e.ok()) throw std::runtime_error(e.status().to_string());
    return std::move(e).value();
  }
  static Task relu() { return *load_task_file(source_dir() / "suite/kzbench/level1/02_relu.py"); }
  static Candidate candidate(const std::string& relative) {
    return Candidate{relative, *read_file(source_dir() / relative)};
  }
  // One evaluation, and how long it took.
  static std::pair<Verdict, double> timed(const Evaluator& e, const Candidate& c, EvalMode mode = EvalMode::full) {
    auto started = std::chrono::steady_clock::now();
    auto verdict = e.evaluate(relu(), c, mode);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!verdict.ok()) throw std::runtime_error(verdict.status().to_string());
    return {*verdict, seconds};
  }
};

// The measurement the cache exists for: the second evaluation of the same Triton candidate is
// answered from the cache (no worker, no Python start): ~0.01-0.1 s idle.
TEST_F(CachedEvaluatorTest, SecondEvaluationIsAFastHit) {
  Evaluator e = evaluator(options());
  Candidate c = candidate("suite/examples/triton/02_relu.py");
  auto [first, first_s] = timed(e, c);
  ASSERT_EQ(first.status, EvalStatus::ok) << to_json(first).dump(2);
  EXPECT_FALSE(first.cached);
  auto [second, second_s] = timed(e, c);
  EXPECT_TRUE(second.cached);
  // A lookup, ~0.01-0.1 s idle: a loose bound with room for a loaded machine (a fresh worker's start,
  // Python and torch, takes seconds; the cached flag above is the check that it was a hit).
  EXPECT_LT(second_s, 2.0) << "first evaluation took " << first_s << " s";
  EXPECT_EQ(second.status, EvalStatus::ok);
  EXPECT_EQ(second.seed, first.seed) << "a hit replays the stored verdict, seed included";
  EXPECT_EQ(second.task_id, "02_relu");
  std::cout << "[ measured ] first evaluation " << first_s << " s, cached " << second_s << " s\n";

  // Another Evaluator on the same file (another process, in effect) hits too, with a new label.
  Candidate relabelled{"elsewhere/relu.py", c.source};
  auto [third, third_s] = timed(evaluator(options()), relabelled);
  EXPECT_TRUE(third.cached);
  EXPECT_EQ(third.candidate, "elsewhere/relu.py");
}

TEST_F(CachedEvaluatorTest, DifferentOptionIsAMiss) {
  Candidate c = candidate("suite/examples/triton/02_relu.py");
  ASSERT_FALSE(timed(evaluator(options(2)), c).first.cached);
  auto [other, seconds] = timed(evaluator(options(3)), c);
  EXPECT_FALSE(other.cached) << "trials 3 is another protocol than trials 2";
  EXPECT_EQ(other.trials, 3);
  EXPECT_TRUE(timed(evaluator(options(3)), c).first.cached);
}

TEST_F(CachedEvaluatorTest, NoCacheOptionNeitherReadsNorWrites) {
  EvalOptions o = options();
  o.cache.enabled = false;
  Evaluator e = evaluator(o);
  EXPECT_EQ(e.cache(), nullptr);
  Candidate c = candidate("suite/examples/triton/02_relu.py");
  EXPECT_FALSE(timed(e, c).first.cached);
  EXPECT_FALSE(timed(e, c).first.cached);
  EXPECT_FALSE(fs::exists(db()));
}

TEST_F(CachedEvaluatorTest, CompileOnlyAndTimeoutVerdictsAreNotStored) {
  EvalOptions o = options();
  o.timeouts.correctness_s = 3;
  Evaluator e = evaluator(o);
  auto [prebuild, s1] = timed(e, candidate("suite/examples/triton/02_relu.py"), EvalMode::compile_only);
  EXPECT_FALSE(prebuild.cached);
  EXPECT_EQ(*e.cache()->size(), 0) << "compile-only verdicts are never stored";
  auto [hang, s2] = timed(e, candidate("eval/tests/fixtures/triton_hang.py"));
  ASSERT_EQ(hang.status, EvalStatus::timeout) << to_json(hang).dump(2);
  EXPECT_EQ(*e.cache()->size(), 0) << "a timeout is transient, never stored";
}

TEST_F(CachedEvaluatorTest, UnopenableCacheFailsCreateWithAHint) {
  EvalOptions o = options();
  o.cache.path = "/proc/kz-no-such-dir/verdicts.sqlite";
  auto e = Evaluator::create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--no-cache"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace kz
