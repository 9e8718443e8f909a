// The PyTorch API catalogue: the shipped file loads and is well formed; lookups name unknown APIs
// with suggestions; weighted sampling never repeats an API and follows the weights.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kz/core/files.h"
#include "kz/task/catalogue.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

std::vector<ApiEntry> shipped() {
  auto catalogue = load_api_catalogue(default_api_catalogue_path());
  EXPECT_TRUE(catalogue.ok()) << catalogue.status().to_string();
  return catalogue.ok() ? *catalogue : std::vector<ApiEntry>{};
}

std::vector<ApiEntry> small_catalogue() {
  return {{"a.one", "x", {"one"}}, {"a.two", "x", {"two"}}, {"a.three", "y", {"three"}},
          {"a.four", "y", {"four"}}, {"a.five", "z", {"five"}}};
}

TEST(Catalogue, ShippedCatalogueLoadsAndIsWellFormed) {
  auto catalogue = shipped();
  EXPECT_GE(catalogue.size(), 150u);
  std::set<std::string> names;
  for (const auto& entry : catalogue) {
    EXPECT_TRUE(names.insert(entry.name).second) << "duplicate " << entry.name;
    EXPECT_FALSE(entry.category.empty()) << entry.name;
    EXPECT_FALSE(entry.aten.empty()) << entry.name;
  }
  auto gelu = find_apis(catalogue, {"torch.nn.functional.gelu", "torch.matmul"});
  ASSERT_TRUE(gelu.ok()) << gelu.status().to_string();
  EXPECT_EQ((*gelu)[0].aten, std::vector<std::string>({"gelu", "gelu_"}));
  EXPECT_EQ((*gelu)[1].category, "linear_algebra");
}

TEST(Catalogue, UnknownNameIsAnErrorWithSuggestions) {
  auto catalogue = shipped();
  auto missing = find_apis(catalogue, {"torch.matmul", "gelu"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("'gelu'"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("did you mean torch.nn.functional.gelu"), std::string::npos)
      << missing.status().message();
  auto typo = find_apis(catalogue, {"torch.nn.functional.softmx"});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("torch.nn.functional.softmax"), std::string::npos) << typo.status().message();
}

TEST(Catalogue, MalformedFilesNameTheProblem) {
  auto dir = make_unique_dir(fs::temp_directory_path(), "kz-catalogue-test-");
  ASSERT_TRUE(dir.ok());
  auto write_and_load = [&](const std::string& text) {
    EXPECT_TRUE(write_file_atomic(*dir / "c.toml", text).is_ok());
    return load_api_catalogue(*dir / "c.toml");
  };
  auto bad_toml = write_and_load("[[api]\nname = 1\n");
  ASSERT_FALSE(bad_toml.ok());
  EXPECT_EQ(bad_toml.status().code(), StatusCode::parse_error);
  EXPECT_NE(bad_toml.status().message().find("c.toml:1"), std::string::npos) << bad_toml.status().message();
  auto no_aten = write_and_load("[[api]]\nname = \"torch.x\"\ncategory = \"c\"\naten = []\n");
  ASSERT_FALSE(no_aten.ok());
  EXPECT_NE(no_aten.status().message().find("torch.x"), std::string::npos);
  auto qualified = write_and_load("[[api]]\nname = \"torch.x\"\ncategory = \"c\"\naten = [\"aten::x\"]\n");
  EXPECT_FALSE(qualified.ok());
  auto twice = write_and_load(
      "[[api]]\nname = \"t\"\ncategory = \"c\"\naten = [\"x\"]\n[[api]]\nname = \"t\"\ncategory = \"c\"\naten = [\"x\"]\n");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
  EXPECT_FALSE(load_api_catalogue(*dir / "missing.toml").ok());
  fs::remove_all(*dir);
}

TEST(Catalogue, SamplingNeverRepeatsAndStopsWhenExhausted) {
  auto catalogue = small_catalogue();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    auto drawn = sample_apis(catalogue, 3, rng);
    ASSERT_EQ(drawn.size(), 3u);
    std::set<std::string> names;
    for (const auto& entry : drawn) names.insert(entry.name);
    EXPECT_EQ(names.size(), 3u);
  }
  EXPECT_EQ(sample_apis(catalogue, 10, rng).size(), 5u);
  EXPECT_EQ(sample_apis(catalogue, 10, rng, {{"x", 0.0}}).size(), 3u);  // category weight 0: never drawn
}

TEST(Catalogue, SamplingFollowsTheWeights) {
  auto catalogue = small_catalogue();
  std::mt19937_64 rng(11);
  // a.one weighs 6 among 5 entries (total 10): drawn first with probability 0.6; category y weighs 0.
  std::map<std::string, double> weights{{"a.one", 6.0}, {"y", 0.0}};
  std::map<std::string, int> first;
  const int rounds = 20000;
  for (int round = 0; round < rounds; ++round) {
    auto drawn = sample_apis(catalogue, 2, rng, weights);
    ASSERT_EQ(drawn.size(), 2u);
    ++first[drawn[0].name];
    EXPECT_NE(drawn[0].category, "y");
    EXPECT_NE(drawn[1].category, "y");
  }
  // 6 / (6 + 1 + 1): a.one, a.two, a.five remain with positive weight.
  EXPECT_NEAR(first["a.one"] / double(rounds), 0.75, 0.02);
  EXPECT_NEAR(first["a.two"] / double(rounds), 0.125, 0.015);
  EXPECT_NEAR(first["a.five"] / double(rounds), 0.125, 0.015);
}

TEST(Catalogue, SamplingIsReproducibleFromTheSeed) {
  auto catalogue = shipped();
  std::mt19937_64 a(3), b(3);
  auto first = sample_apis(catalogue, 4, a), second = sample_apis(catalogue, 4, b);
  ASSERT_EQ(first.size(), 4u);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].name, second[i].name);
}

}  // namespace
}  // namespace kz
