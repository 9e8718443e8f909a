// Status/Result: code names, context chaining, rendering and Result's value/error access.
#include "kz/core/status.h"

#include <gtest/gtest.h>

namespace kz {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.to_string(), "ok");
  EXPECT_EQ(s.with_context("ctx").to_string(), "ok");
}

TEST(Status, CodeNames) {
  EXPECT_STREQ(status_code_name(StatusCode::ok), "ok");
  EXPECT_STREQ(status_code_name(StatusCode::invalid_argument), "invalid_argument");
  EXPECT_STREQ(status_code_name(StatusCode::not_found), "not_found");
  EXPECT_STREQ(status_code_name(StatusCode::io_error), "io_error");
  EXPECT_STREQ(status_code_name(StatusCode::parse_error), "parse_error");
  EXPECT_STREQ(status_code_name(StatusCode::timeout), "timeout");
  EXPECT_STREQ(status_code_name(StatusCode::internal), "internal");
}

TEST(Status, ContextChainsOutward) {
  Status s = not_found("No such file").with_context("reading a.py").with_context("task 03");
  EXPECT_EQ(s.code(), StatusCode::not_found);
  EXPECT_EQ(s.message(), "task 03: reading a.py: No such file");
  EXPECT_EQ(s.to_string(), "not_found: task 03: reading a.py: No such file");
}

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("not positive");
  return v;
}

Status use(int v, int& out) {
  Result<int> r = parse_positive(v);
  KZ_RETURN_IF_ERROR(r.status());
  out = *r;
  return Status::ok();
}

TEST(Result, HoldsValueOrStatus) {
  Result<int> good = parse_positive(3);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  EXPECT_TRUE(good.status().is_ok());
  Result<int> bad = parse_positive(-1);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
}

TEST(Result, ReturnIfErrorPropagates) {
  int out = 0;
  EXPECT_TRUE(use(5, out).is_ok());
  EXPECT_EQ(out, 5);
  Status s = use(0, out);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(out, 5);
}

}  // namespace
}  // namespace kz
