// CA-GRPO groups: ρ and the gate, std and no-std advantages, zero variance, dropped samples, the
// EMA across visits, GateMemory's JSON and the batch summary. Numbers worked by hand in comments.
// Defaults unless a test says otherwise: ca_grpo, λ = 1, m = 2, τ = 0.5, ε = 1e-6, std on.
#include <gtest/gtest.h>

#include <cmath>

#include "kz/rl/advantage.h"

namespace kz::rl {
namespace {

SampleVerdict fast(double speedup) { return {SampleStatus::ok, true, speedup}; }
SampleVerdict wrong() { return {SampleStatus::incorrect, false, std::nullopt}; }
SampleVerdict broken() { return {SampleStatus::compile_error, false, std::nullopt}; }
SampleVerdict infra() { return {SampleStatus::infra_error, false, std::nullopt}; }
SampleVerdict cheat() { return {SampleStatus::cheat_detected, true, 50.0}; }

using Values = std::vector<std::optional<double>>;

void expect_values_near(const Values& got, const Values& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].has_value(), want[i].has_value()) << "sample " << i;
    if (want[i]) {
      EXPECT_NEAR(*got[i], *want[i], 1e-12) << "sample " << i;
    }
  }
}

// 2x, 1x, incorrect, compile error: ρ = 2/4 = 0.5 = τ, so the gate is on.
//   r = [1 + log2 2, 1 + log2 1, 0, 0] = [2, 1, 0, 0], mean = 3/4 = 0.75
//   r − mean = [1.25, 0.25, −0.75, −0.75]
//   std = sqrt((1.5625 + 0.0625 + 0.5625 + 0.5625)/4) = sqrt(0.6875) ≈ 0.8291562
//   A = (r − mean)/(std + 1e-6) ≈ [1.5075549, 0.3015110, −0.9045329, −0.9045329]
const std::vector<SampleVerdict> kMixed = {fast(2.0), fast(1.0), wrong(), broken()};

TEST(ComputeGroup, StdNormalisedWithTheGateExactlyAtTau) {
  GroupResult g = compute_group(kMixed, RewardOptions{}, std::nullopt);
  EXPECT_EQ(g.rho, 0.5);
  EXPECT_TRUE(g.gate_on);
  EXPECT_EQ(g.kept, 4);
  EXPECT_EQ(g.correct, 2);
  EXPECT_EQ(g.dropped, 0);
  EXPECT_FALSE(g.zero_variance);
  expect_values_near(g.rewards, {2.0, 1.0, 0.0, 0.0});
  double d = std::sqrt(0.6875) + 1e-6;
  expect_values_near(g.advantages, {1.25 / d, 0.25 / d, -0.75 / d, -0.75 / d});
  EXPECT_NEAR(*g.advantages[0], 1.5075549, 1e-7);
  EXPECT_NEAR(*g.advantages[2], -0.9045329, 1e-7);
}

TEST(ComputeGroup, GateJustAboveTheRateIsOff) {
  RewardOptions o;
  o.gate_tau = std::nextafter(0.5, 1.0);  // ρ = 0.5 is now just below τ
  GroupResult g = compute_group(kMixed, o, std::nullopt);
  EXPECT_FALSE(g.gate_on);
  // r = c = [1, 1, 0, 0]: the 2x sample no longer stands out. mean 0.5, std 0.5, A = ±0.5/(0.5 + ε).
  expect_values_near(g.rewards, {1.0, 1.0, 0.0, 0.0});
  expect_values_near(g.advantages, {0.5 / 0.500001, 0.5 / 0.500001, -0.5 / 0.500001, -0.5 / 0.500001});
}

TEST(ComputeGroup, NoStd) {
  RewardOptions o;
  o.scale_by_std = false;
  GroupResult g = compute_group(kMixed, o, std::nullopt);
  expect_values_near(g.advantages, {1.25, 0.25, -0.75, -0.75});  // A = r − mean, mean = 0.75
}

// 4x, incorrect, incorrect, cheat: ρ = 1/4 < τ.
TEST(ComputeGroup, ModesOnALowReliabilityGroup) {
  const std::vector<SampleVerdict> group = {fast(4.0), wrong(), wrong(), cheat()};
  RewardOptions o;
  GroupResult gated = compute_group(group, o, std::nullopt);
  EXPECT_FALSE(gated.gate_on);
  expect_values_near(gated.rewards, {1.0, 0.0, 0.0, -1.0});  // ca_grpo, gate off: r = c
  o.mode = RewardMode::ungated;
  GroupResult ungated = compute_group(group, o, std::nullopt);
  EXPECT_TRUE(ungated.gate_on);
  expect_values_near(ungated.rewards, {3.0, 0.0, 0.0, -1.0});  // 1 + 1·log2 4 = 3
  o.mode = RewardMode::correctness_only;
  GroupResult plain = compute_group(kMixed, o, std::nullopt);  // ρ = 0.5 would open the gate
  EXPECT_FALSE(plain.gate_on);
  expect_values_near(plain.rewards, {1.0, 1.0, 0.0, 0.0});
}

