// Near-duplicate detection for proposed modules.
//
// A Proposer sampled n times on the same APIs often writes the same module twice with other
// variable names, comments or sizes. Two signals catch that:
//  - the validation fingerprint (same ATen op multiset and output shapes): the same computation;
//  - the source's shape: comments and docstrings stripped, string and number literals and every
//    identifier that is not a PyTorch API (torch.*, nn.*, F.*, tensor methods) or a Python/KernelBench
//    keyword replaced by placeholders numbered by first appearance, then token 5-gram shingles
//    compared by exact Jaccard similarity (sets are small: a module is a few hundred tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kz {

// The normalised token stream of a Python source (see above). `x = F.gelu(y)  # act` and
// `out = F.gelu(inp)` give the same tokens: v0 = F . gelu ( v1 ).
std::vector<std::string> normalize_source_tokens(const std::string& source);

// Hashes of every run of `n` consecutive tokens (one shingle for shorter streams).
std::set<uint64_t> shingles(const std::vector<std::string>& tokens, size_t n = 5);

// |a ∩ b| / |a ∪ b|; 1 for two empty sets.
double jaccard(const std::set<uint64_t>& a, const std::set<uint64_t>& b);

struct DuplicateMatch {
  std::string id;           // the kept module it duplicates
  double similarity = 0;    // shingle Jaccard similarity (1 for a fingerprint match)
  bool same_fingerprint = false;
};

class NearDuplicateIndex {
 public:
  explicit NearDuplicateIndex(double threshold = 0.8) : threshold_(threshold) {}

  // The most similar kept module this one duplicates: equal non-empty fingerprint, or shingle
  // similarity >= threshold. nullopt: new.
  std::optional<DuplicateMatch> match(const std::string& source, const std::string& fingerprint) const;
  // The id of the kept module `source` duplicates, if any.
  std::optional<std::string> find_duplicate(const std::string& source, const std::string& fingerprint) const;
  // Records a kept module.
  void add(std::string id, const std::string& source, std::string fingerprint);

  size_t size() const { return entries_.size(); }
  double threshold() const { return threshold_; }

 private:
  struct Entry {
    std::string id;
    std::string fingerprint;
    std::set<uint64_t> shingles;
  };
  double threshold_;
  std::vector<Entry> entries_;
};

}  // namespace kz
