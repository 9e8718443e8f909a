// ConfigTable: TOML read onto struct fields (types, bounds, unknown keys) and printed back.
#include <gtest/gtest.h>

#include "kz/core/config_fields.h"

namespace kz {
namespace {

struct Options {
  std::string name = "a";
  int count = 1;
  uint64_t seed = 0;
  std::map<std::string, long long> sizes;
  double fraction = 0.5;
  int64_t big = 0;
  bool enabled = false;
  std::vector<std::string> stop;
  std::string mode = "fast";
};

ConfigTable table(Options& o) {
  return {
      {"name", o.name},
      {"count", ConfigField(o.count).at_least(1).at_most(10)},
      {"seed", o.seed},
      {"sizes", o.sizes},
      {"limits.fraction", ConfigField(o.fraction).above(0).at_most(1)},
      {"limits.big", o.big},
      {"limits.enabled", o.enabled},
      {"text.stop", o.stop},
      {"text.mode", ConfigField(o.mode).matching("fast|slow", "fast or slow")},
  };
}

Status apply(const std::string& text, Options& o) { return apply_config_text(text, "cfg.toml", table(o)); }

// The error for `text`, which must be one; names the origin.
std::string error_for(const std::string& text) {
  Options o;
  Status status = apply(text, o);
  EXPECT_FALSE(status.is_ok()) << text;
  EXPECT_NE(status.message().find("cfg.toml"), std::string::npos) << status.message();
  return status.message();
}

TEST(ConfigFields, KeysSetTheirFieldsAndOthersKeepTheirValues) {
  Options o;
  auto status = apply(R"(
count = 3
sizes = { dim = 64 }
[limits]
fraction = 1   # an integer is a float's value too
[text]
stop = ["\n", "```"]
mode = "slow"
)", o);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(o.count, 3);
  EXPECT_EQ(o.sizes.at("dim"), 64);
  EXPECT_DOUBLE_EQ(o.fraction, 1.0);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"\n", "```"}));
  EXPECT_EQ(o.mode, "slow");
  EXPECT_EQ(o.name, "a");
  EXPECT_FALSE(o.enabled);
}

TEST(ConfigFields, OverridesSetOneKeyAsTomlOrAsAPlainString) {
  Options o;
  ASSERT_TRUE(apply_config_override("count=4", table(o)).is_ok());
  ASSERT_TRUE(apply_config_override("text.mode = slow", table(o)).is_ok());     // a bare word: a string
  ASSERT_TRUE(apply_config_override("name=\"b c\"", table(o)).is_ok());        // a quoted TOML string
  ASSERT_TRUE(apply_config_override("text.stop=[\"x\", \"y\"]", table(o)).is_ok());
  EXPECT_EQ(o.count, 4);
  EXPECT_EQ(o.mode, "slow");
  EXPECT_EQ(o.name, "b c");
  EXPECT_EQ(o.stop, (std::vector<std::string>{"x", "y"}));
  for (const char* bad : {"count=11", "counts=2", "count", "=2", "text.mode=medium", "count=two"}) {
    Status status = apply_config_override(bad, table(o));
    EXPECT_FALSE(status.is_ok()) << bad;
    EXPECT_NE(status.message().find("--set"), std::string::npos) << status.message();
  }
}

TEST(ConfigFields, UnknownKeysAndSectionsAreNamed) {
  EXPECT_NE(error_for("[limits]\nfractoin = 0.1\n").find("unknown config key 'limits.fractoin'"), std::string::npos);
  EXPECT_NE(error_for("[limit]\n").find("unknown config section 'limit'"), std::string::npos);
  EXPECT_NE(error_for("count.x = 1\n").find("'count'"), std::string::npos);
}

TEST(ConfigFields, WrongTypesAreNamed) {
  EXPECT_NE(error_for("count = \"3\"\n").find("'count' must be an integer"), std::string::npos);
  EXPECT_NE(error_for("count = 3.0\n").find("'count' must be an integer"), std::string::npos);
  EXPECT_NE(error_for("[limits]\nenabled = 1\n").find("'limits.enabled' must be true or false"), std::string::npos);
  EXPECT_NE(error_for("[limits]\nfraction = \"half\"\n").find("'limits.fraction' must be a number"),
            std::string::npos);
  EXPECT_NE(error_for("[text]\nstop = \"x\"\n").find("'text.stop' must be an array of strings"), std::string::npos);
  EXPECT_NE(error_for("[text]\nstop = [1]\n").find("'text.stop'"), std::string::npos);
  EXPECT_NE(error_for("[sizes]\ndim = 1.5\n").find("'sizes.dim' must be an integer"), std::string::npos);
}

TEST(ConfigFields, ValuesOutOfBoundsAreNamed) {
  EXPECT_NE(error_for("count = 0\n").find("'count' must be >= 1 and <= 10, got 0"), std::string::npos);
  EXPECT_NE(error_for("count = 11\n").find("'count'"), std::string::npos);
  EXPECT_NE(error_for("[limits]\nfraction = 0\n").find("'limits.fraction' must be > 0 and <= 1"), std::string::npos);
  EXPECT_NE(error_for("[limits]\nfraction = nan\n").find("'limits.fraction'"), std::string::npos);
  EXPECT_NE(error_for("seed = -1\n").find("'seed' must be between 0 and"), std::string::npos);
  EXPECT_NE(error_for("[text]\nmode = \"fastest\"\n").find("'text.mode' must be fast or slow, got \"fastest\""),
            std::string::npos);
}

TEST(ConfigFields, SyntaxErrorsGiveLineNumbers) {
  EXPECT_NE(error_for("count = 3\n[limits\n").find("cfg.toml:2"), std::string::npos);
}

TEST(ConfigFields, PrintedTomlReadsBackToTheSameValues) {
  Options o;
  o.name = "quote \" and \\ backslash";
  o.count = 7;
  o.seed = 1234567890123;
  o.sizes = {{"dim", 64}, {"batch", 2}};
  o.fraction = 0.1 + 0.2;  // needs all 17 digits to read back exactly
  o.big = -5;
  o.enabled = true;
  o.stop = {"\n", "END"};
  o.mode = "slow";
  std::string text = config_to_toml(table(o));
  Options back;
  auto status = apply_config_text(text, "printed", table(back));
  ASSERT_TRUE(status.is_ok()) << status.to_string() << "\n" << text;
  EXPECT_EQ(config_to_toml(table(back)), text);
  EXPECT_EQ(back.fraction, o.fraction);
  EXPECT_EQ(back.sizes, o.sizes);
  EXPECT_EQ(back.stop, o.stop);
}

TEST(ConfigFields, PrintsTopLevelKeysThenOneSectionPerPrefix) {
  Options o;
  o.sizes = {{"dim", 64}};
  EXPECT_EQ(config_to_toml(table(o)),
            "name = \"a\"\ncount = 1\nseed = 0\n"
            "\n[sizes]\ndim = 64\n"
            "\n[limits]\nfraction = 0.5\nbig = 0\nenabled = false\n"
            "\n[text]\nstop = []\nmode = \"fast\"\n");
}

}  // namespace
}  // namespace kz
