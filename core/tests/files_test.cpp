// Files: round trips, atomic writes without leftovers, appends, and error messages.
#include "kz/core/files.h"

#include <gtest/gtest.h>

namespace kz {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_files_test_");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FilesTest, WriteThenReadRoundTrips) {
  std::string content("line one\n\0binary\xff", 17);
  ASSERT_TRUE(write_file_atomic(dir_ / "a.txt", content).is_ok());
  auto back = read_file(dir_ / "a.txt");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, content);
  ASSERT_TRUE(write_file_atomic(dir_ / "a.txt", "shorter").is_ok());  // replaces, not appends
  EXPECT_EQ(*read_file(dir_ / "a.txt"), "shorter");
}

TEST_F(FilesTest, AtomicWriteLeavesNoTempFile) {
  ASSERT_TRUE(write_file_atomic(dir_ / "b.json", "{}").is_ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"b.json"});
}

TEST_F(FilesTest, AtomicWriteIntoMissingDirFailsWithPath) {
  Status s = write_file_atomic(dir_ / "nope" / "c.txt", "x");
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("nope"), std::string::npos) << s.message();
}

TEST_F(FilesTest, AppendLineAccumulates) {
  fs::path p = dir_ / "results.jsonl";
  ASSERT_TRUE(append_line(p, R"({"a":1})").is_ok());
  ASSERT_TRUE(append_line(p, R"({"b":2})").is_ok());
  ASSERT_TRUE(append_line(p, "").is_ok());
  EXPECT_EQ(*read_file(p), "{\"a\":1}\n{\"b\":2}\n\n");
}

TEST_F(FilesTest, ReadMissingFileNamesPath) {
  fs::path p = dir_ / "missing.txt";
  auto r = read_file(p);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == StatusCode::not_found ||
              r.status().code() == StatusCode::io_error);
  EXPECT_NE(r.status().message().find(p.string()), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("No such file"), std::string::npos);
}

TEST_F(FilesTest, MakeUniqueDirCreatesParentAndDistinctDirs) {
  fs::path parent = dir_ / "deep" / "er";
  auto a = make_unique_dir(parent, "run_");
  auto b = make_unique_dir(parent, "run_");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(fs::is_directory(*a));
  EXPECT_EQ(a->parent_path(), parent);
  EXPECT_EQ(a->filename().string().rfind("run_", 0), 0u);
}

TEST_F(FilesTest, MakeUniqueDirFailsUnderAFile) {
  ASSERT_TRUE(write_file_atomic(dir_ / "f", "x").is_ok());
  auto r = make_unique_dir(dir_ / "f", "x");
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace kz