TEST(ComputeGroup, ZeroVarianceGroupsContributeNothing) {
  RewardOptions o;
  for (const auto& group : {std::vector<SampleVerdict>{wrong(), broken(), wrong()},  // r = 0, 0, 0
                            std::vector<SampleVerdict>{fast(2.0), fast(2.0)},        // r = 2, 2 (ρ = 1)
                            std::vector<SampleVerdict>{fast(1.5)}}) {                // one kept sample
    GroupResult g = compute_group(group, o, std::nullopt);
    EXPECT_TRUE(g.zero_variance);
    for (const auto& a : g.advantages) EXPECT_EQ(a, 0.0);
  }
  // 0.1 three times: the computed mean (0.1 + 0.1 + 0.1)/3 is not exactly 0.1, yet A is exactly 0.
  o.penalty_format = -0.1;
  SampleVerdict format_error{SampleStatus::format_error, false, std::nullopt};
  GroupResult g = compute_group({format_error, format_error, format_error}, o, std::nullopt);
  EXPECT_TRUE(g.zero_variance);
  for (const auto& a : g.advantages) EXPECT_EQ(a, 0.0);
  o.scale_by_std = false;
  EXPECT_EQ(compute_group({format_error, format_error, format_error}, o, std::nullopt).advantages[0], 0.0);
}

TEST(ComputeGroup, InfraErrorsAreDroppedAndCounted) {
  // 2x, infra_error, incorrect: K = {0, 2}, ρ = 1/2 (gate on), r = [2, −, 0], mean 1, std 1,
  // A = [1/(1 + ε), −, −1/(1 + ε)]. Counting the infra_error as a 0 would give ρ = 1/3 (gate off).
  GroupResult g = compute_group({fast(2.0), infra(), wrong()}, RewardOptions{}, std::nullopt);
  EXPECT_EQ(g.kept, 2);
  EXPECT_EQ(g.dropped, 1);
  EXPECT_EQ(g.rho, 0.5);
  EXPECT_TRUE(g.gate_on);
  expect_values_near(g.rewards, {2.0, std::nullopt, 0.0});
  expect_values_near(g.advantages, {1 / 1.000001, std::nullopt, -1 / 1.000001});
}

TEST(ComputeGroup, OnlyInfraErrors) {
  GroupResult g = compute_group({infra(), infra(), infra()}, RewardOptions{}, std::nullopt);
  EXPECT_EQ(g.kept, 0);
  EXPECT_EQ(g.dropped, 3);
  EXPECT_EQ(g.rho, std::nullopt);
  EXPECT_FALSE(g.gate_on);
  EXPECT_FALSE(g.zero_variance);
  expect_values_near(g.rewards, {std::nullopt, std::nullopt, std::nullopt});
  expect_values_near(g.advantages, {std::nullopt, std::nullopt, std::nullopt});
  // With the EMA on, the previous ρ stands (no new evidence).
  RewardOptions ema;
  ema.gate_ema = 0.5;
  EXPECT_EQ(compute_group({infra()}, ema, 0.75).rho, 0.75);
}

// Visit 1: 2x, incorrect ×3 → rate 1/4; visit 2: 2x ×3, incorrect → rate 3/4.
const std::vector<SampleVerdict> kVisit1 = {fast(2.0), wrong(), wrong(), wrong()};
const std::vector<SampleVerdict> kVisit2 = {fast(2.0), fast(2.0), fast(2.0), wrong()};

TEST(GateMemory, EmaAcrossTwoVisits) {
  RewardOptions o;
  o.gate_ema = 0.5;
  GateMemory memory;
  EXPECT_EQ(memory.rho("t"), std::nullopt);
  // Visit 1: no previous ρ, so ρ = rate = 0.25 < τ: gate off, r = c = [1, 0, 0, 0].
  GroupResult first = memory.visit("t", kVisit1, o);
  EXPECT_EQ(first.rho, 0.25);
  EXPECT_FALSE(first.gate_on);
  expect_values_near(first.rewards, {1.0, 0.0, 0.0, 0.0});
  // Visit 2: ρ = (1 − 0.5)·0.25 + 0.5·0.75 = 0.125 + 0.375 = 0.5 = τ: gate on, r = [2, 2, 2, 0].
  GroupResult second = memory.visit("t", kVisit2, o);
  EXPECT_EQ(second.rho, 0.5);
  EXPECT_TRUE(second.gate_on);
  expect_values_near(second.rewards, {2.0, 2.0, 2.0, 0.0});
  EXPECT_EQ(memory.rho("t"), 0.5);
  EXPECT_EQ(memory.rho("other"), std::nullopt);  // tasks are kept apart
}

TEST(GateMemory, EmaWeightDecidesTheGate) {
  RewardOptions o;
  o.gate_ema = 0.25;
  GateMemory memory;
  memory.visit("t", kVisit1, o);
  // ρ = 0.75·0.25 + 0.25·0.75 = 0.1875 + 0.1875 = 0.375 < τ: gate off, r = c = [1, 1, 1, 0].
  GroupResult second = memory.visit("t", kVisit2, o);
  EXPECT_EQ(second.rho, 0.375);
  EXPECT_FALSE(second.gate_on);
  expect_values_near(second.rewards, {1.0, 1.0, 1.0, 0.0});
  // gate_ema = 0: the previous ρ is ignored, ρ = this group's 0.75.
  EXPECT_EQ(compute_group(kVisit2, RewardOptions{}, 0.0).rho, 0.75);
}

