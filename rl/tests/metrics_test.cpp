// Metrics: pass@k against brute-force enumeration of k-subsets, fast_p on a hand-made benchmark,
// geometric mean, per-level split and the JSON layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kz/rl/metrics.h"

namespace kz {
namespace {

// Fraction of the k-subsets of `outcomes` holding at least one success (bitmask enumeration).
double brute_force_pass_at_k(const std::vector<bool>& outcomes, int k) {
  int n = static_cast<int>(outcomes.size());
  long subsets = 0, hits = 0;
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    ++subsets;
    bool any = false;
    for (int i = 0; i < n; ++i) any = any || ((mask >> i) & 1u && outcomes[i]);
    hits += any;
  }
  return static_cast<double>(hits) / static_cast<double>(subsets);
}

TEST(PassAtK, MatchesBruteForceEnumeration) {
  std::mt19937 rng(1234);
  for (int n = 1; n <= 10; ++n)
    for (int c = 0; c <= n; ++c) {
      // A random arrangement of c successes: the estimator must not depend on the order.
      std::vector<bool> outcomes(n, false);
      std::fill(outcomes.begin(), outcomes.begin() + c, true);
      std::shuffle(outcomes.begin(), outcomes.end(), rng);
      for (int k = 1; k <= n; ++k)
        EXPECT_NEAR(pass_at_k(n, c, k), brute_force_pass_at_k(outcomes, k), 1e-12) << "n=" << n << " c=" << c << " k=" << k;
    }
}

TEST(PassAtK, EdgeCases) {
  for (int n = 1; n <= 20; ++n)
    for (int k = 1; k <= n; ++k) {
      EXPECT_EQ(pass_at_k(n, 0, k), 0.0);
      EXPECT_EQ(pass_at_k(n, n, k), 1.0);
    }
  EXPECT_DOUBLE_EQ(pass_at_k(10, 3, 1), 0.3);    // k = 1 is the success rate
  EXPECT_DOUBLE_EQ(pass_at_k(10, 1, 10), 1.0);   // all samples drawn
  EXPECT_NEAR(pass_at_k(200, 1, 100), 0.5, 1e-12);
  EXPECT_TRUE(std::isnan(pass_at_k(5, 1, 0)));
  EXPECT_TRUE(std::isnan(pass_at_k(5, 1, 6)));
  EXPECT_TRUE(std::isnan(pass_at_k(5, 6, 1)));
  EXPECT_TRUE(std::isnan(pass_at_k(5, -1, 1)));
}

TEST(PassAtK, LargeNIsStable) {
  // C(1000, 500) overflows a double; the product form does not.
  double v = pass_at_k(1000, 10, 500);
  EXPECT_TRUE(std::isfinite(v));
  EXPECT_GT(v, 0.99);
  EXPECT_LE(v, 1.0);
}

SampleOutcome ok(double speedup) { return {true, speedup, true, false}; }
SampleOutcome ok_untimed() { return {true, std::nullopt, true, false}; }
SampleOutcome wrong() { return {false, std::nullopt, true, false}; }
SampleOutcome not_compiled() { return {false, std::nullopt, false, false}; }
SampleOutcome cheat(double speedup) { return {true, speedup, true, true}; }

TEST(IsFast, Thresholds) {
  EXPECT_TRUE(is_fast(ok(0.3), 0));
  EXPECT_FALSE(is_fast(ok(0.3), 0.5));
  EXPECT_FALSE(is_fast(ok(1.0), 1.0));  // strictly faster than p
  EXPECT_TRUE(is_fast(ok(1.01), 1.0));
  EXPECT_TRUE(is_fast(ok_untimed(), 0));  // correct but not timed: counts for p = 0 only
  EXPECT_FALSE(is_fast(ok_untimed(), 0.5));
  EXPECT_FALSE(is_fast(wrong(), 0));
  EXPECT_FALSE(is_fast(cheat(5.0), 0));  // a cheat is never correct
}

// Four tasks, one sample each: KernelBench's fast_p is the fraction of tasks correct and > p.
TEST(FastP, OneSamplePerTaskIsKernelBenchFastP) {
  std::vector<TaskOutcomes> tasks = {
      {"a", 1, {ok(0.6)}}, {"b", 1, {ok(1.2)}}, {"c", 1, {ok(2.5)}}, {"d", 1, {wrong()}}};
  EXPECT_DOUBLE_EQ(fast_p(tasks, 0), 0.75);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 0.5), 0.75);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 0.8), 0.5);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1), 0.5);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1.5), 0.25);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 2), 0.25);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 3), 0.0);
}

