// Suite summaries (pass rate, compile rate, geometric-mean speedup, fast_1) and discovery.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "kz/core/files.h"
#include "kz/eval/suite.h"

namespace kz {
namespace {

Verdict timed(const std::string& task, double speedup) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "");
  v.task_id = task;
  v.compiled = v.correct = true;
  v.speedup = speedup;
  return v;
}

TEST(SuiteSummary, CountsRatesAndGeomean) {
  Verdict wrong = make_verdict(EvalStatus::incorrect, {Check::output_mismatch}, "");
  wrong.task_id = "c";
  wrong.compiled = true;
  Verdict broken = make_verdict(EvalStatus::compile_error, {Check::kernel_compile}, "");
  broken.task_id = "d";
  auto s = summarize({timed("a", 2.0), timed("b", 0.5), wrong, broken}, 5);
  EXPECT_EQ(s.candidates, 4);
  EXPECT_EQ(s.tasks, 5);
  EXPECT_EQ(s.tasks_with_candidates, 4);
  EXPECT_DOUBLE_EQ(s.pass_rate(), 0.5);
  EXPECT_DOUBLE_EQ(s.compile_rate(), 0.75);
  EXPECT_NEAR(s.geomean_speedup, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.fast_1(), 0.25);
  auto json = summary_json(s);
  EXPECT_EQ(json["status_counts"]["ok"], 2);
  EXPECT_EQ(json["status_counts"]["compile_error"], 1);
  EXPECT_NE(render_summary(s).find("50.0%"), std::string::npos);
}

TEST(SuiteSummary, VerdictsWithACheckThatCouldNotRunAreCountedAndMarked) {
  Verdict v = timed("a", 1.5);
  v.format = "cuda";
  v.unchecked = {{Check::no_custom_kernel, "the profiler listed no kernel"}};
  auto s = summarize({v, timed("b", 2.0)}, 2);
  EXPECT_EQ(s.unchecked, 1);
  EXPECT_EQ(summary_json(s)["unchecked"], 1);
  EXPECT_NE(render_summary(s).find("1 verdict(s) with a check that could not run"), std::string::npos);
  EXPECT_NE(render_verdict_table({v}).find("unchecked:no_custom_kernel"), std::string::npos);
  EXPECT_EQ(render_summary(summarize({timed("b", 2.0)}, 1)).find("could not run"), std::string::npos);
}

// A task the card cannot hold is counted apart: out of the rates, said in the summary; a retry
// alone is counted too.
TEST(SuiteSummary, TasksTooBigForTheGpuAreCountedApartAndRetriesCounted) {
  Verdict too_big = make_verdict(EvalStatus::infra_error, {Check::exceeds_gpu_memory},
                                 "the task needs 90000 MB; the card gives one evaluation 72000 MB");
  too_big.task_id = "big";
  Verdict wrong = make_verdict(EvalStatus::incorrect, {Check::output_mismatch}, "");
  wrong.task_id = "c";
  wrong.compiled = true;
  Verdict retried = timed("b", 2.0);
  retried.retried_alone = true;
  auto s = summarize({timed("a", 1.5), retried, wrong, too_big}, 4);
  EXPECT_EQ(s.candidates, 4);
  EXPECT_EQ(s.exceeds_gpu_memory, 1);
  EXPECT_EQ(s.retried_alone, 1);
  EXPECT_DOUBLE_EQ(s.pass_rate(), 2.0 / 3) << "over the candidates that could run";
  EXPECT_DOUBLE_EQ(s.compile_rate(), 1.0);
  EXPECT_DOUBLE_EQ(s.fast_1(), 2.0 / 3);
  auto json = summary_json(s);
  EXPECT_EQ(json["exceeds_gpu_memory"], 1);
  EXPECT_EQ(json["retried_alone"], 1);
  EXPECT_EQ(json["status_counts"]["infra_error"], 1) << "still an infra_error among the statuses";
  std::string text = render_summary(s);
  EXPECT_NE(text.find("1 candidate(s) of tasks that need more GPU memory than the card has: not counted as failures"),
            std::string::npos) << text;
  EXPECT_NE(text.find("run again alone"), std::string::npos) << text;

  auto plain = summarize({timed("a", 1.5), wrong}, 2);
  EXPECT_EQ(plain.exceeds_gpu_memory, 0);
  EXPECT_EQ(summary_json(plain)["exceeds_gpu_memory"], 0);
  EXPECT_EQ(render_summary(plain).find("GPU memory"), std::string::npos) << "no line where none";
  EXPECT_EQ(render_summary(plain).find("alone"), std::string::npos);
}

