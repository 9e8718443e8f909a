// The Proposer's reward: invalid modules, the frontier term, clusters by signature and by token
// similarity (transitively), the repetition penalty and a batch of one. Numbers worked by hand.
// Defaults unless a test says otherwise: similarity_threshold = 0.8, repetition_weight β = 0.5.
#include <gtest/gtest.h>

#include <cmath>

#include "kz/rl/proposer_reward.h"

namespace kz::rl {
namespace {

// Token sets (10 tokens each): {y, =, torch, ., relu, (, x, ), +, 1} and the same with 2 for 1:
// 9 shared of 11 in all, Jaccard 9/11 ≈ 0.82 >= 0.8.
const char* kRelu1 = "y = torch.relu(x) + 1";
const char* kRelu2 = "y = torch.relu(x) + 2";
// {y, =, torch, ., relu, (, x, ), *, 3}: 8 shared of 12 with either above, 8/12 ≈ 0.67 < 0.8.
const char* kReluTimes3 = "y = torch.relu(x) * 3";
// Unlike every source above and each other (Jaccard at most 5/15 = 1/3 for any pair).
const char* kMatmul = "out = torch.matmul(a, b)";
const char* kGelu = "return F.gelu(inp)";
const char* kSum = "s = v.sum(dim=1, keepdim=True)";

ProposedModule valid(double pass_rate, std::string signature, std::string source) {
  return {true, pass_rate, std::move(signature), std::move(source)};
}

std::vector<ProposerReward> rewards_of(const std::vector<ProposedModule>& modules,
                                       const ProposerRewardOptions& options = {}) {
  auto r = proposer_rewards(modules, options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<ProposerReward>{};
}

TEST(SourceTokens, IdentifiersNumbersAndPunctuation) {
  std::set<std::string> want = {"out", "=", "F", ".", "conv2d", "(", "x", ",", "w_1", ")", "*",
                                "0.5", "+", "1e", "-", "3"};
  EXPECT_EQ(source_tokens("out = F.conv2d(x, w_1)*0.5 + 1e-3"), want);
  EXPECT_EQ(source_tokens("a  a\n\ta"), (std::set<std::string>{"a"}));  // a set: repeats count once
  EXPECT_TRUE(source_tokens(" \n").empty());
}

TEST(Jaccard, HandCountedSets) {
  EXPECT_DOUBLE_EQ(jaccard(source_tokens(kRelu1), source_tokens(kRelu2)), 9.0 / 11);
  EXPECT_DOUBLE_EQ(jaccard(source_tokens(kRelu1), source_tokens(kReluTimes3)), 8.0 / 12);
  EXPECT_EQ(jaccard(source_tokens("a b c d"), source_tokens("a b c d e")), 0.8);  // 4/5
  EXPECT_EQ(jaccard({}, {}), 1.0);
  EXPECT_EQ(jaccard({"a"}, {}), 0.0);
}

TEST(FrontierReward, PassRates) {
  EXPECT_EQ(frontier_reward(0.0), 0.0);   // 1 − 2·0.5: the Coder never solves it
  EXPECT_EQ(frontier_reward(0.5), 1.0);   // 1 − 2·0: the frontier itself
  EXPECT_EQ(frontier_reward(1.0), 0.0);   // 1 − 2·0.5: always solved
  EXPECT_EQ(frontier_reward(0.25), 0.5);  // 1 − 2·0.25
  EXPECT_EQ(frontier_reward(0.75), 0.5);
}

TEST(ProposerRewards, InvalidIsMinusOneAndOutsideTheBatch) {
  // The invalid module shares the valid one's signature, yet neither joins it nor counts in n:
  // n = 1, so the valid module's penalty is 0 and R = 1 − 2·|0.5 − 0.5| = 1.
  auto r = rewards_of({{false, 0.5, "relu[8]", kRelu1}, valid(0.5, "relu[8]", kRelu1)});
  EXPECT_EQ(r[0].reward, -1.0);
  EXPECT_EQ(r[0].cluster, std::nullopt);
  EXPECT_EQ(r[1].reward, 1.0);
  EXPECT_EQ(r[1].cluster, 0);
}

TEST(ProposerRewards, DistinctModulesGetTheFrontierTermAlone) {
  auto r = rewards_of({valid(0, "a", kMatmul), valid(0.5, "b", kGelu), valid(1, "c", kSum), valid(0.25, "d", kRelu1)});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].reward, 0.0);
  EXPECT_EQ(r[1].reward, 1.0);
  EXPECT_EQ(r[2].reward, 0.0);
  EXPECT_EQ(r[3].reward, 0.5);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r[i].cluster, i);  // four clusters of one, numbered in batch order
    EXPECT_EQ(r[i].repetition_penalty, 0.0);
  }
}