TEST(FastP, SeveralSamplesUseTheUnbiasedEstimate) {
  // Task a: 4 samples, 2 correct of which 1 is faster than 1x. Task b: 4 samples, none correct.
  std::vector<TaskOutcomes> tasks = {{"a", 1, {ok(1.5), ok(0.9), wrong(), not_compiled()}},
                                     {"b", 1, {wrong(), wrong(), not_compiled(), cheat(3.0)}}};
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1, 1), (0.25 + 0) / 2);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1, 2), (pass_at_k(4, 1, 2) + 0) / 2);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 0, 2), (pass_at_k(4, 2, 2) + 0) / 2);
  EXPECT_TRUE(std::isnan(fast_p({}, 1)));
}

TEST(FastP, TaskWithTooFewSamplesCountsMissingAsFailures) {
  std::vector<TaskOutcomes> tasks = {{"a", 1, {ok(2.0)}}, {"b", 1, {}}};
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1, 1), 0.5);
  EXPECT_DOUBLE_EQ(fast_p(tasks, 1, 2), 0.5);  // task a: 1 success among n = k = 2
}

TEST(ComputeMetrics, HandMadeBenchmark) {
  std::vector<TaskOutcomes> tasks = {
      {"t1", 1, {ok(2.0), ok(0.5), wrong()}},
      {"t2", 1, {ok(4.0), not_compiled(), not_compiled(), wrong()}},
      {"t3", 2, {cheat(100.0), wrong(), ok_untimed()}},
  };
  BenchMetrics m = compute_metrics(tasks);
  EXPECT_EQ(m.tasks, 3);
  EXPECT_EQ(m.samples, 10);
  // pass@k for k = 1..3 (the smallest task has 3 samples); c = 2, 1, 1 (the cheat does not count).
  ASSERT_EQ(m.pass_at_k.size(), 3u);
  EXPECT_DOUBLE_EQ(m.pass_at_k.at(1), (2.0 / 3 + 1.0 / 4 + 1.0 / 3) / 3);
  EXPECT_DOUBLE_EQ(m.pass_at_k.at(3), (1.0 + pass_at_k(4, 1, 3) + 1.0) / 3);
  ASSERT_EQ(m.fast_p_at_1.size(), 6u);
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(0), m.pass_at_k.at(1));
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(1), (1.0 / 3 + 1.0 / 4 + 0) / 3);
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(2), (0 + 1.0 / 4 + 0) / 3);
  // Correct timed samples: 2.0, 0.5, 4.0 -> (2 * 0.5 * 4)^(1/3) = 4^(1/3). The cheat's 100x is excluded.
  ASSERT_TRUE(m.geomean_speedup);
  EXPECT_NEAR(*m.geomean_speedup, std::cbrt(4.0), 1e-12);
  EXPECT_DOUBLE_EQ(m.compile_rate, 8.0 / 10);
  EXPECT_DOUBLE_EQ(m.cheat_rate, 1.0 / 10);
}

