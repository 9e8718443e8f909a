// Run dir: checkpoints round-trip, LATEST and pruning, failed and killed writes never leave a
// wrong LATEST, corruption is named, and the append-only logs cut back exactly.
#include "kz/loop/run_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace kz::loop {
namespace {

using Files = std::map<std::string, std::string>;

// A fill() writing `files` (relative paths, subdirectories made as needed).
std::function<Status(const fs::path&)> fill_with(Files files) {
  return [files = std::move(files)](const fs::path& dir) {
    for (const auto& [rel, content] : files) {
      fs::create_directories((dir / rel).parent_path());
      KZ_RETURN_IF_ERROR(write_file_atomic(dir / rel, content));
    }
    return Status::ok();
  };
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// 3 for ".../iter-000003".
int64_t iteration_of(const fs::path& checkpoint) {
  return std::stoll(checkpoint.filename().string().substr(std::string("iter-").size()));
}

class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_run_dir_test_");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    run_ = *dir;
  }
  void TearDown() override { fs::remove_all(run_); }

  fs::path checkpoints() const { return run_ / "checkpoints"; }
  void write(int64_t iteration, Files files, int keep_last = 3) {
    Status s = write_checkpoint(run_, iteration, keep_last, fill_with(std::move(files)));
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  // The verified LATEST dir, failing the test when there is none.
  fs::path latest() const {
    auto latest = latest_checkpoint(run_);
    EXPECT_TRUE(latest.ok()) << latest.status().to_string();
    EXPECT_TRUE(latest.ok() && latest->has_value());
    return latest.ok() && latest->has_value() ? **latest : fs::path();
  }
  // latest_checkpoint's error, failing the test when it verifies.
  Status latest_error() const {
    auto latest = latest_checkpoint(run_);
    EXPECT_FALSE(latest.ok());
    return latest.status();
  }

  fs::path run_;
};

TEST_F(RunDirTest, NamesArePaddedIterations) {
  EXPECT_EQ(checkpoint_name(3), "iter-000003");
  EXPECT_EQ(checkpoint_name(1234567), "iter-1234567");
}

TEST_F(RunDirTest, NoCheckpointYetIsNullopt) {
  auto latest = latest_checkpoint(run_);
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_FALSE(latest->has_value());
}

TEST_F(RunDirTest, WrittenFilesReadBackWithManifest) {
  write(1, {{"state.json", R"({"step":1})"}, {"model/weights.bin", std::string("\0\1\2\xff", 4)}});
  fs::path dir = latest();
  EXPECT_EQ(dir, checkpoints() / "iter-000001");
  EXPECT_EQ(*read_file(dir / "state.json"), R"({"step":1})");
  EXPECT_EQ(*read_file(dir / "model" / "weights.bin"), std::string("\0\1\2\xff", 4));
  std::string manifest = *read_file(dir / "MANIFEST.json");
  EXPECT_NE(manifest.find("\"model/weights.bin\""), std::string::npos) << manifest;
  EXPECT_NE(manifest.find("\"fnv1a64\""), std::string::npos) << manifest;
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000001"}));
}

TEST_F(RunDirTest, LatestPointsToNewest) {
  write(1, {{"a", "one"}});
  write(2, {{"a", "two"}});
  EXPECT_EQ(latest().filename(), "iter-000002");
  EXPECT_EQ(*read_file(latest() / "a"), "two");
}

TEST_F(RunDirTest, KeepsOnlyTheNewestKeepLast) {
  for (int64_t i = 1; i <= 5; ++i) write(i, {{"a", std::to_string(i)}}, /*keep_last=*/2);
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000004", "iter-000005"}));
  write(6, {{"a", "6"}}, /*keep_last=*/1);
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000006"}));
}

TEST_F(RunDirTest, KeepLastBelowOneIsRefused) {
  Status s = write_checkpoint(run_, 1, 0, fill_with({{"a", "x"}}));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_FALSE(fs::exists(checkpoints() / "LATEST"));
}

TEST_F(RunDirTest, FailedFillKeepsPreviousLatestAndNoStaging) {
  write(1, {{"a", "one"}});
  Status s = write_checkpoint(run_, 2, 3, [](const fs::path& dir) {
    EXPECT_TRUE(write_file_atomic(dir / "half", "written").is_ok());
    return io_error("no space left on device");
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("checkpoint iter-000002: no space left"), std::string::npos) << s.message();
  EXPECT_EQ(latest().filename(), "iter-000001");
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000001"}));
}

TEST_F(RunDirTest, SymlinkInCheckpointIsRefused) {
  write(1, {{"a", "one"}});
  Status s = write_checkpoint(run_, 2, 3, [](const fs::path& dir) {
    fs::create_symlink("/etc/hostname", dir / "link");
    return Status::ok();
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("link"), std::string::npos) << s.message();
  EXPECT_EQ(latest().filename(), "iter-000001");
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000001"}));
}

TEST_F(RunDirTest, TruncatedFileIsNamed) {
  write(1, {{"model/weights.bin", std::string(1000, 'w')}});
  fs::resize_file(checkpoints() / "iter-000001" / "model" / "weights.bin", 500);
  Status s = latest_error();
  EXPECT_NE(s.message().find("model/weights.bin: 500 bytes, the manifest says 1000"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("checkpoint iter-000001"), std::string::npos) << s.message();
}

TEST_F(RunDirTest, AlteredFileIsNamed) {
  write(1, {{"state.json", R"({"step":1})"}});
  ASSERT_TRUE(write_file_atomic(checkpoints() / "iter-000001" / "state.json", R"({"step":9})").is_ok());
  Status s = latest_error();
  EXPECT_NE(s.message().find("state.json: FNV-1a 64 hash"), std::string::npos) << s.message();
}

TEST_F(RunDirTest, MissingFileIsNamed) {
  write(1, {{"a", "one"}, {"sub/b", "two"}});
  fs::remove(checkpoints() / "iter-000001" / "sub" / "b");
  Status s = latest_error();
  EXPECT_EQ(s.code(), StatusCode::not_found);
  EXPECT_NE(s.message().find("sub/b"), std::string::npos) << s.message();
}

TEST_F(RunDirTest, LatestNamingMissingDirIsAnError) {
  write(1, {{"a", "one"}});
  fs::remove_all(checkpoints() / "iter-000001");
  Status s = latest_error();
  EXPECT_EQ(s.code(), StatusCode::not_found);
  EXPECT_NE(s.message().find("iter-000001"), std::string::npos) << s.message();
}

TEST_F(RunDirTest, LeftoverStagingIsIgnoredThenCleaned) {
  write(4, {{"a", "four"}});
  // What a kill in the middle of writing iteration 5 leaves behind.
  fs::create_directories(checkpoints() / ".staging-iter-000005" / "model");
  ASSERT_TRUE(write_file_atomic(checkpoints() / ".staging-iter-000005" / "model" / "w", "half").is_ok());
  EXPECT_EQ(latest().filename(), "iter-000004");
  write(6, {{"a", "six"}});
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000004", "iter-000006"}));
}

TEST_F(RunDirTest, RewritingAnIterationReplacesIt) {
  write(3, {{"a", "first"}, {"only_first", "x"}});
  write(3, {{"a", "second"}});
  fs::path dir = latest();
  EXPECT_EQ(dir.filename(), "iter-000003");
  EXPECT_EQ(*read_file(dir / "a"), "second");
  EXPECT_FALSE(fs::exists(dir / "only_first"));
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-000003"}));
}

// The child: checkpoints with a few MB each from iteration `start` on, until it is killed.
[[noreturn]] void write_checkpoints_until_killed(const fs::path& run, int64_t start) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that died first
  std::string weights(4 << 20, '\0');
  for (int64_t i = start;; ++i) {
    for (size_t j = 0; j < weights.size(); j += 4096) weights[j] = static_cast<char>(i + j / 4096);
    Status s = write_checkpoint(run, i, 2, fill_with({{"model/weights.bin", weights},
                                                     {"state.json", std::to_string(i)}}));
    if (!s.is_ok()) ::_exit(1);
  }
}

TEST_F(RunDirTest, SigkillAtAnyMomentLeavesNoneOrAVerifiedCheckpoint) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> delay_ms(1, 150);
  for (int round = 0; round < 6; ++round) {
    // Each round resumes by rewriting LATEST's iteration, so kills also land mid-replacement.
    auto before = latest_checkpoint(run_);
    ASSERT_TRUE(before.ok()) << before.status().to_string();
    const int64_t start = before->has_value() ? iteration_of(**before) : 0;
    const int delay = delay_ms(rng);
    SCOPED_TRACE("round " + std::to_string(round) + ", killed after " + std::to_string(delay) + " ms");

    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) write_checkpoints_until_killed(run_, start);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "the child failed a write";

    auto after = latest_checkpoint(run_);
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    if (after->has_value()) {
      EXPECT_EQ(*read_file(**after / "state.json"), std::to_string(iteration_of(**after)));
    }
  }
  // The run goes on after the kills, and the next write clears what they left.
  write(1000, {{"a", "after"}}, /*keep_last=*/1);
  EXPECT_EQ(names_in(checkpoints()), (std::vector<std::string>{"LATEST", "iter-001000"}));
}

class AppendLogTest : public RunDirTest {};

TEST_F(AppendLogTest, AppendsSizesAndTruncates) {
  AppendLog log(run_ / "metrics.jsonl");
  EXPECT_EQ(*log.size(), 0u);  // missing
  ASSERT_TRUE(log.append(R"({"i":1})").is_ok());
  const uint64_t after_first = *log.size();
  EXPECT_EQ(after_first, 8u);
  ASSERT_TRUE(log.append(R"({"i":2})").is_ok());
  EXPECT_EQ(*read_file(log.path()), "{\"i\":1}\n{\"i\":2}\n");

  ASSERT_TRUE(log.truncate_to(after_first).is_ok());
  EXPECT_EQ(*read_file(log.path()), "{\"i\":1}\n");
  ASSERT_TRUE(log.append(R"({"i":2})").is_ok());  // the cut row is written again exactly once
  EXPECT_EQ(*read_file(log.path()), "{\"i\":1}\n{\"i\":2}\n");
}

TEST_F(AppendLogTest, TruncatingPastTheEndIsAnError) {
  AppendLog log(run_ / "provenance.jsonl");
  ASSERT_TRUE(log.append("row").is_ok());
  Status s = log.truncate_to(100);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("provenance.jsonl: 4 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(*read_file(log.path()), "row\n");
  EXPECT_TRUE(AppendLog(run_ / "missing.jsonl").truncate_to(0).is_ok());
  EXPECT_FALSE(AppendLog(run_ / "missing.jsonl").truncate_to(1).is_ok());
}

}  // namespace
}  // namespace kz::loop
