// CA-GRPO group advantages: the rewards of one task's group of samples, normalised within it.
//
// For the G samples of task q (one prompt, G completions), K = the kept samples (all but
// infra_error, which carries no reward: reward.h):
//
//   rate_q = (1/|K|)·Σ_{i∈K} c_i                      the group's correct rate
//   ρ_q    = rate_q                                   gate_ema = 0, or no previous ρ for q
//          = (1 − w)·ρ_q,previous + w·rate_q          gate_ema = w > 0 (an EMA across visits)
//   r_i    = reward.h's r_i with the gate g_q = [ρ_q ≥ τ] (ca_grpo)
//   mean   = (1/|K|)·Σ_{i∈K} r_i
//   std    = sqrt((1/|K|)·Σ_{i∈K} (r_i − mean)²)      the population std over K
//   A_i    = (r_i − mean)/(std + ε)                   scale_by_std (default)
//          = r_i − mean                               scale_by_std = false
//
// A group whose kept rewards are all equal (zero variance; a single kept sample included) has
// A_i = 0 exactly: it holds no signal and contributes nothing to the update; it is counted.
// A group with no kept sample (all infra_error) has no rewards, no advantages and no new ρ
// (ρ_q stays the previous one, if any); its samples are counted as dropped.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"
#include "kz/rl/reward.h"

namespace kz::rl {

struct GroupResult {
  std::vector<std::optional<double>> rewards;     // r_i per sample, in input order; nullopt: dropped
  std::vector<std::optional<double>> advantages;  // A_i per sample; nullopt: dropped (no gradient)
  std::optional<double> rho;  // ρ_q that gated the group; nullopt: no kept sample and no previous ρ
  bool gate_on = false;       // whether the performance term counted (performance_gate(ρ_q))
  int kept = 0;               // |K|
  int correct = 0;            // kept samples with c_i = 1
  int dropped = 0;            // infra_error samples
  bool zero_variance = false; // |K| >= 1 and every kept reward equal: every A_i = 0
};

// A_i of the kept rewards (nullopt: dropped) as the header defines them: (r_i − mean)/(std + ε),
// or r_i − mean without scale_by_std; exactly 0 when the kept rewards are all equal (then
// *zero_variance, when given, is set; it is false for a group with no kept reward). The Coder's
// groups (compute_group) and the Proposer's (one API set's modules) share it.
std::vector<std::optional<double>> normalize_group(const std::vector<std::optional<double>>& rewards, double epsilon,
                                                   bool scale_by_std, bool* zero_variance = nullptr);

// The rewards and advantages of one group. `options` must have passed validate();
// `previous_rho` is the task's ρ from its previous visit (used only when gate_ema > 0).
GroupResult compute_group(const std::vector<SampleVerdict>& group, const RewardOptions& options,
                          std::optional<double> previous_rho);

// Task id -> ρ_q after its latest visit, so the gate's EMA spans visits; checkpointed with a run.
class GateMemory {
 public:
  // The task's ρ after its latest visit; nullopt before its first.
  std::optional<double> rho(const std::string& task_id) const;
  // compute_group with the task's previous ρ, remembering the new one.
  GroupResult visit(const std::string& task_id, const std::vector<SampleVerdict>& group,
                    const RewardOptions& options);
  size_t size() const { return rho_.size(); }

  // {"<task id>": ρ, ...}
  nlohmann::json to_json() const;
  // The inverse of to_json; parse_error when `json` is not an object or names a task whose
  // value is not a number in [0, 1].
  static Result<GateMemory> from_json(const nlohmann::json& json);

 private:
  std::map<std::string, double> rho_;
};

// One batch of groups, for the metrics log.
struct BatchSummary {
  int groups = 0;
  int empty_groups = 0;          // groups with no kept sample (all infra_error)
  int kept = 0;                  // kept samples over all groups
  int dropped = 0;               // infra_error samples over all groups
  int zero_variance_groups = 0;  // groups contributing nothing to the update
  double reward_mean = 0;        // mean r_i over all kept samples (0 when none)
  double correct_rate = 0;       // share of the kept samples with c_i = 1 (0 when none)
  double gate_on_share = 0;      // share of the non-empty groups whose performance term counted
};

BatchSummary summarize(const std::vector<GroupResult>& groups);

// The fields above under their own names.
nlohmann::json to_json(const BatchSummary& summary);

}  // namespace kz::rl
