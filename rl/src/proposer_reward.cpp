// The Proposer's reward (proposer_reward.h): tokens, similarity, clusters and the reward itself.
#include "kz/rl/proposer_reward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <numeric>

namespace kz::rl {
namespace {

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Union-find with path halving; batches are small, so no union by rank.
class DisjointSets {
 public:
  explicit DisjointSets(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), size_t{0}); }
  size_t find(size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void join(size_t a, size_t b) { parent_[find(a)] = find(b); }

 private:
  std::vector<size_t> parent_;
};

bool same_cluster(const ProposedModule& a, const std::set<std::string>& tokens_a, const ProposedModule& b,
                  const std::set<std::string>& tokens_b, double threshold) {
  if (!a.signature.empty() && a.signature == b.signature) return true;
  return jaccard(tokens_a, tokens_b) >= threshold;
}

// The cluster of each of the `valid` modules, numbered by first appearance.
std::vector<int> cluster_ids(const std::vector<const ProposedModule*>& valid, double threshold) {
  std::vector<std::set<std::string>> tokens;
  for (const auto* m : valid) tokens.push_back(source_tokens(m->source));
  DisjointSets sets(valid.size());
  for (size_t i = 0; i < valid.size(); ++i)
    for (size_t j = i + 1; j < valid.size(); ++j)
      if (same_cluster(*valid[i], tokens[i], *valid[j], tokens[j], threshold)) sets.join(i, j);
  std::vector<int> ids(valid.size());
  std::vector<int> id_of_root(valid.size(), -1);
  int next = 0;
  for (size_t i = 0; i < valid.size(); ++i) {
    int& id = id_of_root[sets.find(i)];
    if (id < 0) id = next++;
    ids[i] = id;
  }
  return ids;
}

Status check_inputs(const std::vector<ProposedModule>& modules, const ProposerRewardOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  for (size_t i = 0; i < modules.size(); ++i)
    if (modules[i].valid && !(modules[i].pass_rate >= 0 && modules[i].pass_rate <= 1))
      return invalid_argument(fmt::format("proposer reward: module {}: pass rate {} is not in [0, 1]", i, modules[i].pass_rate));
  return Status::ok();
}

}  // namespace

Status ProposerRewardOptions::validate() const {
  if (!(similarity_threshold > 0 && similarity_threshold <= 1))
    return invalid_argument(fmt::format("proposer reward options: similarity_threshold {} must be in (0, 1]", similarity_threshold));
  if (!(repetition_weight >= 0 && std::isfinite(repetition_weight)))
    return invalid_argument(fmt::format("proposer reward options: repetition_weight {} must be >= 0", repetition_weight));
  return Status::ok();
}

std::set<std::string> source_tokens(std::string_view source) {
  std::set<std::string> tokens;
  size_t i = 0;
  while (i < source.size()) {
    char c = source[i];
    size_t end = i + 1;
    if (std::isspace(static_cast<unsigned char>(c))) {
      i = end;
      continue;
    }
    bool number = std::isdigit(static_cast<unsigned char>(c));
    if (number || is_word_char(c))  // a number also takes '.': "0.5" is one token
      while (end < source.size() && (is_word_char(source[end]) || (number && source[end] == '.'))) ++end;
    tokens.emplace(source.substr(i, end - i));
    i = end;
  }
  return tokens;
}

double jaccard(const std::set<std::string>& a, const std::set<std::string>& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<std::string> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  double inter = static_cast<double>(common.size());
  return inter / (static_cast<double>(a.size() + b.size()) - inter);
}

double frontier_reward(double pass_rate) { return 1.0 - 2.0 * std::abs(pass_rate - 0.5); }

Result<std::vector<ProposerReward>> proposer_rewards(const std::vector<ProposedModule>& modules,
                                                     const ProposerRewardOptions& options) {
  KZ_RETURN_IF_ERROR(check_inputs(modules, options));
  std::vector<const ProposedModule*> valid;
  for (const auto& m : modules)
    if (m.valid) valid.push_back(&m);
  std::vector<int> ids = cluster_ids(valid, options.similarity_threshold);
  std::vector<int> cluster_size(valid.size(), 0);
  for (int id : ids) ++cluster_size[id];

  std::vector<ProposerReward> rewards(modules.size(), ProposerReward{-1.0, std::nullopt, 0.0});
  double n = static_cast<double>(valid.size());
  for (size_t i = 0, v = 0; i < modules.size(); ++i) {
    if (!modules[i].valid) continue;
    ProposerReward& r = rewards[i];
    r.cluster = ids[v++];
    r.repetition_penalty = n > 1 ? options.repetition_weight * (cluster_size[*r.cluster] - 1) / (n - 1) : 0.0;
    r.reward = frontier_reward(modules[i].pass_rate) - r.repetition_penalty;
  }
  return rewards;
}

}  // namespace kz::rl
