// Hashing: stability across calls, length-prefixed part boundaries, hex format.
#include "kz/core/hash.h"

#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kz {
namespace {

TEST(Hash, Hash64IsXxh3AndStable) {
  EXPECT_EQ(hash64("kernel"), hash64("kernel"));
  EXPECT_EQ(hash64("kernel"), XXH3_64bits("kernel", 6));
  EXPECT_NE(hash64("kernel"), hash64("kernels"));
}

TEST(Hash, ContentHashIs32LowercaseHex) {
  std::string h = content_hash({"a", "b"});
  ASSERT_EQ(h.size(), 32u);
  for (char c : h) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << h;
}

TEST(Hash, ContentHashStableAndDistinct) {
  EXPECT_EQ(content_hash({"ab", "c"}), content_hash({"ab", "c"}));
  EXPECT_NE(content_hash({"ab", "c"}), content_hash({"a", "bc"}));
  EXPECT_NE(content_hash({"abc"}), content_hash({"ab", "c"}));
  EXPECT_NE(content_hash({""}), content_hash({}));
  EXPECT_NE(content_hash({"", ""}), content_hash({""}));
}

}  // namespace
}  // namespace kz