TEST(ProposerRewards, ClustersBySignature) {
  // Sources unlike each other, signatures A = B: n = 3, cluster {A, B} of size 2.
  // A, B: penalty 0.5·(2 − 1)/(3 − 1) = 0.25, R = 1 − 0.25 = 0.75. C: alone, R = 1.
  auto r = rewards_of({valid(0.5, "relu[8x8]", kMatmul), valid(0.5, "relu[8x8]", kGelu), valid(0.5, "gelu[4]", kSum)});
  EXPECT_EQ(r[0].cluster, 0);
  EXPECT_EQ(r[1].cluster, 0);
  EXPECT_EQ(r[2].cluster, 1);
  EXPECT_DOUBLE_EQ(r[0].repetition_penalty, 0.25);
  EXPECT_DOUBLE_EQ(r[0].reward, 0.75);
  EXPECT_DOUBLE_EQ(r[1].reward, 0.75);
  EXPECT_EQ(r[2].reward, 1.0);
  // Empty signatures are unknown, never equal: two clusters, no penalty.
  auto unsigned_modules = rewards_of({valid(0.5, "", kMatmul), valid(0.5, "", kGelu)});
  EXPECT_EQ(unsigned_modules[0].cluster, 0);
  EXPECT_EQ(unsigned_modules[1].cluster, 1);
  EXPECT_EQ(unsigned_modules[1].reward, 1.0);
}

TEST(ProposerRewards, ClustersBySimilarity) {
  // Signatures all differ. Relu1 ~ Relu2 (9/11 >= 0.8); ReluTimes3 is 8/12 from both: n = 3,
  // cluster {Relu1, Relu2}: penalty 0.5·1/2 = 0.25, R = 0.75; ReluTimes3 alone, R = 1.
  auto r = rewards_of({valid(0.5, "s1", kRelu1), valid(0.5, "s2", kReluTimes3), valid(0.5, "s3", kRelu2)});
  EXPECT_EQ(r[0].cluster, 0);
  EXPECT_EQ(r[1].cluster, 1);
  EXPECT_EQ(r[2].cluster, 0);
  EXPECT_DOUBLE_EQ(r[0].reward, 0.75);
  EXPECT_EQ(r[1].reward, 1.0);
  EXPECT_DOUBLE_EQ(r[2].reward, 0.75);
  // The threshold is inclusive: 4/5 = 0.8 joins at 0.8 (β·1/1 = 0.5 each), not just above it.
  std::vector<ProposedModule> pair = {valid(0.5, "x", "a b c d"), valid(0.5, "y", "a b c d e")};
  EXPECT_EQ(rewards_of(pair)[0].reward, 0.5);
  ProposerRewardOptions strict;
  strict.similarity_threshold = std::nextafter(0.8, 1.0);
  EXPECT_EQ(rewards_of(pair, strict)[0].reward, 1.0);
}

TEST(ProposerRewards, ClustersAreTransitive) {
  // A ~ B by signature, A ~ C by similarity (B and C alike only 5/15): {A, B, C} is one cluster of
  // 3 in n = 4; penalty 0.5·2/3 = 1/3, R = 1 − 1/3 = 2/3 for each; D alone, R = 1.
  auto r = rewards_of({valid(0.5, "relu[8]", kRelu1), valid(0.5, "relu[8]", kMatmul), valid(0.5, "other", kRelu2),
                       valid(0.5, "gelu[4]", kGelu)});
  EXPECT_EQ(r[0].cluster, 0);
  EXPECT_EQ(r[1].cluster, 0);
  EXPECT_EQ(r[2].cluster, 0);
  EXPECT_EQ(r[3].cluster, 1);
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(r[i].reward, 2.0 / 3) << i;
  EXPECT_EQ(r[3].reward, 1.0);
  // A batch that is one cluster pays β in full: 0.25 with β = 0.25 (p̂ = 0.5: R = 1 − 0.25).
  ProposerRewardOptions light;
  light.repetition_weight = 0.25;
  auto one = rewards_of({valid(0.5, "s", kMatmul), valid(0.5, "s", kGelu), valid(0.5, "s", kSum)}, light);
  for (const auto& m : one) EXPECT_DOUBLE_EQ(m.reward, 0.75);
}

TEST(ProposerRewards, BatchOfOne) {
  auto r = rewards_of({valid(0.25, "relu[8]", kRelu1)});  // n = 1: no penalty, R = 1 − 2·0.25
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].reward, 0.5);
  EXPECT_EQ(r[0].repetition_penalty, 0.0);
  EXPECT_EQ(r[0].cluster, 0);
  EXPECT_TRUE(rewards_of({}).empty());
}

TEST(ProposerRewards, BadInputs) {
  auto bad_rate = proposer_rewards({valid(0.5, "a", kRelu1), valid(1.5, "b", kGelu)}, {});
  ASSERT_FALSE(bad_rate.ok());
  EXPECT_EQ(bad_rate.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad_rate.status().message().find("module 1"), std::string::npos) << bad_rate.status().message();
  // An invalid module's pass rate is never read.
  EXPECT_TRUE(proposer_rewards({{false, 7.0, "", ""}}, {}).ok());

  ProposerRewardOptions options;
  EXPECT_EQ(options.similarity_threshold, 0.8);
  EXPECT_EQ(options.repetition_weight, 0.5);
  EXPECT_TRUE(options.validate().is_ok());
  options.similarity_threshold = 0;
  EXPECT_NE(options.validate().message().find("similarity_threshold"), std::string::npos);
  EXPECT_FALSE(proposer_rewards({}, options).ok());
  options = {};
  options.repetition_weight = -1;
  EXPECT_NE(options.validate().message().find("repetition_weight"), std::string::npos);
}

}  // namespace
}  // namespace kz::rl
