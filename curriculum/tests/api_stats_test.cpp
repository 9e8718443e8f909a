// Per-API Beta posteriors: the update's numbers by hand, options, JSON round trip and bad JSON.
#include <gtest/gtest.h>

#include <cmath>

#include "kz/curriculum/api_stats.h"

namespace kz::curriculum {
namespace {

TEST(ApiStats, UnseenApiHasThePrior) {
  ApiStats stats;
  EXPECT_DOUBLE_EQ(stats.alpha("torch.add"), 1.0);
  EXPECT_DOUBLE_EQ(stats.beta("torch.add"), 1.0);
  EXPECT_DOUBLE_EQ(stats.mean("torch.add"), 0.5);
  EXPECT_EQ(stats.count("torch.add"), 0);
  auto skewed = ApiStats::create({.prior_alpha = 1, .prior_beta = 3});
  ASSERT_TRUE(skewed.ok());
  EXPECT_DOUBLE_EQ(skewed->mean("torch.add"), 0.25);
}

TEST(ApiStats, UpdateNumbersByHand) {
  auto created = ApiStats::create({.prior_alpha = 2, .prior_beta = 3});
  ASSERT_TRUE(created.ok());
  ApiStats stats = *created;
  ASSERT_TRUE(stats.update({"a", "b"}, true).is_ok());   // a: 1 success, b: 1 success
  ASSERT_TRUE(stats.update({"a"}, false).is_ok());       // a: 1 failure
  ASSERT_TRUE(stats.update({"a", "a"}, false).is_ok());  // listed twice: one failure
  // a: α = 2 + 1 = 3, β = 3 + 2 = 5, mean 3/8.
  EXPECT_DOUBLE_EQ(stats.alpha("a"), 3.0);
  EXPECT_DOUBLE_EQ(stats.beta("a"), 5.0);
  EXPECT_DOUBLE_EQ(stats.mean("a"), 0.375);
  EXPECT_EQ(stats.count("a"), 3);
  EXPECT_EQ(stats.record("a").successes, 1);
  EXPECT_EQ(stats.record("a").failures, 2);
  // b: α = 3, β = 3, mean 1/2.
  EXPECT_DOUBLE_EQ(stats.mean("b"), 0.5);
  EXPECT_EQ(stats.count("b"), 1);
  EXPECT_EQ(stats.records().size(), 2u);

  ApiStats uniform;  // α0 = β0 = 1: 3 of 4 correct gives α = 4, β = 2, mean 2/3
  for (bool correct : {true, true, false, true}) ASSERT_TRUE(uniform.update({"torch.matmul"}, correct).is_ok());
  EXPECT_DOUBLE_EQ(uniform.mean("torch.matmul"), 4.0 / 6.0);
}

TEST(ApiStats, EmptyNameIsAnErrorAndChangesNothing) {
  ApiStats stats;
  Status status = stats.update({"a", ""}, true);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument);
  EXPECT_EQ(stats.count("a"), 0);
  EXPECT_TRUE(stats.update({}, true).is_ok());  // a module without APIs: nothing to update
  EXPECT_TRUE(stats.records().empty());
}

TEST(ApiStats, OptionsMustBePositive) {
  EXPECT_TRUE(ApiStatsOptions{}.validate().is_ok());
  EXPECT_EQ(ApiStats::create({.prior_alpha = 0}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ApiStats::create({.prior_beta = -1}).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ApiStats::create({.prior_alpha = std::nan("")}).status().code(), StatusCode::invalid_argument);
}

TEST(ApiStats, JsonRoundTrip) {
  auto created = ApiStats::create({.prior_alpha = 0.5, .prior_beta = 2});
  ASSERT_TRUE(created.ok());
  ApiStats stats = *created;
  ASSERT_TRUE(stats.update({"torch.add", "torch.nn.functional.gelu"}, true).is_ok());
  ASSERT_TRUE(stats.update({"torch.add"}, false).is_ok());
  nlohmann::json json = stats.to_json();
  EXPECT_EQ(json, nlohmann::json::parse(R"({"prior_alpha": 0.5, "prior_beta": 2.0,
      "apis": {"torch.add": {"successes": 1, "failures": 1},
               "torch.nn.functional.gelu": {"successes": 1, "failures": 0}}})"));
  auto back = ApiStats::from_json(nlohmann::json::parse(json.dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), json);
  EXPECT_DOUBLE_EQ(back->mean("torch.add"), stats.mean("torch.add"));
  EXPECT_DOUBLE_EQ(back->mean("never.seen"), 0.2);  // the restored prior: 0.5 / 2.5
}

TEST(ApiStats, MalformedJsonIsAParseErrorNamingTheKey) {
  struct Case {
    const char* json;
    const char* mentions;
  };
  const Case cases[] = {
      {R"([1, 2])", "expected a JSON object"},
      {R"({"prior_beta": 1, "apis": {}})", "missing key 'prior_alpha'"},
      {R"({"prior_alpha": "1", "prior_beta": 1, "apis": {}})", "prior_alpha"},
      {R"({"prior_alpha": 0, "prior_beta": 1, "apis": {}})", "prior_alpha"},
      {R"({"prior_alpha": 1, "prior_beta": 1})", "missing key 'apis'"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": []})", "apis"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": {"a": {"successes": -1, "failures": 0}}})", "successes"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": {"a": {"successes": 1, "failures": 1.5}}})", "failures"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": {"a": {"successes": "3", "failures": 0}}})", "successes"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": {"a": {"failures": 0}}})", "missing key 'successes'"},
      {R"({"prior_alpha": 1, "prior_beta": 1, "apis": {"": {"successes": 1, "failures": 0}}})", "empty API name"},
  };
  for (const auto& c : cases) {
    auto result = ApiStats::from_json(nlohmann::json::parse(c.json));
    ASSERT_FALSE(result.ok()) << c.json;
    EXPECT_EQ(result.status().code(), StatusCode::parse_error) << c.json;
    EXPECT_NE(result.status().message().find(c.mentions), std::string::npos)
        << c.json << " -> " << result.status().message();
  }
}

}  // namespace
}  // namespace kz::curriculum
