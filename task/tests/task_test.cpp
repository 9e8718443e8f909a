// Loading reference tasks: files, KernelBench-style directories, JSONL datasets, bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>

#include "kz/core/files.h"
#include "kz/task/task.h"

namespace kz {
namespace {

const char* kReference = R"(import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
n = 16
def get_inputs():
    return [torch.randn(n)]
def get_init_inputs():
    return []
)";

class TaskTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = *make_unique_dir(std::filesystem::temp_directory_path(), "kz-task-test-"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  fs::path write(const std::string& relative, const std::string& text) {
    fs::path path = dir_ / relative;
    fs::create_directories(path.parent_path());
    EXPECT_TRUE(write_file_atomic(path, text).is_ok());
    return path;
  }
  fs::path dir_;
};

TEST_F(TaskTest, LoadsOneFileWithItsStemAsId) {
  auto tasks = load_tasks(write("19_ReLU.py", kReference));
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ(tasks->front().id, "19_ReLU");
  EXPECT_EQ(tasks->front().source, kReference);
  EXPECT_EQ(tasks->front().level, 0);
}

TEST_F(TaskTest, LoadsKernelBenchLevelDirectories) {
  write("level1/19_ReLU.py", kReference);
  write("level2/3_Conv.py", kReference);
  write("level2/__init__.py", "");
  write("level2/notes.txt", "not a module");
  auto tasks = load_tasks(dir_);
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].id, "19_ReLU");
  EXPECT_EQ((*tasks)[0].level, 1);
  EXPECT_EQ((*tasks)[1].id, "3_Conv");
  EXPECT_EQ((*tasks)[1].level, 2);
}

TEST_F(TaskTest, LoadsJsonlRowsWithOptionalFields) {
  nlohmann::json a = {{"py_code", kReference}, {"id", "relu_a"}, {"ops", {"torch.relu"}}, {"level", 1}};
  nlohmann::json b = {{"py_code", kReference}, {"ops", "['torch.nn.functional.gelu', 'torch.matmul']"},
                      {"level", "level2"}};
  auto path = write("data.jsonl", a.dump() + "\n\n" + b.dump() + "\n");
  auto tasks = load_tasks(path);
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].id, "relu_a");
  EXPECT_EQ((*tasks)[0].ops, std::vector<std::string>{"torch.relu"});
  EXPECT_EQ((*tasks)[1].id, "data-3");
  EXPECT_EQ((*tasks)[1].ops, (std::vector<std::string>{"torch.nn.functional.gelu", "torch.matmul"}));
  EXPECT_EQ((*tasks)[1].level, 2);
  EXPECT_EQ((*tasks)[1].origin, path.string() + ":3");
}

TEST_F(TaskTest, RejectedProposerRowsAreSkipped) {
  nlohmann::json kept = {{"py_code", kReference}, {"id", "kept"}, {"status", "kept"}};
  nlohmann::json rejected = {{"py_code", ""}, {"id", "bad"}, {"status", "rejected"}, {"reason", "no code"}};
  auto tasks = load_tasks(write("modules.jsonl", kept.dump() + "\n" + rejected.dump() + "\n"));
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ(tasks->front().id, "kept");
}

TEST_F(TaskTest, MalformedJsonlNamesTheLine) {
  auto path = write("bad.jsonl", nlohmann::json{{"py_code", kReference}}.dump() + "\n{not json\n");
  auto tasks = load_tasks(path);
  ASSERT_FALSE(tasks.ok());
  EXPECT_NE(tasks.status().message().find("bad.jsonl:2"), std::string::npos) << tasks.status().message();
}

TEST_F(TaskTest, RowWithoutCodeIsAnError) {
  auto tasks = load_tasks(write("nocode.jsonl", R"({"id": "x"})"));
  ASSERT_FALSE(tasks.ok());
  EXPECT_NE(tasks.status().message().find("py_code"), std::string::npos);
}

TEST_F(TaskTest, ModuleMissingPiecesIsRejectedWithTheirNames) {
  auto tasks = load_tasks(write("broken.py", "import torch\nclass Model(torch.nn.Module):\n    pass\n"));
  ASSERT_FALSE(tasks.ok());
  const auto& message = tasks.status().message();
  EXPECT_NE(message.find("get_inputs"), std::string::npos) << message;
  EXPECT_NE(message.find("broken"), std::string::npos) << message;
}

TEST_F(TaskTest, DuplicateIdsAcrossLevelsAreRejected) {
  write("level1/1_Same.py", kReference);
  write("level2/1_Same.py", kReference);
  auto tasks = load_tasks(dir_);
  ASSERT_FALSE(tasks.ok());
  EXPECT_NE(tasks.status().message().find("duplicate task id '1_Same'"), std::string::npos);
}

TEST_F(TaskTest, MissingPathIsNotFound) {
  auto tasks = load_tasks(dir_ / "nope");
  ASSERT_FALSE(tasks.ok());
  EXPECT_EQ(tasks.status().code(), StatusCode::not_found);
}

TEST(TaskSuite, BundledSuiteLoads) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr);
  auto tasks = load_tasks(fs::path(source_dir) / "suite" / "kzbench");
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  EXPECT_GE(tasks->size(), 16u);
  for (const auto& task : *tasks) EXPECT_TRUE(task.level == 1 || task.level == 2) << task.id;
}

}  // namespace
}  // namespace kz