TEST(ComputeMetrics, GeomeanOfEqualSpeedupsIsThatSpeedup) {
  std::vector<TaskOutcomes> tasks = {{"a", 1, {ok(1.7), ok(1.7)}}, {"b", 1, {ok(1.7)}}};
  EXPECT_NEAR(*compute_metrics(tasks).geomean_speedup, 1.7, 1e-12);
  std::vector<TaskOutcomes> untimed = {{"a", 1, {ok_untimed(), wrong()}}};
  BenchMetrics m = compute_metrics(untimed);
  EXPECT_FALSE(m.geomean_speedup);
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(0), 0.5);
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(0.5), 0.0);
}

// A task without samples (its generation failed) scores 0 and does not empty the pass@k curve: k
// goes up to the fewest samples among the tasks that have any.
TEST(ComputeMetrics, ATaskWithoutSamplesScoresZeroAtEveryK) {
  std::vector<TaskOutcomes> tasks = {{"a", 1, {ok(2.0), ok(2.0)}}, {"b", 1, {}}};
  BenchMetrics m = compute_metrics(tasks);
  ASSERT_EQ(m.pass_at_k.size(), 2u);
  EXPECT_DOUBLE_EQ(m.pass_at_k.at(1), 0.5);
  EXPECT_DOUBLE_EQ(m.pass_at_k.at(2), 0.5);
  EXPECT_DOUBLE_EQ(m.fast_p_at_1.at(1), 0.5);
}

TEST(ComputeMetrics, Empty) {
  BenchMetrics m = compute_metrics({});
  EXPECT_EQ(m.tasks, 0);
  EXPECT_EQ(m.samples, 0);
  EXPECT_TRUE(m.pass_at_k.empty());
  EXPECT_TRUE(m.fast_p_at_1.empty());
  EXPECT_FALSE(m.geomean_speedup);
  EXPECT_EQ(m.compile_rate, 0.0);
}

TEST(MetricsByLevel, SplitsTasks) {
  std::vector<TaskOutcomes> tasks = {
      {"a", 1, {ok(2.0), wrong()}}, {"b", 2, {ok(1.0)}}, {"c", 1, {wrong(), wrong()}}, {"d", 3, {}}};
  auto by_level = metrics_by_level(tasks);
  ASSERT_EQ(by_level.size(), 3u);
  EXPECT_EQ(by_level.at(1).tasks, 2);
  EXPECT_EQ(by_level.at(1).samples, 4);
  EXPECT_EQ(by_level.at(1).pass_at_k.size(), 2u);
  EXPECT_DOUBLE_EQ(by_level.at(1).pass_at_k.at(1), 0.25);
  EXPECT_DOUBLE_EQ(by_level.at(1).pass_at_k.at(2), 0.5);
  EXPECT_DOUBLE_EQ(by_level.at(2).pass_at_k.at(1), 1.0);
  EXPECT_DOUBLE_EQ(by_level.at(2).fast_p_at_1.at(1), 0.0);  // 1.0x is not faster than 1
  ASSERT_EQ(by_level.at(3).pass_at_k.size(), 1u);          // no samples: scores 0 at k = 1
  EXPECT_DOUBLE_EQ(by_level.at(3).pass_at_k.at(1), 0.0);
  EXPECT_DOUBLE_EQ(by_level.at(3).fast_p_at_1.at(0), 0.0);
}

TEST(ToJson, KeysAndFormatting) {
  std::vector<TaskOutcomes> tasks = {{"a", 1, {ok(2.0), wrong()}}};
  nlohmann::json j = to_json(compute_metrics(tasks));
  EXPECT_EQ(j["tasks"], 1);
  EXPECT_EQ(j["samples"], 2);
  EXPECT_DOUBLE_EQ(j["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["pass_at_k"]["2"].get<double>(), 1.0);
  std::vector<std::string> keys;
  for (const auto& [key, value] : j["fast_p"].items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"0", "0.5", "0.8", "1", "1.5", "2"}));
  EXPECT_DOUBLE_EQ(j["geomean_speedup"].get<double>(), 2.0);
  EXPECT_TRUE(to_json(compute_metrics({{"a", 1, {wrong()}}}))["geomean_speedup"].is_null());
}

}  // namespace
}  // namespace kz
