// Benchmark metrics (metrics.h): pass@k, fast_p, geometric-mean speedup, compile and cheat rates.
#include "kz/rl/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kz {
namespace {

bool counts_correct(const SampleOutcome& s) { return s.correct && !s.cheat; }

// pass_at_k for one task with c successes; a task with fewer than k samples is padded with
// failures (n = k), so missing samples can only lower the score.
double task_pass_at_k(int n, int c, int k) { return pass_at_k(std::max(n, k), c, k); }

template <class Pred>
int count_samples(const std::vector<SampleOutcome>& samples, Pred pred) {
  return static_cast<int>(std::count_if(samples.begin(), samples.end(), pred));
}

// Mean over tasks of pass@k with c counted by `pred`.
template <class Pred>
double mean_pass_at_k(const std::vector<TaskOutcomes>& tasks, int k, Pred pred) {
  if (tasks.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (const auto& t : tasks) sum += task_pass_at_k(static_cast<int>(t.samples.size()), count_samples(t.samples, pred), k);
  return sum / static_cast<double>(tasks.size());
}

std::optional<double> geomean_speedup(const std::vector<TaskOutcomes>& tasks) {
  double log_sum = 0;
  int count = 0;
  for (const auto& t : tasks)
    for (const auto& s : t.samples)
      if (counts_correct(s) && s.speedup && *s.speedup > 0 && std::isfinite(*s.speedup)) {
        log_sum += std::log(*s.speedup);  // sum of logs: a product of many speedups could overflow
        ++count;
      }
  if (count == 0) return std::nullopt;
  return std::exp(log_sum / count);
}

}  // namespace

double pass_at_k(int n, int c, int k) {
  if (k < 1 || k > n || c < 0 || c > n) return std::numeric_limits<double>::quiet_NaN();
  if (n - c < k) return 1.0;  // every k-subset holds a success
  double all_fail = 1.0;      // C(n-c, k) / C(n, k) as a product of factors in (0, 1]
  for (int i = n - c + 1; i <= n; ++i) all_fail *= 1.0 - static_cast<double>(k) / i;
  return 1.0 - all_fail;
}

bool is_fast(const SampleOutcome& sample, double p) {
  if (!counts_correct(sample)) return false;
  return sample.speedup ? *sample.speedup > p : p <= 0;  // untimed: only "correct" is known
}

double fast_p(const std::vector<TaskOutcomes>& tasks, double p, int k) {
  return mean_pass_at_k(tasks, k, [p](const SampleOutcome& s) { return is_fast(s, p); });
}

BenchMetrics compute_metrics(const std::vector<TaskOutcomes>& tasks, const std::vector<double>& ps) {
  BenchMetrics m;
  m.tasks = static_cast<int>(tasks.size());
  int compiled = 0, cheats = 0;
  for (const auto& t : tasks) {
    m.samples += static_cast<int>(t.samples.size());
    compiled += count_samples(t.samples, [](const SampleOutcome& s) { return s.compiled; });
    cheats += count_samples(t.samples, [](const SampleOutcome& s) { return s.cheat; });
  }
  if (m.samples > 0) {
    m.compile_rate = static_cast<double>(compiled) / m.samples;
    m.cheat_rate = static_cast<double>(cheats) / m.samples;
  }
  m.geomean_speedup = geomean_speedup(tasks);
  if (tasks.empty()) return m;
  // k up to the fewest samples of a task that has any: a task without samples (scoring 0 at every
  // k) must not empty the curve; with none sampled at all, pass@1 is 0.
  size_t min_n = 0;
  for (const auto& t : tasks)
    if (!t.samples.empty() && (min_n == 0 || t.samples.size() < min_n)) min_n = t.samples.size();
  for (int k = 1; k <= static_cast<int>(std::max<size_t>(min_n, 1)); ++k) m.pass_at_k[k] = mean_pass_at_k(tasks, k, counts_correct);
  for (double p : ps) m.fast_p_at_1[p] = fast_p(tasks, p, 1);
  return m;
}

std::map<int, BenchMetrics> metrics_by_level(const std::vector<TaskOutcomes>& tasks, const std::vector<double>& ps) {
  std::map<int, std::vector<TaskOutcomes>> split;
  for (const auto& t : tasks) split[t.level].push_back(t);
  std::map<int, BenchMetrics> out;
  for (const auto& [level, level_tasks] : split) out[level] = compute_metrics(level_tasks, ps);
  return out;
}

nlohmann::json to_json(const BenchMetrics& m) {
  nlohmann::json pass = nlohmann::json::object(), fast = nlohmann::json::object();
  for (const auto& [k, v] : m.pass_at_k) pass[std::to_string(k)] = v;
  for (const auto& [p, v] : m.fast_p_at_1) fast[fmt::format("{:g}", p)] = v;  // 0.5 -> "0.5", 1 -> "1"
  return {{"tasks", m.tasks},
          {"samples", m.samples},
          {"pass_at_k", pass},
          {"fast_p", fast},  // keyed by p, at k = 1 (summary.json's contract)
          {"geomean_speedup", m.geomean_speedup ? nlohmann::json(*m.geomean_speedup) : nlohmann::json(nullptr)},
          {"compile_rate", m.compile_rate},
          {"cheat_rate", m.cheat_rate}};
}

}  // namespace kz
