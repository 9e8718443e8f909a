// UTF-8 repair.
#include <gtest/gtest.h>

#include "kz/core/text.h"

namespace kz {
namespace {

TEST(Text, ValidTextIsUnchanged) {
  EXPECT_EQ(to_valid_utf8("plain ascii"), "plain ascii");
  EXPECT_EQ(to_valid_utf8("caf\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x9A\x80"), "caf\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x9A\x80");
}

TEST(Text, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(to_valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(to_valid_utf8("\xC3"), "\xEF\xBF\xBD");               // sequence cut by a tail
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

}  // namespace
}  // namespace kz
