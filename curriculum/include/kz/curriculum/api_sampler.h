// The API-set sampler: which PyTorch APIs the Proposer is asked to build its next module from.
//
// One set: its size k is uniform in [min_set_size, max_set_size] (capped by the catalogue), then
// k distinct APIs are drawn one at a time, each from the APIs not yet in the set:
//   - with probability exploration_share, uniformly (exploration: every API keeps being tried);
//   - otherwise with probability proportional to the API's weakness weight
//       w(api) = (1 − mean(api))^weakness_weight,
//     mean(api) the posterior mean of the Coder's success on it (api_stats.h). With the default
//     weakness_weight 1, an API the Coder failed 20 times of 20 (mean 1/22) weighs 21 times one it
//     solved 20 times of 20; 0 samples uniformly. The Beta prior keeps every mean inside (0, 1),
//     so no API's weight reaches 0.
//
// Why weights and not Thompson sampling (one Beta draw per API and set): the weight's exponent is
// one knob with a closed-form selection probability that docs and tests can state; exploration
// already has its own share, which is what Thompson's randomness would add; and a Beta draw needs
// gamma variates, which std::gamma_distribution does not make reproducible across standard
// libraries.
//
// Deterministic: the draws depend only on the seed, the catalogue (in order), the options, the
// statistics given to draw() and the sets drawn before. The RNG is std::mt19937_64 with the
// distributions written in the source (libstdc++'s are implementation-defined), so its state is
// (seed, engine outputs taken): to_json saves it and from_json restores it, and a run killed and
// resumed from its checkpoint draws the same sets as one never killed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"
#include "kz/curriculum/api_stats.h"
#include "kz/curriculum/random.h"
#include "kz/task/catalogue.h"

namespace kz::curriculum {

struct ApiSamplerOptions {
  size_t min_set_size = 2;         // fewest APIs in a set, >= 1; the catalogue must hold at least this many
  size_t max_set_size = 4;         // most APIs in a set, >= min_set_size; capped by the catalogue's size
  double weakness_weight = 1.0;    // exponent w >= 0 of (1 − mean): larger prefers failed APIs more; 0: uniform
  double exploration_share = 0.2;  // in [0, 1]: the share of draws that are uniform over the catalogue
  uint64_t seed = 0;               // the RNG's seed
  // invalid_argument naming the field out of range.
  Status validate() const;
};

// One drawn set, in draw order.
struct ApiSet {
  std::vector<ApiEntry> apis;  // distinct
  std::vector<bool> explored;  // per API: drawn uniformly (exploration) rather than by weakness
};

class ApiSampler {
 public:
  // invalid_argument when the options fail validate(), the catalogue has fewer than
  // min_set_size entries, or two entries share a name.
  static Result<ApiSampler> create(std::vector<ApiEntry> catalogue, ApiSamplerOptions options);

  // The next set, preferring the APIs `stats` says the Coder fails.
  ApiSet draw(const ApiStats& stats);

  // (1 − stats.mean(api))^weakness_weight: the weight of `api` in a non-exploration draw.
  double weakness(const ApiStats& stats, const std::string& api) const;

  uint64_t sets_drawn() const { return sets_drawn_; }
  const ApiSamplerOptions& options() const { return options_; }
  const std::vector<ApiEntry>& catalogue() const { return catalogue_; }

  // The RNG state: {"seed", "engine_calls", "sets_drawn", "catalogue_size", "catalogue_hash"}.
  nlohmann::json to_json() const;
  // A sampler as create(catalogue, options) makes it, with the RNG state of `state`. parse_error
  // for malformed state; invalid_argument when the state was saved with another seed or another
  // catalogue (the draws would not continue the saved run's).
  static Result<ApiSampler> from_json(const nlohmann::json& state, std::vector<ApiEntry> catalogue,
                                      ApiSamplerOptions options);

 private:
  ApiSampler(std::vector<ApiEntry> catalogue, ApiSamplerOptions options);

  std::vector<ApiEntry> catalogue_;
  ApiSamplerOptions options_;
  CountedRng rng_;
  uint64_t sets_drawn_ = 0;
};

}  // namespace kz::curriculum
