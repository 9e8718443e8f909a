// Per-API statistics of the Coder: how often its samples on modules using an API are correct.
//
// Each API carries a Beta posterior of the Coder's success probability on modules that use it:
//
//   α = α0 + successes,   β = β0 + failures,   mean = α / (α + β)
//
// where successes and failures count the evaluated Coder samples of modules using the API, and
// α0, β0 are the prior (default 1, 1: uniform, mean 0.5 for an API never seen). One update takes
// one sample: the module's API list and whether the sample was correct; every API of the module
// gets that outcome (an API listed twice counts once). The API-set sampler (api_sampler.h) turns
// the means into its preference for weak APIs. Samples that reached no verdict (`infra_error`)
// are not outcomes of the Coder: the caller leaves them out, as the rewards do.
//
// Checkpoints: to_json/from_json, {"prior_alpha": α0, "prior_beta": β0,
// "apis": {"<name>": {"successes": s, "failures": f}, ...}}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"

namespace kz::curriculum {

struct ApiStatsOptions {
  double prior_alpha = 1.0;  // α0 > 0: pseudo-successes every API starts with
  double prior_beta = 1.0;   // β0 > 0: pseudo-failures every API starts with
  // invalid_argument naming the field when a prior is not a finite number > 0.
  Status validate() const;
};

// The evidence on one API: counts of correct and incorrect Coder samples.
struct ApiRecord {
  int64_t successes = 0;
  int64_t failures = 0;
};

class ApiStats {
 public:
  // `options` must pass validate() (create() checks it).
  explicit ApiStats(ApiStatsOptions options = {}) : options_(options) {}
  static Result<ApiStats> create(ApiStatsOptions options);

  // One evaluated Coder sample of a module that uses `apis`. invalid_argument (and no change)
  // when a name is empty.
  Status update(const std::vector<std::string>& apis, bool correct);

  // The posterior of `api` (the prior for an API never updated).
  double alpha(const std::string& api) const;
  double beta(const std::string& api) const;
  double mean(const std::string& api) const;  // α / (α + β)
  int64_t count(const std::string& api) const;  // samples seen: successes + failures
  ApiRecord record(const std::string& api) const;

  // Every API updated at least once, by name.
  const std::map<std::string, ApiRecord>& records() const { return records_; }
  const ApiStatsOptions& options() const { return options_; }

  nlohmann::json to_json() const;
  // The inverse of to_json. parse_error naming the key for anything malformed (not an object, a
  // prior that is not a number > 0, a count that is not a non-negative integer, an empty name).
  static Result<ApiStats> from_json(const nlohmann::json& json);

 private:
  ApiStatsOptions options_;
  std::map<std::string, ApiRecord> records_;
};

}  // namespace kz::curriculum
