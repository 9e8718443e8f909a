// The Coder's reward: every status, the clip edges of p, the gate in each mode, names and options.
// Defaults throughout unless a test says otherwise: λ = 1, m = 2, τ = 0.5, penalty_cheat = −1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kz/rl/reward.h"

namespace kz::rl {
namespace {

SampleVerdict correct_sample(std::optional<double> speedup) { return {SampleStatus::ok, true, speedup}; }
SampleVerdict failed(SampleStatus status) { return {status, false, std::nullopt}; }

TEST(SampleReward, EveryStatus) {
  RewardOptions o;
  const double rho = 1.0;  // gate on
  // ok, correct, 2x: c = 1, p = log2(2) = 1, r = 1 + 1·1·1 = 2.
  EXPECT_EQ(sample_reward(correct_sample(2.0), o, rho), 2.0);
  // ok, correct, not timed (CPU): p = 0, r = c = 1.
  EXPECT_EQ(sample_reward(correct_sample(std::nullopt), o, rho), 1.0);
  // compiled_not_run is never correct, whatever its flag says: c = 0 (so it lowers ρ), r = 0.
  SampleVerdict cpu_only{SampleStatus::compiled_not_run, true, std::nullopt};
  EXPECT_EQ(correctness(cpu_only), 0.0);
  EXPECT_EQ(sample_reward(cpu_only, o, rho), 0.0);
  EXPECT_EQ(correctness(correct_sample(std::nullopt)), 1.0);
  EXPECT_EQ(correctness({SampleStatus::ok, false, 2.0}), 0.0);
  for (SampleStatus s : {SampleStatus::format_error, SampleStatus::compile_error, SampleStatus::runtime_error,
                         SampleStatus::incorrect, SampleStatus::timeout})
    EXPECT_EQ(sample_reward(failed(s), o, rho), 0.0) << sample_status_name(s);
  // A failure's speedup (e.g. timed, then wrong after timing) earns nothing: p = c·... = 0.
  EXPECT_EQ(sample_reward({SampleStatus::incorrect, false, 4.0}, o, rho), 0.0);
  // Cheats and sandbox violations: penalty_cheat = −1, even with a large "speedup".
  EXPECT_EQ(sample_reward({SampleStatus::cheat_detected, true, 100.0}, o, rho), -1.0);
  EXPECT_EQ(sample_reward(failed(SampleStatus::sandbox_violation), o, rho), -1.0);
  // infra_error: no reward at all.
  EXPECT_EQ(sample_reward(failed(SampleStatus::infra_error), o, rho), std::nullopt);
}

TEST(SampleReward, PenaltiesAreOptions) {
  RewardOptions o;
  o.penalty_cheat = -3;
  o.penalty_format = -0.5;
  EXPECT_EQ(sample_reward(failed(SampleStatus::cheat_detected), o, 1.0), -3.0);
  EXPECT_EQ(sample_reward(failed(SampleStatus::sandbox_violation), o, 1.0), -3.0);
  EXPECT_EQ(sample_reward(failed(SampleStatus::format_error), o, 1.0), -0.5);
  EXPECT_EQ(sample_reward(failed(SampleStatus::compile_error), o, 1.0), 0.0);  // only format_error
}

TEST(Performance, ClipEdges) {
  const double m = 2;
  EXPECT_EQ(performance(correct_sample(4.0), m), 2.0);     // 2^m: log2 4 = 2 = m, at the edge
  EXPECT_EQ(performance(correct_sample(8.0), m), 2.0);     // log2 8 = 3, clipped to 2
  EXPECT_EQ(performance(correct_sample(0.25), m), -2.0);   // 2^−m: log2 = −2 = −m
  EXPECT_EQ(performance(correct_sample(0.125), m), -2.0);  // log2 = −3, clipped to −2
  EXPECT_EQ(performance(correct_sample(1.0), m), 0.0);     // as fast as the reference
  EXPECT_NEAR(performance(correct_sample(std::sqrt(2.0)), m), 0.5, 1e-15);  // inside: log2 √2 = 0.5
  EXPECT_EQ(performance(correct_sample(8.0), 3.0), 3.0);   // m = 3: 8x is no longer clipped
  EXPECT_EQ(performance(correct_sample(std::numeric_limits<double>::infinity()), m), 2.0);
  // Not timed, or a speedup no timing can give: p = 0.
  EXPECT_EQ(performance(correct_sample(std::nullopt), m), 0.0);
  EXPECT_EQ(performance(correct_sample(0.0), m), 0.0);
  EXPECT_EQ(performance(correct_sample(std::numeric_limits<double>::quiet_NaN()), m), 0.0);
  // c = 0: p = 0 whatever the speedup.
  EXPECT_EQ(performance({SampleStatus::ok, false, 4.0}, m), 0.0);
}

TEST(SampleReward, SlowCorrectKernelWithTheGateOn) {
  RewardOptions o;
  // 4x slower: p = −2, r = 1 + 1·(−2) = −1, as low as a cheat (the header's remark on λ·m).
  EXPECT_EQ(sample_reward(correct_sample(0.25), o, 1.0), -1.0);
  o.lambda_perf = 0.25;  // λ·m = 0.5 < 1: r = 1 − 0.25·2 = 0.5 > 0
  EXPECT_EQ(sample_reward(correct_sample(0.25), o, 1.0), 0.5);
}

TEST(PerformanceGate, ExactlyAtTauIsOnJustBelowIsOff) {
  RewardOptions o;  // ca_grpo, τ = 0.5
  EXPECT_TRUE(performance_gate(o, 0.5));
  EXPECT_FALSE(performance_gate(o, std::nextafter(0.5, 0.0)));
  EXPECT_FALSE(performance_gate(o, 0.0));
  EXPECT_TRUE(performance_gate(o, 1.0));
  // The gate drives the reward: 4x, p = 2. On: r = 1 + 2 = 3; off: r = c = 1.
  EXPECT_EQ(sample_reward(correct_sample(4.0), o, 0.5), 3.0);
  EXPECT_EQ(sample_reward(correct_sample(4.0), o, 0.25), 1.0);
}

TEST(PerformanceGate, UngatedAndCorrectnessOnly) {
  RewardOptions o;
  o.mode = RewardMode::ungated;
  EXPECT_TRUE(performance_gate(o, 0.0));
  EXPECT_EQ(sample_reward(correct_sample(4.0), o, 0.0), 3.0);  // r = c + λ·p = 1 + 2 at ρ = 0
  o.mode = RewardMode::correctness_only;
  EXPECT_FALSE(performance_gate(o, 1.0));
  EXPECT_EQ(sample_reward(correct_sample(4.0), o, 1.0), 1.0);  // r = c
  EXPECT_EQ(sample_reward(failed(SampleStatus::cheat_detected), o, 1.0), -1.0);  // penalties still apply
  EXPECT_EQ(sample_reward(failed(SampleStatus::infra_error), o, 1.0), std::nullopt);
}

TEST(Names, StatusesRoundTripAndUnknownIsNamed) {
  for (int i = 0; i <= static_cast<int>(SampleStatus::infra_error); ++i) {
    auto s = static_cast<SampleStatus>(i);
    auto parsed = parse_sample_status(sample_status_name(s));
    ASSERT_TRUE(parsed.ok()) << sample_status_name(s);
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_STREQ(sample_status_name(SampleStatus::cheat_detected), "cheat_detected");
  auto bad = parse_sample_status("crashed");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("'crashed'"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("sandbox_violation"), std::string::npos) << bad.status().message();
}

TEST(Names, ModesRoundTripAndUnknownIsNamed) {
  for (RewardMode m : {RewardMode::ca_grpo, RewardMode::ungated, RewardMode::correctness_only})
    EXPECT_EQ(*parse_reward_mode(reward_mode_name(m)), m);
  EXPECT_STREQ(reward_mode_name(RewardMode::correctness_only), "correctness_only");
  auto bad = parse_reward_mode("gated");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown reward mode 'gated' (ca_grpo, ungated, correctness_only)");
}

TEST(RewardOptions, DefaultsAndValidate) {
  RewardOptions o;
  EXPECT_EQ(o.mode, RewardMode::ca_grpo);
  EXPECT_EQ(o.lambda_perf, 1.0);
  EXPECT_EQ(o.perf_clip, 2.0);
  EXPECT_EQ(o.gate_tau, 0.5);
  EXPECT_EQ(o.gate_ema, 0.0);
  EXPECT_EQ(o.penalty_cheat, -1.0);
  EXPECT_EQ(o.penalty_format, 0.0);
  EXPECT_EQ(o.epsilon, 1e-6);
  EXPECT_TRUE(o.scale_by_std);
  EXPECT_TRUE(o.validate().is_ok());

  auto fails_on = [](const char* field, auto set) {
    RewardOptions bad;
    set(bad);
    Status s = bad.validate();
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  fails_on("lambda_perf", [](RewardOptions& x) { x.lambda_perf = -0.1; });
  fails_on("perf_clip", [](RewardOptions& x) { x.perf_clip = 0; });
  fails_on("gate_tau", [](RewardOptions& x) { x.gate_tau = 1.5; });
  fails_on("gate_tau", [](RewardOptions& x) { x.gate_tau = std::numeric_limits<double>::quiet_NaN(); });
  fails_on("gate_ema", [](RewardOptions& x) { x.gate_ema = -0.5; });
  fails_on("penalty_cheat", [](RewardOptions& x) { x.penalty_cheat = 1; });
  fails_on("penalty_format", [](RewardOptions& x) { x.penalty_format = 0.1; });
  fails_on("epsilon", [](RewardOptions& x) { x.epsilon = 0; });
}

}  // namespace
}  // namespace kz::rl
