// Benchmark metrics over sampled kernels: pass@k, fast_p, geometric-mean speedup, rates.
//
// Inputs are per-task lists of sample outcomes (n samples per task, usually the same n for all).
// Definitions, following Codex (pass@k) and KernelBench (fast_p):
//
//   pass@k  = mean over tasks of  1 - C(n-c, k) / C(n, k)
//             the unbiased estimate of P(at least one of k samples drawn without replacement from
//             the task's n is correct), c = the task's correct samples.
//   fast_p@k = the same with c = the task's samples that are correct AND have speedup > p.
//             A correct sample that was not timed (CPU machine) counts only for p <= 0, since any
//             timed correct sample has speedup > 0. fast_0 is therefore pass@k.
//             With one sample per task and k = 1 this is KernelBench's fast_p: the fraction of
//             tasks solved correctly and more than p times faster than the reference.
//
// A sample flagged as a cheat never counts as correct, whatever its `correct` field says.
// A task with fewer than k samples counts its missing samples as failures (a task without
// samples scores 0), so a short run cannot inflate a metric.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kz {

struct SampleOutcome {
  bool correct = false;           // passed every correctness check (verdict ok)
  std::optional<double> speedup;  // reference time / candidate time; nullopt when not timed
  bool compiled = false;          // got past the compile stage
  bool cheat = false;             // an anti-cheating check fired
};

struct TaskOutcomes {
  std::string task_id;
  int level = 1;
  std::vector<SampleOutcome> samples;
};

struct BenchMetrics {
  std::map<int, double> pass_at_k;           // k -> pass@k, for k = 1 .. the smallest n over sampled tasks
  std::map<double, double> fast_p_at_1;      // p -> fast_p with k = 1
  std::optional<double> geomean_speedup;     // over correct, timed samples; nullopt when none
  double compile_rate = 0;                   // compiled samples / samples (0 without samples)
  double cheat_rate = 0;                     // cheat samples / samples
  int tasks = 0;
  int samples = 0;
};

// 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials).
// Defined for 1 <= k <= n and 0 <= c <= n; NaN outside that domain.
double pass_at_k(int n, int c, int k);

// Whether a sample counts as a success for fast_p at threshold p (see the definitions above).
bool is_fast(const SampleOutcome& sample, double p);

// Mean over tasks of pass_at_k with c = the task's fast samples; NaN for an empty task list.
double fast_p(const std::vector<TaskOutcomes>& tasks, double p, int k = 1);

// Every metric over all tasks. pass@k and fast_p stay empty when there are no tasks.
BenchMetrics compute_metrics(const std::vector<TaskOutcomes>& tasks,
                             const std::vector<double>& ps = {0, 0.5, 0.8, 1, 1.5, 2});

// compute_metrics for each level's tasks separately.
std::map<int, BenchMetrics> metrics_by_level(const std::vector<TaskOutcomes>& tasks,
                                             const std::vector<double>& ps = {0, 0.5, 0.8, 1, 1.5, 2});

// {"tasks", "samples", "pass_at_k": {"1": ..}, "fast_p": {"0": .., "0.5": ..} (k = 1),
//  "geomean_speedup": number or null, "compile_rate", "cheat_rate"}.
nlohmann::json to_json(const BenchMetrics& metrics);

}  // namespace kz
