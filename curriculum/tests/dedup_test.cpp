// Near-duplicate detection: renamed-variable copies (with other comments, docstrings and sizes)
// are duplicates; different modules are not; an equal validation fingerprint is a duplicate.
#include <gtest/gtest.h>

#include "kz/curriculum/dedup.h"
#include "similar_modules.h"

namespace kz {
namespace {

using test::kConvPool;
using test::kGeluMatmul;
using test::kGeluMatmulRenamed;

TEST(Normalize, RenamesAuthorNamesKeepsApisDropsCommentsAndDocstrings) {
  auto a = normalize_source_tokens("x = F.gelu(y)  # act\n\"\"\"doc\"\"\"\n");
  auto b = normalize_source_tokens("out = F.gelu(inp)\n");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (std::vector<std::string>{"v0", "=", "F", ".", "gelu", "(", "v1", ")"}));
  auto methods = normalize_source_tokens("total = self.scale * x.sum(dim=1) + 1e-6");
  EXPECT_EQ(methods, (std::vector<std::string>{"v0", "=", "self", ".", "v1", "*", "v2", ".", "sum", "(", "v3", "=",
                                               "N", ")", "+", "N"}));
  auto strings = normalize_source_tokens("s = 'a#b' + r\"c\"");
  EXPECT_EQ(strings, (std::vector<std::string>{"v0", "=", "S", "+", "S"}));
}

TEST(Shingles, JaccardOfSets) {
  std::vector<std::string> tokens{"a", "b", "c", "d", "e", "f"};
  EXPECT_EQ(shingles(tokens).size(), 2u);
  EXPECT_EQ(shingles({"a", "b"}).size(), 1u);  // shorter than n: one shingle
  EXPECT_DOUBLE_EQ(jaccard(shingles(tokens), shingles(tokens)), 1.0);
  EXPECT_DOUBLE_EQ(jaccard({1, 2, 3}, {2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(jaccard({}, {}), 1.0);
}

TEST(NearDuplicateIndex, RenamedCopyIsADuplicate) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-gelu");
  auto match = index.match(kGeluMatmulRenamed, "fp-other");
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->id, "m1");
  EXPECT_FALSE(match->same_fingerprint);
  EXPECT_GE(match->similarity, 0.8);
  EXPECT_EQ(index.find_duplicate(kGeluMatmulRenamed, ""), std::optional<std::string>("m1"));
}

TEST(NearDuplicateIndex, DifferentModulesAreNot) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-gelu");
  EXPECT_FALSE(index.find_duplicate(kConvPool, "fp-conv").has_value());
  index.add("m2", kConvPool, "fp-conv");
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.find_duplicate(kConvPool, "fp-new"), std::optional<std::string>("m2"));
}

TEST(NearDuplicateIndex, EqualFingerprintIsADuplicateEmptyIsNot) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-same");
  auto match = index.match(kConvPool, "fp-same");
  ASSERT_TRUE(match.has_value());
  EXPECT_TRUE(match->same_fingerprint);
  EXPECT_EQ(match->id, "m1");
  NearDuplicateIndex no_fingerprints(0.8);
  no_fingerprints.add("m1", kGeluMatmul, "");
  EXPECT_FALSE(no_fingerprints.find_duplicate(kConvPool, "").has_value());
}

}  // namespace
}  // namespace kz