TEST(GateMemory, JsonRoundTrip) {
  RewardOptions o;
  o.gate_ema = 0.5;
  GateMemory memory;
  memory.visit("level1/03_gelu", kVisit1, o);  // ρ = 0.25
  memory.visit("level2/11_fused", kVisit2, o);  // ρ = 0.75
  nlohmann::json j = memory.to_json();
  EXPECT_EQ(j, nlohmann::json::parse(R"({"level1/03_gelu": 0.25, "level2/11_fused": 0.75})"));
  auto restored = GateMemory::from_json(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(restored.ok()) << restored.status().to_string();
  EXPECT_EQ(restored->size(), 2u);
  EXPECT_EQ(restored->rho("level1/03_gelu"), 0.25);
  // The restored memory carries the EMA on: 0.5·0.25 + 0.5·0.75 = 0.5.
  EXPECT_EQ(restored->visit("level1/03_gelu", kVisit2, o).rho, 0.5);
}

TEST(GateMemory, FromJsonRejectsBadInput) {
  auto not_object = GateMemory::from_json(nlohmann::json::array({0.5}));
  ASSERT_FALSE(not_object.ok());
  EXPECT_EQ(not_object.status().code(), StatusCode::parse_error);
  auto out_of_range = GateMemory::from_json(nlohmann::json{{"a", 0.5}, {"b", 1.5}});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("'b'"), std::string::npos) << out_of_range.status().message();
  EXPECT_FALSE(GateMemory::from_json(nlohmann::json{{"a", "0.5"}}).ok());
}

TEST(Summarize, ABatchOfThreeGroups) {
  RewardOptions o;
  std::vector<GroupResult> groups = {
      compute_group(kMixed, o, std::nullopt),                     // r = [2, 1, 0, 0], 2 correct, gate on
      compute_group({wrong(), wrong(), infra()}, o, std::nullopt),  // r = [0, 0, −], zero variance, gate off
      compute_group({infra(), infra()}, o, std::nullopt),           // empty
  };
  BatchSummary s = summarize(groups);
  EXPECT_EQ(s.groups, 3);
  EXPECT_EQ(s.empty_groups, 1);
  EXPECT_EQ(s.kept, 6);
  EXPECT_EQ(s.dropped, 3);
  EXPECT_EQ(s.zero_variance_groups, 1);
  EXPECT_DOUBLE_EQ(s.reward_mean, 3.0 / 6);   // (2 + 1 + 0 + 0 + 0 + 0) / 6 kept samples
  EXPECT_DOUBLE_EQ(s.correct_rate, 2.0 / 6);
  EXPECT_DOUBLE_EQ(s.gate_on_share, 0.5);     // 1 of the 2 non-empty groups
  nlohmann::json j = to_json(s);
  EXPECT_EQ(j["dropped"], 3);
  EXPECT_EQ(j["zero_variance_groups"], 1);
  EXPECT_DOUBLE_EQ(j["gate_on_share"].get<double>(), 0.5);
  BatchSummary none = summarize({});
  EXPECT_EQ(none.groups, 0);
  EXPECT_EQ(none.reward_mean, 0.0);
}

TEST(NormalizeGroup, ByHandWithADroppedReward) {
  // Kept {1, 0, 1}: mean 2/3, population std sqrt(2/9) = 0.47140.
  bool zero = true;
  Values a = normalize_group({1.0, 0.0, std::nullopt, 1.0}, 1e-6, true, &zero);
  EXPECT_FALSE(zero);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_NEAR(*a[0], (1 - 2.0 / 3) / (std::sqrt(2.0 / 9) + 1e-6), 1e-12);  //  0.70711
  EXPECT_NEAR(*a[1], (0 - 2.0 / 3) / (std::sqrt(2.0 / 9) + 1e-6), 1e-12);  // -1.41421
  EXPECT_FALSE(a[2].has_value());
  Values plain = normalize_group({1.0, 0.0, std::nullopt, 1.0}, 1e-6, false);
  EXPECT_NEAR(*plain[0], 1.0 / 3, 1e-12);
  EXPECT_NEAR(*plain[1], -2.0 / 3, 1e-12);
  // Equal kept rewards: exactly 0 and flagged; nothing kept: no advantages and not flagged.
  Values equal = normalize_group({-1.0, std::nullopt, -1.0}, 1e-6, true, &zero);
  EXPECT_TRUE(zero);
  EXPECT_EQ(*equal[0], 0.0);
  EXPECT_EQ(*equal[2], 0.0);
  Values none = normalize_group({std::nullopt, std::nullopt}, 1e-6, true, &zero);
  EXPECT_FALSE(zero);
  EXPECT_FALSE(none[0].has_value() || none[1].has_value());
}

}  // namespace
}  // namespace kz::rl
