// The supervisor's kept `cuda` builds (kz/eval/kept_builds.h): what is kept of a request's builds,
// and the oldest going once they pass their room.
#include "kz/eval/kept_builds.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "kz/core/files.h"

namespace kz {
namespace {
namespace fs = std::filesystem;

class KeptBuildsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kz_kept_builds_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& path, size_t bytes) {
    fs::create_directories(path.parent_path());
    ASSERT_TRUE(write_file_atomic(path, std::string(bytes, 'x')).is_ok()) << path;
  }

  fs::path dir_;
};

TEST_F(KeptBuildsTest, KeepsOnlyTheLibrariesAndTheMarker) {
  fs::path scratch = dir_ / "request", built = scratch / "torch_extensions";
  write(built / "relu_ext_1" / "relu_ext_1.so", 10);
  write(built / "relu_ext_1" / "main.o", 10);
  write(built / "relu_ext_1" / "build.ninja", 10);
  write(built / "light_ext" / "kz_lighter_build_failed", 10);
  write(dir_ / "elsewhere.so", 10);
  fs::create_directories(built / "linked");
  fs::create_symlink(dir_ / "elsewhere.so", built / "linked" / "linked.so");  // not a regular file
  fs::path kept = dir_ / "kept" / "key";
  ASSERT_TRUE(keep_extension_builds(scratch, kept));
  EXPECT_TRUE(fs::is_regular_file(kept / "relu_ext_1" / "relu_ext_1.so"));
  EXPECT_TRUE(fs::is_regular_file(kept / "light_ext" / "kz_lighter_build_failed"));
  EXPECT_FALSE(fs::exists(kept / "relu_ext_1" / "main.o"));
  EXPECT_FALSE(fs::exists(kept / "relu_ext_1" / "build.ninja"));
  EXPECT_FALSE(fs::exists(kept / "linked"));
  // A second request of the same candidate keeps nothing over the first's.
  write(built / "relu_ext_1" / "relu_ext_1.so", 99);
  EXPECT_FALSE(keep_extension_builds(scratch, kept));
  EXPECT_EQ(fs::file_size(kept / "relu_ext_1" / "relu_ext_1.so"), 10u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "kept"), fs::directory_iterator()), 1) << "no staging left";
  // Nothing built: nothing kept.
  EXPECT_FALSE(keep_extension_builds(dir_ / "empty-request", dir_ / "kept" / "other"));
  EXPECT_FALSE(fs::exists(dir_ / "kept" / "other"));
}

TEST_F(KeptBuildsTest, TheOldestGoOnceTheyPassTheirRoom) {
  const auto now = fs::file_time_type::clock::now();
  for (int i = 0; i < 4; ++i) {  // a, b, c, d: kept 4, 3, 2, 1 minutes ago, 1 MB each
    fs::path build = dir_ / std::string(1, char('a' + i));
    write(build / "ext" / "ext.so", 1 << 20);
    fs::last_write_time(build, now - std::chrono::minutes(4 - i));
  }
  write(dir_ / "e.123-4.tmp" / "ext" / "ext.so", 1 << 20);  // being kept: never removed
  EXPECT_EQ(prune_kept_builds(dir_, 0), 0) << "0: no limit";
  EXPECT_EQ(prune_kept_builds(dir_, 5 << 20), 0) << "within the room";
  EXPECT_EQ(prune_kept_builds(dir_, 3 << 20), 2) << "4 MB in 3 MB of room: down to 2.7 MB";
  EXPECT_FALSE(fs::exists(dir_ / "a"));
  EXPECT_FALSE(fs::exists(dir_ / "b"));
  EXPECT_TRUE(fs::exists(dir_ / "c"));
  EXPECT_TRUE(fs::exists(dir_ / "d"));
  EXPECT_TRUE(fs::exists(dir_ / "e.123-4.tmp"));
}

}  // namespace
}  // namespace kz
