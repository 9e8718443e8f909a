// The Proposer's reward for each module of one batch: the Coder's frontier, less repetition.
//
//   invalid module:  R = −1
//   valid module:    R = 1 − 2·|p̂ − 0.5| − β·(s − 1)/(n − 1)      (the last term is 0 when n = 1)
//
// p̂ = the Coder's pass rate over its m attempts at the module: the frontier term is 1 at p̂ = 0.5
// and 0 at p̂ = 0 or 1. n = the batch's valid modules, s = the size of the module's cluster among
// them, β = repetition_weight: the penalty is the module's cluster share, 0 for a module alone in
// its cluster and β when every valid module of the batch is in one cluster.
//
// Clusters: union-find over the valid modules (invalid ones are neither clustered nor counted in
// n), joining two modules when
//   - their signatures are equal and non-empty (the signature is the caller's, e.g. the multiset
//     of ATen ops plus the input shapes), or
//   - the Jaccard similarity |T_a ∩ T_b| / |T_a ∪ T_b| of their sources' token sets is
//     >= similarity_threshold (tokens: source_tokens).
// Joining is transitive: a ~ b and b ~ c put a and c in one cluster.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/status.h"

namespace kz::rl {

struct ProposedModule {
  bool valid = false;     // passed module validation
  double pass_rate = 0;   // p̂ in [0, 1] (valid modules; ignored for invalid ones)
  std::string signature;  // equal non-empty signatures cluster together; empty: never by signature
  std::string source;     // the module's Python source
};

struct ProposerRewardOptions {
  double similarity_threshold = 0.8;  // token-set Jaccard similarity that joins two sources; (0, 1]
  double repetition_weight = 0.5;     // β: the penalty of a batch made of one cluster; >= 0
  // invalid_argument naming the field out of range.
  Status validate() const;
};

struct ProposerReward {
  double reward = 0;               // R
  std::optional<int> cluster;      // 0, 1, ... by first appearance in the batch; nullopt: invalid
  double repetition_penalty = 0;   // β·(s − 1)/(n − 1), already subtracted from R
};

// The set of a source's tokens: identifiers ([A-Za-z_][A-Za-z0-9_]*), numbers (a digit, then
// letters, digits, '_' and '.': "1e", "0.5"), and each other non-space character on its own.
std::set<std::string> source_tokens(std::string_view source);

// |a ∩ b| / |a ∪ b|; 1 for two empty sets.
double jaccard(const std::set<std::string>& a, const std::set<std::string>& b);

// 1 − 2·|p̂ − 0.5|.
double frontier_reward(double pass_rate);

// One reward per module, in input order. invalid_argument for options that fail validate() or a
// valid module whose pass rate is outside [0, 1] (naming its index).
Result<std::vector<ProposerReward>> proposer_rewards(const std::vector<ProposedModule>& modules,
                                                     const ProposerRewardOptions& options);

}  // namespace kz::rl
