// CA-GRPO group advantages (advantage.h): ρ, rewards, normalisation, the gate's memory, summaries.
#include "kz/rl/advantage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kz::rl {
namespace {

// ρ_q from this group's counts and the previous visit's ρ (see the header comment).
std::optional<double> group_rho(const GroupResult& g, const RewardOptions& options, std::optional<double> previous) {
  bool ema = options.gate_ema > 0 && previous.has_value();
  if (g.kept == 0) return ema ? previous : std::nullopt;  // no new evidence
  double rate = static_cast<double>(g.correct) / g.kept;
  return ema ? (1 - options.gate_ema) * *previous + options.gate_ema * rate : rate;
}

std::vector<double> kept_values(const std::vector<std::optional<double>>& values) {
  std::vector<double> kept;
  for (const auto& v : values)
    if (v) kept.push_back(*v);
  return kept;
}

// Fills g.advantages from g.rewards (g.kept >= 1).
void set_advantages(GroupResult& g, const RewardOptions& options) {
  g.advantages = normalize_group(g.rewards, options.epsilon, options.scale_by_std, &g.zero_variance);
}

}  // namespace

std::vector<std::optional<double>> normalize_group(const std::vector<std::optional<double>>& rewards, double epsilon,
                                                   bool scale_by_std, bool* zero_variance) {
  std::vector<std::optional<double>> advantages(rewards.size());
  std::vector<double> r = kept_values(rewards);
  bool equal = std::all_of(r.begin(), r.end(), [&](double x) { return x == r.front(); });
  if (zero_variance) *zero_variance = !r.empty() && equal;
  if (r.empty()) return advantages;
  double mean = 0, var = 0;
  for (double x : r) mean += x;
  mean /= static_cast<double>(r.size());
  for (double x : r) var += (x - mean) * (x - mean);
  double scale = scale_by_std ? std::sqrt(var / static_cast<double>(r.size())) + epsilon : 1.0;
  for (size_t i = 0; i < rewards.size(); ++i) {
    if (!rewards[i]) continue;
    // Exactly 0 for equal rewards: the computed mean of equal values can differ from them by an ulp.
    advantages[i] = equal ? 0.0 : (*rewards[i] - mean) / scale;
  }
  return advantages;
}

GroupResult compute_group(const std::vector<SampleVerdict>& group, const RewardOptions& options,
                          std::optional<double> previous_rho) {
  GroupResult g;
  g.rewards.assign(group.size(), std::nullopt);
  g.advantages.assign(group.size(), std::nullopt);
  for (const auto& v : group) {
    if (is_dropped(v)) {
      ++g.dropped;
      continue;
    }
    ++g.kept;
    g.correct += static_cast<int>(correctness(v));
  }
  g.rho = group_rho(g, options, previous_rho);
  if (g.kept == 0) return g;
  g.gate_on = performance_gate(options, *g.rho);
  for (size_t i = 0; i < group.size(); ++i) g.rewards[i] = sample_reward(group[i], options, *g.rho);
  set_advantages(g, options);
  return g;
}

std::optional<double> GateMemory::rho(const std::string& task_id) const {
  auto it = rho_.find(task_id);
  if (it == rho_.end()) return std::nullopt;
  return it->second;
}

GroupResult GateMemory::visit(const std::string& task_id, const std::vector<SampleVerdict>& group,
                              const RewardOptions& options) {
  GroupResult g = compute_group(group, options, rho(task_id));
  if (g.rho) rho_[task_id] = *g.rho;
  return g;
}

nlohmann::json GateMemory::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [task, rho] : rho_) j[task] = rho;
  return j;
}

Result<GateMemory> GateMemory::from_json(const nlohmann::json& json) {
  if (!json.is_object()) return parse_error(fmt::format("gate memory: expected an object of task id -> rho, got {}", json.type_name()));
  GateMemory memory;
  for (const auto& [task, value] : json.items()) {
    if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 1))
      return parse_error(fmt::format("gate memory: task '{}': rho {} is not a number in [0, 1]", task, value.dump()));
    memory.rho_[task] = value.get<double>();
  }
  return memory;
}

BatchSummary summarize(const std::vector<GroupResult>& groups) {
  BatchSummary s;
  s.groups = static_cast<int>(groups.size());
  int correct = 0, gate_on = 0;
  double reward_sum = 0;
  for (const auto& g : groups) {
    s.kept += g.kept;
    s.dropped += g.dropped;
    correct += g.correct;
    s.empty_groups += g.kept == 0;
    s.zero_variance_groups += g.zero_variance;
    gate_on += g.gate_on;
    for (double r : kept_values(g.rewards)) reward_sum += r;
  }
  if (s.kept > 0) {
    s.reward_mean = reward_sum / s.kept;
    s.correct_rate = static_cast<double>(correct) / s.kept;
  }
  int scored_groups = s.groups - s.empty_groups;  // an empty group has no gate to open
  if (scored_groups > 0) s.gate_on_share = static_cast<double>(gate_on) / scored_groups;
  return s;
}

nlohmann::json to_json(const BatchSummary& s) {
  return {{"groups", s.groups},
          {"empty_groups", s.empty_groups},
          {"kept", s.kept},
          {"dropped", s.dropped},
          {"zero_variance_groups", s.zero_variance_groups},
          {"reward_mean", s.reward_mean},
          {"correct_rate", s.correct_rate},
          {"gate_on_share", s.gate_on_share}};
}

}  // namespace kz::rl
