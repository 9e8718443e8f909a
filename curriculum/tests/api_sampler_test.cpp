// The API-set sampler: set sizes, no repetition, preference for weak APIs, the exploration share,
// determinism, and a killed-and-resumed run drawing the same sets as one never killed.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "kz/curriculum/api_sampler.h"
#include "kz/curriculum/random.h"

namespace kz::curriculum {
namespace {

std::vector<ApiEntry> make_catalogue(size_t n) {
  std::vector<ApiEntry> catalogue;
  for (size_t i = 0; i < n; ++i) catalogue.push_back({"api" + std::to_string(i), "elementwise", {"op"}});
  return catalogue;
}

ApiSampler make_sampler(size_t catalogue_size, ApiSamplerOptions options) {
  auto sampler = ApiSampler::create(make_catalogue(catalogue_size), options);
  EXPECT_TRUE(sampler.ok()) << sampler.status().to_string();
  return std::move(sampler).value();
}

std::vector<std::string> names(const ApiSet& set) {
  std::vector<std::string> out;
  for (const auto& api : set.apis) out.push_back(api.name);
  return out;
}

// `api` seen `n` times, always correct or always wrong.
void record(ApiStats& stats, const std::string& api, int n, bool correct) {
  for (int i = 0; i < n; ++i) ASSERT_TRUE(stats.update({api}, correct).is_ok());
}

TEST(CountedRng, FollowsTheStandardsEngineAndRestoresByCount) {
  // The standard fixes mt19937_64's 10000th output for the default seed (5489).
  CountedRng rng(5489);
  for (int i = 0; i < 9999; ++i) rng.next();
  EXPECT_EQ(rng.next(), 9981545732273789042ull);
  EXPECT_EQ(rng.calls(), 10000u);
  EXPECT_EQ(CountedRng::restored(5489, 9999).next(), 9981545732273789042ull);

  CountedRng draws(7);
  for (int i = 0; i < 1000; ++i) {
    double u = draws.unit();
    EXPECT_TRUE(u >= 0 && u < 1);
    EXPECT_LT(draws.below(3), 3u);
    size_t k = draws.weighted({0.0, 2.0, 0.0, 1.0});
    EXPECT_TRUE(k == 1 || k == 3) << k;
  }
}

TEST(ApiSampler, SetsHaveDistinctApisAndSizesInRange) {
  ApiSampler sampler = make_sampler(5, {.min_set_size = 2, .max_set_size = 4, .seed = 3});
  ApiStats stats;
  std::set<size_t> sizes;
  for (int i = 0; i < 2000; ++i) {
    ApiSet set = sampler.draw(stats);
    auto drawn = names(set);
    EXPECT_GE(drawn.size(), 2u);
    EXPECT_LE(drawn.size(), 4u);
    EXPECT_EQ(std::set<std::string>(drawn.begin(), drawn.end()).size(), drawn.size()) << "an API repeated";
    EXPECT_EQ(set.explored.size(), drawn.size());
    sizes.insert(drawn.size());
  }
  EXPECT_EQ(sizes, (std::set<size_t>{2, 3, 4}));
  EXPECT_EQ(sampler.sets_drawn(), 2000u);

  // A range past the catalogue is capped by it; a set of the whole catalogue is a permutation of it.
  ApiSampler capped = make_sampler(5, {.min_set_size = 5, .max_set_size = 9, .seed = 3});
  for (int i = 0; i < 50; ++i) {
    auto drawn = names(capped.draw(stats));
    EXPECT_EQ(std::set<std::string>(drawn.begin(), drawn.end()).size(), 5u);
  }
}

TEST(ApiSampler, PrefersApisTheCoderFails) {
  ApiStats stats;
  record(stats, "api0", 20, false);  // mean 1/22: weight 21/22
  record(stats, "api1", 20, true);   // mean 21/22: weight 1/22
  auto count = [&](double weakness_weight) {
    ApiSampler sampler = make_sampler(10, {.weakness_weight = weakness_weight, .seed = 11});
    std::map<std::string, int> drawn;
    for (int i = 0; i < 5000; ++i)
      for (const auto& name : names(sampler.draw(stats))) ++drawn[name];
    return drawn;
  };
  auto weighted = count(1.0);
  EXPECT_GT(weighted["api0"], 3 * weighted["api1"]) << weighted["api0"] << " vs " << weighted["api1"];
  EXPECT_GT(weighted["api0"], weighted["api5"]);  // an unseen API (mean 1/2) sits between
  EXPECT_GT(weighted["api5"], weighted["api1"]);
  // weakness_weight 0 ignores the statistics: both about equally often.
  auto uniform = count(0.0);
  EXPECT_NEAR(double(uniform["api0"]) / uniform["api1"], 1.0, 0.15) << uniform["api0"] << " vs " << uniform["api1"];
}

TEST(ApiSampler, WeaknessIsThePowerOfOneMinusTheMean) {
  ApiStats stats;
  record(stats, "api0", 2, false);  // mean 1/4
  ApiSampler sampler = make_sampler(3, {.weakness_weight = 2.0});
  EXPECT_DOUBLE_EQ(sampler.weakness(stats, "api0"), 0.75 * 0.75);
  EXPECT_DOUBLE_EQ(sampler.weakness(stats, "api1"), 0.25);  // unseen: (1 − 1/2)^2
}

TEST(ApiSampler, ExplorationShareOfDrawsIsUniform) {
  // One weak API and nine the Coder always solves, with a weakness weight so steep that a
  // non-exploration draw (almost) always picks the weak one: the strong APIs come only from
  // exploration, which picks one with probability 9/10.
  ApiStats stats;
  record(stats, "api0", 50, false);
  for (int i = 1; i < 10; ++i) record(stats, "api" + std::to_string(i), 50, true);
  auto run = [&](double share, double& strong_share, double& explored_share) {
    ApiSampler sampler = make_sampler(
        10, {.min_set_size = 1, .max_set_size = 1, .weakness_weight = 8, .exploration_share = share, .seed = 5});
    const int draws = 20000;
    int strong = 0, explored = 0;
    for (int i = 0; i < draws; ++i) {
      ApiSet set = sampler.draw(stats);
      strong += set.apis[0].name != "api0";
      explored += set.explored[0];
    }
    strong_share = double(strong) / draws;
    explored_share = double(explored) / draws;
  };
  double strong = 0, explored = 0;
  run(0.2, strong, explored);
  EXPECT_NEAR(explored, 0.2, 0.015);
  EXPECT_NEAR(strong, 0.2 * 0.9, 0.015);
  run(0.0, strong, explored);
  EXPECT_EQ(explored, 0.0);
  EXPECT_EQ(strong, 0.0);
  run(1.0, strong, explored);
  EXPECT_EQ(explored, 1.0);
  EXPECT_NEAR(strong, 0.9, 0.015);
}

TEST(ApiSampler, SameSeedSameSetsOtherSeedOthers) {
  ApiStats stats;
  record(stats, "api3", 4, false);
  ApiSampler a = make_sampler(30, {.seed = 42});
  ApiSampler b = make_sampler(30, {.seed = 42});
  ApiSampler c = make_sampler(30, {.seed = 43});
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    auto sa = names(a.draw(stats));
    EXPECT_EQ(sa, names(b.draw(stats)));
    differ += sa != names(c.draw(stats));
  }
  EXPECT_GT(differ, 40);
}

// The loop's view: draw a set, "evaluate" it (a deterministic outcome per set), update the stats.
// Checkpoints hold the sampler's state and the stats, written and read as text.
void step(ApiSampler& sampler, ApiStats& stats, std::vector<std::vector<std::string>>& log) {
  auto drawn = names(sampler.draw(stats));
  bool correct = true;
  for (const auto& name : drawn) correct = correct && (name.back() - '0') % 3 != 0;  // api*0, api*3, ... are hard
  ASSERT_TRUE(stats.update(drawn, correct).is_ok());
  log.push_back(drawn);
}

TEST(ApiSampler, KilledAndResumedRunDrawsTheSameSetsAsOneNeverKilled) {
  const ApiSamplerOptions options{.min_set_size = 1, .max_set_size = 5, .seed = 2024};
  std::vector<std::vector<std::string>> never_killed, resumed;
  {
    ApiSampler sampler = make_sampler(40, options);
    ApiStats stats;
    for (int i = 0; i < 100; ++i) step(sampler, stats, never_killed);
  }
  std::string sampler_checkpoint, stats_checkpoint;
  {
    ApiSampler sampler = make_sampler(40, options);
    ApiStats stats;
    for (int i = 0; i < 37; ++i) step(sampler, stats, resumed);
    sampler_checkpoint = sampler.to_json().dump();
    stats_checkpoint = stats.to_json().dump();
  }  // killed
  // Without the saved RNG state the sets after the kill differ: the restore is what matters.
  {
    ApiSampler fresh = make_sampler(40, options);
    auto stats = ApiStats::from_json(nlohmann::json::parse(stats_checkpoint));
    ASSERT_TRUE(stats.ok());
    std::vector<std::vector<std::string>> unrestored = resumed;
    for (int i = 37; i < 100; ++i) step(fresh, *stats, unrestored);
    EXPECT_NE(unrestored, never_killed);
  }
  auto sampler = ApiSampler::from_json(nlohmann::json::parse(sampler_checkpoint), make_catalogue(40), options);
  ASSERT_TRUE(sampler.ok()) << sampler.status().to_string();
  auto stats = ApiStats::from_json(nlohmann::json::parse(stats_checkpoint));
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(sampler->sets_drawn(), 37u);
  for (int i = 37; i < 100; ++i) step(*sampler, *stats, resumed);
  EXPECT_EQ(resumed, never_killed);
  EXPECT_EQ(sampler->sets_drawn(), 100u);
}

TEST(ApiSampler, RestoreRefusesAnotherSeedOrCatalogueAndMalformedState) {
  ApiSampler sampler = make_sampler(10, {.seed = 1});
  sampler.draw(ApiStats{});
  nlohmann::json state = sampler.to_json();
  EXPECT_TRUE(ApiSampler::from_json(state, make_catalogue(10), {.seed = 1}).ok());

  auto other_seed = ApiSampler::from_json(state, make_catalogue(10), {.seed = 2});
  EXPECT_EQ(other_seed.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(other_seed.status().message().find("seed"), std::string::npos);
  auto other_catalogue = ApiSampler::from_json(state, make_catalogue(11), {.seed = 1});
  EXPECT_EQ(other_catalogue.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(other_catalogue.status().message().find("catalogue"), std::string::npos);
  auto renamed = make_catalogue(10);
  renamed[4].name = "torch.other";
  EXPECT_EQ(ApiSampler::from_json(state, renamed, {.seed = 1}).status().code(), StatusCode::invalid_argument);

  for (const char* key : {"seed", "engine_calls", "sets_drawn", "catalogue_size", "catalogue_hash"}) {
    nlohmann::json missing = state;
    missing.erase(key);
    auto result = ApiSampler::from_json(missing, make_catalogue(10), {.seed = 1});
    EXPECT_EQ(result.status().code(), StatusCode::parse_error) << key;
    EXPECT_NE(result.status().message().find(key), std::string::npos) << result.status().message();
  }
  nlohmann::json negative = state;
  negative["engine_calls"] = -4;
  EXPECT_EQ(ApiSampler::from_json(negative, make_catalogue(10), {.seed = 1}).status().code(), StatusCode::parse_error);
  nlohmann::json text = state;
  text["sets_drawn"] = "1";
  EXPECT_EQ(ApiSampler::from_json(text, make_catalogue(10), {.seed = 1}).status().code(), StatusCode::parse_error);
  EXPECT_EQ(ApiSampler::from_json(nlohmann::json::array(), make_catalogue(10), {.seed = 1}).status().code(),
            StatusCode::parse_error);
}

TEST(ApiSampler, OptionsAndCatalogueAreChecked) {
  EXPECT_TRUE(ApiSamplerOptions{}.validate().is_ok());
  EXPECT_EQ(ApiSamplerOptions{.min_set_size = 0}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ((ApiSamplerOptions{.min_set_size = 3, .max_set_size = 2}.validate().code()), StatusCode::invalid_argument);
  EXPECT_EQ(ApiSamplerOptions{.weakness_weight = -1}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ApiSamplerOptions{.exploration_share = 1.5}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ApiSampler::create(make_catalogue(1), {}).status().code(), StatusCode::invalid_argument);  // < 2 APIs
  auto twice = make_catalogue(3);
  twice[2].name = "api0";
  EXPECT_EQ(ApiSampler::create(twice, {}).status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kz::curriculum
