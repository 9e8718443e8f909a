#include <gtest/gtest.h>
#include "kz/model/tokenizer.h"
TEST(Tokenizer, Builds) {}
