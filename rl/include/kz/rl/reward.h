// The Coder's reward for one evaluated sample: correctness, performance and the CA-GRPO gate.
//
// For sample i of task q, from its verdict (status s_i, correct flag, speedup = reference time /
// candidate time, absent when not timed, as on a CPU machine):
//
//   c_i = 1 if s_i = ok and the sample is correct, else 0      (compiled_not_run is never correct)
//   p_i = c_i · clip(log2(speedup_i), −m, m)                   m = perf_clip; p_i = 0 when not timed
//
//   r_i = c_i + g_q·λ·p_i     s_i = ok
//       = penalty_format      s_i = format_error                       (default 0)
//       = 0                   compiled_not_run, compile_error, runtime_error, incorrect, timeout
//       = penalty_cheat       cheat_detected, sandbox_violation        (default −1)
//       = none                infra_error: not the candidate's doing; dropped from its group
//
// The gate g_q, by mode (λ = lambda_perf, τ = gate_tau, ρ_q = the task's correctness
// reliability, computed over its group in advantage.h):
//   ca_grpo           g_q = [ρ_q ≥ τ]    performance counts once correctness is reliable
//   ungated           g_q = 1            the ablation baseline c + λ·p
//   correctness_only  g_q = 0            the ablation baseline c (the penalties still apply)
//
// A correct sample's reward lies in [1 − λ·m, 1 + λ·m]: with the defaults (λ = 1, m = 2) a
// correct kernel 4x slower than the reference scores −1, as a cheat does; λ·m < 1 keeps every
// correct sample above every failed one.
//
// rl does not depend on eval: the loop converts an eval Verdict into a SampleVerdict (the status
// names are the evaluator's, parse_sample_status).
#pragma once

#include <optional>
#include <string>

#include "kz/core/status.h"

namespace kz::rl {

// The evaluator's statuses (eval/include/kz/eval/verdict.h), in its order.
enum class SampleStatus {
  ok,
  compiled_not_run,
  format_error,
  compile_error,
  runtime_error,
  incorrect,
  timeout,
  cheat_detected,
  sandbox_violation,
  infra_error,
};
const char* sample_status_name(SampleStatus status);
// invalid_argument naming the unknown status and the known ones.
Result<SampleStatus> parse_sample_status(const std::string& name);

struct SampleVerdict {
  SampleStatus status = SampleStatus::infra_error;  // a verdict never filled in is no reward
  bool correct = false;                              // passed every correctness check
  std::optional<double> speedup;                     // reference / candidate time; nullopt: not timed
};

// infra_error samples carry no reward: the failure is KernelZero's or the reference's.
inline bool is_dropped(const SampleVerdict& v) { return v.status == SampleStatus::infra_error; }

enum class RewardMode { ca_grpo, ungated, correctness_only };
const char* reward_mode_name(RewardMode mode);  // "ca_grpo", "ungated", "correctness_only"
// invalid_argument naming the unknown mode and the allowed ones.
Result<RewardMode> parse_reward_mode(const std::string& name);

struct RewardOptions {
  RewardMode mode = RewardMode::ca_grpo;  // how performance counts (see the header comment)
  double lambda_perf = 1.0;    // λ: weight of the performance term p; >= 0
  double perf_clip = 2.0;      // m: p = clip(log2 speedup, −m, m), i.e. speedups 1/4x..4x; > 0
  double gate_tau = 0.5;       // τ: ρ_q must reach it for performance to count (ca_grpo); [0, 1]
  // w: ρ_q = (1 − w)·ρ_previous + w·(this group's correct rate) across visits of the same task
  // (advantage.h); 0: off, ρ_q is this group's rate alone. [0, 1]
  double gate_ema = 0.0;
  double penalty_cheat = -1.0;  // reward of cheat_detected and sandbox_violation; <= 0
  double penalty_format = 0.0;  // reward of format_error (docs/rl.md); <= 0; 0: as the other failures
  double epsilon = 1e-6;        // ε in A = (r − mean)/(std + ε); > 0
  bool scale_by_std = true;     // false: A = r − mean (no division by the group's std)
  // invalid_argument naming the first field out of range, its value and the range.
  Status validate() const;
};

// c_i: 1 for a correct ok sample, else 0.
double correctness(const SampleVerdict& v);
// p_i: c_i · clip(log2 speedup, −perf_clip, perf_clip); 0 when not timed. A speedup that is not a
// positive number (NaN, <= 0) cannot come from a timing and counts as not timed.
double performance(const SampleVerdict& v, double perf_clip);
// g_q: whether the performance term counts for a group of reliability rho under options.mode.
bool performance_gate(const RewardOptions& options, double rho);
// r_i for a sample of a group of reliability rho; nullopt for a dropped (infra_error) sample.
std::optional<double> sample_reward(const SampleVerdict& v, const RewardOptions& options, double rho);

}  // namespace kz::rl
