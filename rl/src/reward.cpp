// The Coder's reward (reward.h): status and mode names, option checks, c, p, the gate and r.
#include "kz/rl/reward.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace kz::rl {
namespace {

// Indexed by the enums' values, in their declaration order.
constexpr std::array<const char*, 10> kStatusNames = {
    "ok",      "compiled_not_run", "format_error",   "compile_error",     "runtime_error",
    "incorrect", "timeout",        "cheat_detected", "sandbox_violation", "infra_error"};
constexpr std::array<const char*, 3> kModeNames = {"ca_grpo", "ungated", "correctness_only"};

// The index of `name` in `names`, or an invalid_argument listing the allowed names.
template <size_t N>
Result<size_t> find_name(const std::array<const char*, N>& names, const std::string& name, const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return i;
  return invalid_argument(fmt::format("unknown {} '{}' ({})", what, name, fmt::join(names, ", ")));
}

}  // namespace

const char* sample_status_name(SampleStatus status) { return kStatusNames[static_cast<size_t>(status)]; }

Result<SampleStatus> parse_sample_status(const std::string& name) {
  auto index = find_name(kStatusNames, name, "evaluation status");
  if (!index) return index.status();
  return static_cast<SampleStatus>(*index);
}

const char* reward_mode_name(RewardMode mode) { return kModeNames[static_cast<size_t>(mode)]; }

Result<RewardMode> parse_reward_mode(const std::string& name) {
  auto index = find_name(kModeNames, name, "reward mode");
  if (!index) return index.status();
  return static_cast<RewardMode>(*index);
}

Status RewardOptions::validate() const {
  auto bad = [](const char* field, double value, const char* range) {
    return invalid_argument(fmt::format("reward options: {} {} must be {}", field, value, range));
  };
  // Written as !(in range) so that NaN fails too.
  if (!(lambda_perf >= 0 && std::isfinite(lambda_perf))) return bad("lambda_perf", lambda_perf, ">= 0");
  if (!(perf_clip > 0 && std::isfinite(perf_clip))) return bad("perf_clip", perf_clip, "> 0");
  if (!(gate_tau >= 0 && gate_tau <= 1)) return bad("gate_tau", gate_tau, "in [0, 1]");
  if (!(gate_ema >= 0 && gate_ema <= 1)) return bad("gate_ema", gate_ema, "in [0, 1]");
  if (!(penalty_cheat <= 0 && std::isfinite(penalty_cheat))) return bad("penalty_cheat", penalty_cheat, "<= 0");
  if (!(penalty_format <= 0 && std::isfinite(penalty_format))) return bad("penalty_format", penalty_format, "<= 0");
  if (!(epsilon > 0 && std::isfinite(epsilon))) return bad("epsilon", epsilon, "> 0");
  return Status::ok();
}

double correctness(const SampleVerdict& v) { return v.status == SampleStatus::ok && v.correct ? 1.0 : 0.0; }

double performance(const SampleVerdict& v, double perf_clip) {
  if (correctness(v) == 0 || !v.speedup || !(*v.speedup > 0)) return 0.0;
  return std::clamp(std::log2(*v.speedup), -perf_clip, perf_clip);  // log2(inf) clips to m
}

bool performance_gate(const RewardOptions& options, double rho) {
  switch (options.mode) {
    case RewardMode::ca_grpo: return rho >= options.gate_tau;
    case RewardMode::ungated: return true;
    case RewardMode::correctness_only: return false;
  }
  return false;
}

std::optional<double> sample_reward(const SampleVerdict& v, const RewardOptions& options, double rho) {
  switch (v.status) {
    case SampleStatus::ok: {
      double perf = performance_gate(options, rho) ? options.lambda_perf * performance(v, options.perf_clip) : 0.0;
      return correctness(v) + perf;
    }
    case SampleStatus::format_error: return options.penalty_format;
    case SampleStatus::cheat_detected:
    case SampleStatus::sandbox_violation: return options.penalty_cheat;
    case SampleStatus::infra_error: return std::nullopt;
    case SampleStatus::compiled_not_run:  // CPU machine: never run, so never shown correct
    case SampleStatus::compile_error:
    case SampleStatus::runtime_error:
    case SampleStatus::incorrect:
    case SampleStatus::timeout: return 0.0;
  }
  return std::nullopt;
}

}  // namespace kz::rl
