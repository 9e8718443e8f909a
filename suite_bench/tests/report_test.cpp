// bench summaries and the HTML report from hand-made verdicts.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "kz/suite_bench/report.h"

namespace kz {
namespace {

Verdict sample(const std::string& task, int index, EvalStatus status, std::optional<double> speedup = {}) {
  Verdict v = make_verdict(status, {}, "");
  v.task_id = task;
  v.candidate = task + "/" + std::to_string(index);
  v.correct = status == EvalStatus::ok;
  v.compiled = status != EvalStatus::compile_error && status != EvalStatus::format_error;
  v.speedup = speedup;
  return v;
}

class ReportTest : public ::testing::Test {
 protected:
  std::vector<Task> tasks = {{"a", "", "", 1, {}}, {"b", "", "", 2, {}}};
  std::vector<Verdict> verdicts = {
      sample("a", 0, EvalStatus::ok, 2.0), sample("a", 1, EvalStatus::incorrect),
      sample("b", 0, EvalStatus::compile_error), sample("b", 1, EvalStatus::ok, 0.5)};
  RunInfo info{"openai:http://x/v1:m", "suite", "triton", "cuda:0", "2026-11-29", 2};
};

TEST_F(ReportTest, SummaryHasPassAtKAndFastPKeyedAndPerLevel) {
  auto s = bench_summary(info, tasks, verdicts);
  EXPECT_DOUBLE_EQ(s["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["pass_at_k"]["2"].get<double>(), 1.0);
  EXPECT_TRUE(s["fast_p"].contains("1"));
  EXPECT_TRUE(s["fast_p"].contains("0.5"));
  // fast_1 at k=1: task a has 1 of 2 samples correct and faster; task b none -> (0.5 + 0) / 2.
  EXPECT_DOUBLE_EQ(s["fast_p"]["1"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(s["levels"]["1"]["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["levels"]["2"]["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_NEAR(s["overall"]["geomean_speedup"].get<double>(), 1.0, 1e-12);
}

// A sample whose task the card cannot hold never ran: out of pass@k and fast_p (a task with only
// such samples in no denominator), counted apart; other infra_errors stay failures.
TEST_F(ReportTest, SamplesTooBigForTheGpuAreLeftOutOfTheMetricsAndCounted) {
  std::vector<Task> three = {{"a", "", "", 1, {}}, {"b", "", "", 2, {}}, {"big", "", "", 1, {}}};
  std::vector<Verdict> with_big = verdicts;
  for (int i : {0, 1}) {
    Verdict v = sample("big", i, EvalStatus::infra_error);
    v.checks = {Check::exceeds_gpu_memory};
    with_big.push_back(v);
  }
  auto s = bench_summary(info, three, with_big);
  auto without = bench_summary(info, tasks, verdicts);
  EXPECT_EQ(s["exceeds_gpu_memory"], 2);
  EXPECT_EQ(without["exceeds_gpu_memory"], 0);
  EXPECT_EQ(s["pass_at_k"], without["pass_at_k"]);
  EXPECT_EQ(s["fast_p"], without["fast_p"]);
  EXPECT_EQ(s["levels"]["1"]["pass_at_k"], without["levels"]["1"]["pass_at_k"]);
  EXPECT_EQ(s["overall"]["samples"], 4);
  EXPECT_EQ(s["overall"]["tasks"], 2);
  EXPECT_EQ(s["evaluated_samples"], 6) << "the existing keys keep their meaning";
  EXPECT_NE(render_bench_table(s).find("2 sample(s) of tasks that need more GPU memory"), std::string::npos);
  EXPECT_EQ(render_bench_table(without).find("GPU memory"), std::string::npos);

  Verdict other = sample("big", 0, EvalStatus::infra_error);  // any other infra_error: a failure, as before
  other.checks = {Check::reference_failed};
  auto failed = bench_summary(info, three, {verdicts[0], verdicts[1], verdicts[2], verdicts[3], other});
  EXPECT_EQ(failed["exceeds_gpu_memory"], 0);
  EXPECT_EQ(failed["overall"]["tasks"], 3);
  EXPECT_DOUBLE_EQ(failed["pass_at_k"]["1"].get<double>(), 1.0 / 3);
}

// [timing] baseline = "compile": today's keys stay the speedups over eager PyTorch; vs_compile holds
// the same metrics over torch.compile of the reference.
TEST_F(ReportTest, SpeedupsOverTorchCompileAreSummarisedApart) {
  EXPECT_FALSE(bench_summary(info, tasks, verdicts).contains("vs_compile")) << "absent without a compile baseline";
  std::vector<Verdict> timed = verdicts;
  timed[0].compile_speedup = 0.8;  // 2x over eager, slower than the compiled reference
  timed[3].compile_speedup = 1.5;
  auto s = bench_summary(info, tasks, timed);
  EXPECT_DOUBLE_EQ(s["fast_p"]["1"].get<double>(), 0.25) << "over eager, as before";
  EXPECT_DOUBLE_EQ(s["vs_compile"]["overall"]["fast_p"]["1"].get<double>(), 0.25);  // task b's sample only
  EXPECT_NEAR(s["vs_compile"]["overall"]["geomean_speedup"].get<double>(), std::sqrt(0.8 * 1.5), 1e-12);
  EXPECT_TRUE(s["vs_compile"]["levels"].contains("2"));
  EXPECT_NE(render_bench_table(s).find("over torch.compile"), std::string::npos);
}

// kz bench --also-policy: the other policy's metrics sit under its name; the table adds a row for them.
TEST_F(ReportTest, TheOtherPolicysMetricsAreARowOfTheTable) {
  auto s = bench_summary(info, tasks, verdicts);
  s["policy"] = "strict";
  std::vector<Verdict> all_correct = {sample("a", 0, EvalStatus::ok, 2.0), sample("a", 1, EvalStatus::ok, 1.5),
                                      sample("b", 0, EvalStatus::ok, 1.2), sample("b", 1, EvalStatus::ok, 0.5)};
  s["kernelbench"] = bench_metrics(tasks, all_correct);
  EXPECT_DOUBLE_EQ(s["kernelbench"]["pass_at_k"]["1"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["pass_at_k"]["1"].get<double>(), 0.5) << "today's keys: the default policy's";
  EXPECT_NE(render_bench_table(s).find("all, policy kernelbench"), std::string::npos);
}

TEST_F(ReportTest, TableAndHtmlShowTheRun) {
  auto s = bench_summary(info, tasks, verdicts);
  std::string table = render_bench_table(s);
  EXPECT_NE(table.find("pass@1"), std::string::npos);
  EXPECT_NE(table.find("50.0%"), std::string::npos);
  std::string html = render_bench_html(info, s, tasks, verdicts);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("a #0: ok 2.00x"), std::string::npos);  // grid tooltip
  EXPECT_NE(html.find("openai:http://x/v1:m"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);         // self-contained, static
}

// A task without any verdict (its generation failed; a run cut short) scores 0 in every denominator,
// as in KernelBench: a short run cannot inflate a metric. pass@k still goes up to the sampled tasks' n.
TEST_F(ReportTest, ATaskWithoutVerdictsScoresZero) {
  std::vector<Verdict> only_a = {sample("a", 0, EvalStatus::ok, 2.0), sample("a", 1, EvalStatus::ok, 2.0)};
  auto s = bench_summary(info, tasks, only_a);
  EXPECT_EQ(s["overall"]["tasks"], 2);
  EXPECT_DOUBLE_EQ(s["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["pass_at_k"]["2"].get<double>(), 0.5) << "k up to the sampled tasks' 2";
  EXPECT_DOUBLE_EQ(s["fast_p"]["1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["levels"]["2"]["pass_at_k"]["1"].get<double>(), 0.0) << "level 2: only task b, unsampled";
  EXPECT_EQ(s["tasks_without_samples"], 1);
  EXPECT_NE(render_bench_table(s).find("1 task(s) without any sample"), std::string::npos);
  EXPECT_EQ(render_bench_table(bench_summary(info, tasks, verdicts)).find("without any sample"), std::string::npos);
  auto none = bench_summary(info, tasks, {});
  EXPECT_DOUBLE_EQ(none["pass_at_k"]["1"].get<double>(), 0.0);
}

// fast_1 is unknown ("n/a") only where correct samples went untimed; with none correct it is 0.
TEST_F(ReportTest, Fast1IsZeroNotUnknownWhereNothingWasCorrect) {
  std::vector<Verdict> wrong = {sample("a", 0, EvalStatus::incorrect), sample("b", 0, EvalStatus::compile_error)};
  info.samples = 1;
  auto fast_1_of_all = [](const std::string& table) {  // the "all" row's sixth cell (cells: 2+ spaces apart)
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("all ", 0) != 0) continue;
      std::vector<std::string> cells;
      for (size_t at = 0; at < line.size();) {
        size_t gap = line.find("  ", at);
        cells.push_back(line.substr(at, gap - at));
        at = gap == std::string::npos ? line.size() : line.find_first_not_of(' ', gap);
      }
      return cells.size() > 5 ? cells[5] : std::string();
    }
    return std::string();
  };
  EXPECT_EQ(fast_1_of_all(render_bench_table(bench_summary(info, tasks, wrong))), "0.0%");
  std::vector<Verdict> untimed = {sample("a", 0, EvalStatus::ok), sample("b", 0, EvalStatus::ok)};
  EXPECT_EQ(fast_1_of_all(render_bench_table(bench_summary(info, tasks, untimed))), "n/a");
}

TEST_F(ReportTest, UntimedRunSaysSo) {
  std::vector<Verdict> untimed = {sample("a", 0, EvalStatus::ok), sample("b", 0, EvalStatus::ok)};
  info.samples = 1;
  auto s = bench_summary(info, tasks, untimed);
  EXPECT_TRUE(s["overall"]["geomean_speedup"].is_null());
  std::string html = render_bench_html(info, s, tasks, untimed);
  EXPECT_NE(html.find("No timed samples"), std::string::npos);
}

}  // namespace
}  // namespace kz
