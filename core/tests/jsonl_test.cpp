// Append-only JSONL logs: read back in order, a crash-torn last line skipped, any other bad line named.
#include "kz/core/jsonl.h"

#include <gtest/gtest.h>

#include "kz/core/files.h"

namespace kz {
namespace {

class JsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_jsonl_test_");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    path_ = *dir / "log.jsonl";
  }
  void TearDown() override { fs::remove_all(path_.parent_path()); }
  fs::path path_;
};

TEST_F(JsonlTest, MissingFileHasNoRows) {
  auto rows = read_jsonl_log(path_);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_TRUE(rows->empty());
}

TEST_F(JsonlTest, RowsComeBackInOrderAndBlankLinesAreSkipped) {
  ASSERT_TRUE(append_line(path_, R"({"id": 1})").is_ok());
  ASSERT_TRUE(append_line(path_, "").is_ok());
  ASSERT_TRUE(append_line(path_, R"({"id": 2, "text": "a\nb"})").is_ok());
  auto rows = read_jsonl_log(path_);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0]["id"], 1);
  EXPECT_EQ((*rows)[1]["text"], "a\nb");
}

TEST_F(JsonlTest, ALastLineCutShortByACrashIsSkipped) {
  ASSERT_TRUE(write_file_atomic(path_, "{\"id\": 1}\n{\"id\": 2, \"te").is_ok());
  auto rows = read_jsonl_log(path_);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0]["id"], 1);
}

TEST_F(JsonlTest, ABadLineInTheMiddleIsAnErrorNamingIt) {
  ASSERT_TRUE(write_file_atomic(path_, "{\"id\": 1}\n{\"id\": 2, \"te\n{\"id\": 3}\n").is_ok());
  auto rows = read_jsonl_log(path_);
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("log.jsonl:2"), std::string::npos) << rows.status().to_string();
}

TEST_F(JsonlTest, ACompleteLineThatIsNotAnObjectIsAnError) {
  ASSERT_TRUE(write_file_atomic(path_, "[1, 2]\n").is_ok());
  EXPECT_FALSE(read_jsonl_log(path_).ok());
}

}  // namespace
}  // namespace kz
