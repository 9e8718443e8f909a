// The API-set sampler: set size, then weakness-weighted or uniform draws without repetition.
#include "kz/curriculum/api_sampler.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "json_read.h"
#include "kz/core/hash.h"

namespace kz::curriculum {
namespace {

// Identifies the catalogue a saved state belongs to: its names, in order.
std::string catalogue_hash(const std::vector<ApiEntry>& catalogue) {
  std::string names;
  for (const auto& api : catalogue) names.append(api.name).push_back('\n');
  return fmt::format("{:016x}", hash64(names));
}

}  // namespace

Status ApiSamplerOptions::validate() const {
  if (min_set_size < 1) return invalid_argument("api sampler: min_set_size must be >= 1");
  if (max_set_size < min_set_size)
    return invalid_argument(fmt::format("api sampler: max_set_size ({}) must be >= min_set_size ({})", max_set_size,
                                        min_set_size));
  if (!(std::isfinite(weakness_weight) && weakness_weight >= 0))
    return invalid_argument(fmt::format("api sampler: weakness_weight must be a finite number >= 0, got {}",
                                        weakness_weight));
  if (!(exploration_share >= 0 && exploration_share <= 1))
    return invalid_argument(fmt::format("api sampler: exploration_share must be in [0, 1], got {}", exploration_share));
  return Status::ok();
}

ApiSampler::ApiSampler(std::vector<ApiEntry> catalogue, ApiSamplerOptions options)
    : catalogue_(std::move(catalogue)), options_(options), rng_(options.seed) {}

Result<ApiSampler> ApiSampler::create(std::vector<ApiEntry> catalogue, ApiSamplerOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  if (catalogue.size() < options.min_set_size)
    return invalid_argument(fmt::format("api sampler: the catalogue has {} APIs, fewer than min_set_size ({})",
                                        catalogue.size(), options.min_set_size));
  std::set<std::string> names;
  for (const auto& api : catalogue)
    if (!names.insert(api.name).second)
      return invalid_argument(fmt::format("api sampler: the catalogue lists {} twice", api.name));
  return ApiSampler(std::move(catalogue), options);
}

double ApiSampler::weakness(const ApiStats& stats, const std::string& api) const {
  return std::pow(1.0 - stats.mean(api), options_.weakness_weight);
}

ApiSet ApiSampler::draw(const ApiStats& stats) {
  size_t largest = std::min(options_.max_set_size, catalogue_.size());
  size_t size = options_.min_set_size + rng_.below(largest - options_.min_set_size + 1);

  std::vector<size_t> pool(catalogue_.size());  // catalogue indices not yet drawn, in catalogue order
  std::vector<double> weights(catalogue_.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    pool[i] = i;
    weights[i] = weakness(stats, catalogue_[i].name);
  }
  ApiSet set;
  while (set.apis.size() < size) {
    bool explore = rng_.unit() < options_.exploration_share;
    size_t k = explore ? rng_.below(pool.size()) : rng_.weighted(weights);
    set.apis.push_back(catalogue_[pool[k]]);
    set.explored.push_back(explore);
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(k));
    weights.erase(weights.begin() + static_cast<std::ptrdiff_t>(k));
  }
  ++sets_drawn_;
  return set;
}

nlohmann::json ApiSampler::to_json() const {
  return {{"seed", rng_.seed()},
          {"engine_calls", rng_.calls()},
          {"sets_drawn", sets_drawn_},
          {"catalogue_size", catalogue_.size()},
          {"catalogue_hash", catalogue_hash(catalogue_)}};
}

Result<ApiSampler> ApiSampler::from_json(const nlohmann::json& state, std::vector<ApiEntry> catalogue,
                                         ApiSamplerOptions options) {
  const std::string where = "api sampler state";
  uint64_t seed = 0, calls = 0, sets = 0, size = 0;
  std::string hash;
  KZ_RETURN_IF_ERROR(detail::read_uint64(state, "seed", where, seed));
  KZ_RETURN_IF_ERROR(detail::read_uint64(state, "engine_calls", where, calls));
  KZ_RETURN_IF_ERROR(detail::read_uint64(state, "sets_drawn", where, sets));
  KZ_RETURN_IF_ERROR(detail::read_uint64(state, "catalogue_size", where, size));
  KZ_RETURN_IF_ERROR(detail::read_string(state, "catalogue_hash", where, hash));
  auto sampler = create(std::move(catalogue), options);
  if (!sampler.ok()) return sampler.status();
  if (seed != options.seed)
    return invalid_argument(fmt::format("{}: saved with seed {}, but the options' seed is {}; resume with the "
                                        "same seed (or start a new sampler)",
                                        where, seed, options.seed));
  if (size != sampler->catalogue_.size() || hash != catalogue_hash(sampler->catalogue_))
    return invalid_argument(fmt::format("{}: saved with another API catalogue ({} APIs, hash {}; now {} APIs, hash "
                                        "{}): the draws would not continue the saved run's",
                                        where, size, hash, sampler->catalogue_.size(),
                                        catalogue_hash(sampler->catalogue_)));
  sampler->rng_ = CountedRng::restored(seed, calls);
  sampler->sets_drawn_ = sets;
  return sampler;
}

}  // namespace kz::curriculum
