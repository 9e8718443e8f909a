// `kz teach` end to end, without --check (teacher_check_test evaluates through the same library
// call): build/kz writes corpus.jsonl and the suite, the same seed writes the same bytes, and a bad
// flag is a usage error naming it. Needs KZ_BINARY_DIR (CTest sets it) to find build/kz.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/sandbox/process.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

class TeachCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("KZ_BINARY_DIR");
    ASSERT_TRUE(binary && *binary) << "KZ_BINARY_DIR is not set (run through ctest)";
    kz_ = fs::path(binary) / "kz";
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-teach-cli-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    scratch_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_, ignored);
  }

  RunResult teach(std::vector<std::string> args) {
    ProcessSpec spec;
    spec.argv = {kz_.string(), "teach"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = current_environment();
    auto result = run_process(spec, std::chrono::seconds(60));
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    return result.ok() ? *result : RunResult{};
  }

  fs::path kz_, scratch_;
};

TEST_F(TeachCli, WritesTheCorpusAndTheSameSeedWritesTheSameBytes) {
  std::vector<std::string> args = {"--count", "3", "--seed", "4", "--split", "heldout", "--formats", "triton",
                                   "--variants", "1"};
  auto first_args = args, second_args = args;
  first_args.insert(first_args.end(), {"--out", (scratch_ / "a").string()});
  second_args.insert(second_args.end(), {"--out", (scratch_ / "b").string()});
  RunResult first = teach(first_args), second = teach(second_args);
  ASSERT_TRUE(first.exit.exited && first.exit.exit_code == 0) << first.exit.describe() << first.stderr_text;
  ASSERT_TRUE(second.exit.exited && second.exit.exit_code == 0) << second.exit.describe() << second.stderr_text;

  auto lines = read_jsonl_log(scratch_ / "a" / "corpus.jsonl");
  ASSERT_TRUE(lines.ok()) << lines.status().to_string();
  ASSERT_EQ(lines->size(), 3u);
  for (const auto& line : *lines) {
    EXPECT_EQ(line.at("split"), "heldout");
    EXPECT_FALSE(line.at("heldout_reason").get<std::string>().empty());
    EXPECT_EQ(line.at("candidates").size(), 2u);  // triton, unfused and fused, one block size
    EXPECT_TRUE(fs::exists(scratch_ / "a" / "suite" / ("level" + line.at("level").dump()) /
                           (line.at("id").get<std::string>() + ".py")));
  }
  EXPECT_EQ(*read_file(scratch_ / "a" / "corpus.jsonl"), *read_file(scratch_ / "b" / "corpus.jsonl"));
}

TEST_F(TeachCli, ABadFlagIsAUsageErrorNamingIt) {
  RunResult result = teach({"--out", scratch_.string(), "--count", "2", "--split", "test"});
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 2) << result.exit.describe();
  EXPECT_NE(result.stderr_text.find("--split"), std::string::npos) << result.stderr_text;
  result = teach({"--out", scratch_.string(), "--count", "2", "--formats", "triton,cuda"});
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 2) << result.exit.describe();
  EXPECT_NE(result.stderr_text.find("--formats"), std::string::npos) << result.stderr_text;
  EXPECT_FALSE(fs::exists(scratch_ / "corpus.jsonl"));
}

}  // namespace
}  // namespace kz