TEST(SuiteSummary, UntimedRunsHaveNoSpeedup) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "");
  v.correct = v.compiled = true;
  auto s = summarize({v}, 1);
  EXPECT_EQ(s.timed, 0);
  EXPECT_TRUE(summary_json(s)["geomean_speedup"].is_null());
  // The summary row's last cells: the geomean speedup, then fast_1.
  auto summary_row = [](const std::string& table) {
    size_t at = table.find("(not timed)");
    return at == std::string::npos ? std::string() : table.substr(at, table.find('\n', at) - at);
  };
  EXPECT_EQ(summary_row(render_summary(s)), "(not timed)  n/a") << "correct but untimed: fast_1 unknown";
  Verdict wrong = make_verdict(EvalStatus::incorrect, {Check::output_mismatch}, "");
  std::string row = summary_row(render_summary(summarize({wrong}, 1)));
  EXPECT_TRUE(row.size() > 4 && row.substr(row.size() - 4) == "0.0%") << "nothing correct: fast_1 is 0: " << row;
}

TEST(SuiteDiscovery, PairsFilesAndFoldersWithTasks) {
  auto dir = *make_unique_dir(std::filesystem::temp_directory_path(), "kz-suite-test-");
  std::vector<Task> tasks = {{"a", "", "", 1, {}}, {"b", "", "", 1, {}}};
  ASSERT_TRUE(write_file_atomic(dir / "a.py", "A").is_ok());
  std::filesystem::create_directories(dir / "b");
  ASSERT_TRUE(write_file_atomic(dir / "b" / "s1.py", "B1").is_ok());
  ASSERT_TRUE(write_file_atomic(dir / "b" / "s0.py", "B0").is_ok());
  ASSERT_TRUE(write_file_atomic(dir / "README.md", "ignored").is_ok());
  auto entries = discover_candidates(tasks, dir);
  ASSERT_TRUE(entries.ok()) << entries.status().to_string();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].candidate.source, "A");
  EXPECT_EQ((*entries)[1].candidate.source, "B0");
  EXPECT_EQ((*entries)[2].task_index, 1u);
  ASSERT_TRUE(write_file_atomic(dir / "typo.py", "X").is_ok());
  auto bad = discover_candidates(tasks, dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("typo.py"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(SuiteDevices, ParsesListsAndRefusesBadOnes) {
  auto two = parse_devices("cuda:0,cuda:1");
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(*two, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_FALSE(parse_devices("cuda:0,,cuda:1").ok());
  EXPECT_FALSE(parse_devices("cuda:0,cuda:0").ok());
  EXPECT_FALSE(parse_devices("").ok());
}

TEST(SuiteDevices, GpuJobsFollowTheTimingLock) {
  EvalOptions o;
  o.device = "cuda:0";
  EXPECT_GE(default_jobs(o), 1);
  EXPECT_LE(default_jobs(o), o.tuning.gpu_jobs);
  o.tuning.exclusive_timing = false;  // no lock: timings could overlap, so one at a time
  EXPECT_EQ(default_jobs(o), 1);
  o.tuning.jobs = 3;
  EXPECT_EQ(default_jobs(o), 3);
}

// Every worker that may hold a CUDA context on the GPU: the evaluations at once and the spare fork
// servers; on the CPU, none spare.
TEST(SuiteDevices, GpuMemoryProcessesCountTheJobsAndTheSpareServers) {
  EvalOptions o;
  EXPECT_EQ(o.worker.gpu_memory_processes, 1) << "a single kz eval";
  o.device = "cuda:0";
  o.tuning.spare_servers = 2;
  set_gpu_memory_processes(o, 8);
  EXPECT_EQ(o.worker.gpu_memory_processes, 10);
  o.device = "cpu";
  set_gpu_memory_processes(o, 4);
  EXPECT_EQ(o.worker.gpu_memory_processes, 4);
  o.worker.gpu_memory_processes = 0;
  EXPECT_FALSE(o.validate().is_ok()) << "at least the evaluation's own worker";
}

// Each evaluation leases the device with the fewest in flight; a lease's end frees its place. (Two
// pools on the CPU stand in for two GPUs: the choice does not look at the device.)
TEST(SuiteDevices, LeasesGoToTheLeastBusyDevice) {
  EvalOptions o;
  o.cache.enabled = false;
  auto base = Evaluator::create(o);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  auto pools = DevicePools::create(*base, {"cpu", "cpu"});
  ASSERT_TRUE(pools.ok()) << pools.status().to_string();
  ASSERT_EQ(pools->size(), 2u);
  std::optional<DevicePools::Lease> first(std::in_place, *pools);
  DevicePools::Lease second(*pools);
  EXPECT_NE(first->pool(), second.pool()) << "the idle device first";
  size_t freed = first->pool();
  first.reset();
  DevicePools::Lease third(*pools);
  EXPECT_EQ(third.pool(), freed) << "the device whose evaluation ended";
  DevicePools::Lease fourth(*pools);
  EXPECT_EQ(fourth.pool(), 0u) << "a tie goes to the first device";
}

}  // namespace
}  // namespace kz
