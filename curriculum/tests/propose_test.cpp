// `kz propose` end to end: build/kz against a scripted OpenAI-compatible server
// (fake_proposer_server.py) whose replies are two valid modules, a renamed copy of the first, one
// that skips a requested API and one with no code. The JSONL rows say which were kept and why the
// others were rejected; kept rows load as tasks; a second run deduplicates against the first.
//
// Needs KZ_BINARY_DIR (CTest sets it) to find build/kz; the worker runs on the CPU.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/task/task.h"
#include "proposer_replies.h"

#ifndef KZ_TEST_PYTHON3
#define KZ_TEST_PYTHON3 "python3"
#endif
#ifndef KZ_FAKE_PROPOSER_SERVER
#define KZ_FAKE_PROPOSER_SERVER "curriculum/tests/fake_proposer_server.py"
#endif

namespace kz {
namespace {

namespace fs = std::filesystem;
using test::fenced;
using test::kGood;
using test::kGoodRenamed;

const char* kOther = R"PY(import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A gated projection: gelu(a @ P + bias) * sigmoid(b), summed over features."""

    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, a, b):
        h = torch.matmul(a, self.proj) + self.bias
        return (F.gelu(h) * torch.sigmoid(b)).sum(dim=-1)


batch_size = 64
seq = 512
dim = 1024
cpu_sizes = {"batch_size": 2, "seq": 8, "dim": 32}


def get_inputs():
    return [torch.randn(batch_size, seq, dim), torch.randn(batch_size, seq, dim)]


def get_init_inputs():
    return [dim]
)PY";

std::string replies_json() {
  std::string no_gelu = kGood;
  no_gelu.replace(no_gelu.find("F.gelu"), 6, "F.relu");
  return nlohmann::json::array({fenced("Here is a level 1 module.", kGood),
                                fenced("<think>rename things</think>Another one:", kGoodRenamed),
                                fenced("A gated projection:", kOther), fenced("Using relu instead:", no_gelu),
                                "I am sorry, I cannot write that module."})
      .dump();
}

std::vector<nlohmann::json> read_rows(const fs::path& path) {
  auto text = read_file(path);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  std::vector<nlohmann::json> rows;
  std::stringstream lines(text.ok() ? *text : "");
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

class ProposeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("KZ_BINARY_DIR");
    ASSERT_TRUE(binary && *binary) << "KZ_BINARY_DIR is not set (run through ctest)";
    kz_ = fs::path(binary) / "kz";
    ASSERT_TRUE(fs::exists(kz_)) << kz_;
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-propose-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
    ASSERT_TRUE(write_file_atomic(dir_ / "replies.json", replies_json()).is_ok());
    ProcessSpec spec;
    spec.argv = {KZ_TEST_PYTHON3, KZ_FAKE_PROPOSER_SERVER, (dir_ / "replies.json").string(), (dir_ / "port").string()};
    spec.env = current_environment();
    auto server = Process::spawn(spec);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::make_unique<Process>(std::move(*server));
    for (int i = 0; i < 100 && !fs::exists(dir_ / "port"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto port = read_file(dir_ / "port");
    ASSERT_TRUE(port.ok()) << "the fake server wrote no port";
    port_ = *port;
  }

  void TearDown() override {
    server_.reset();  // kills the server's process group
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  RunResult propose(std::vector<std::string> extra = {}) {
    ProcessSpec spec;
    spec.argv = {kz_.string(), "propose", "--model", "openai:http://127.0.0.1:" + port_ + "/v1:fake-proposer",
                 "--apis", "torch.nn.functional.gelu,torch.matmul", "--n", "5", "--out",
                 (dir_ / "modules.jsonl").string(), "--jobs", "2"};
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.env = current_environment();
    auto run = run_process(spec, std::chrono::seconds(400));
    EXPECT_TRUE(run.ok()) << run.status().to_string();
    return run.ok() ? *run : RunResult{};
  }

  fs::path kz_, dir_;
  std::string port_;
  std::unique_ptr<Process> server_;
};

TEST_F(ProposeTest, KeepsValidModulesRejectsTheRestAndDedupsAcrossRuns) {
  auto first = propose();
  ASSERT_TRUE(first.exit.exited && first.exit.exit_code == 0) << first.stdout_text << first.stderr_text;
  EXPECT_NE(first.stdout_text.find("proposed 5: kept 2, rejected 3 (apis 1, duplicate 1, no_code 1)"),
            std::string::npos)
      << first.stdout_text;

  auto rows = read_rows(dir_ / "modules.jsonl");
  ASSERT_EQ(rows.size(), 5u);
  std::vector<std::string> statuses;
  for (const auto& row : rows) statuses.push_back(row["status"]);
  EXPECT_EQ(statuses, (std::vector<std::string>{"kept", "rejected", "kept", "rejected", "rejected"}));
  for (const auto& row : rows) {
    for (const char* key : {"id", "py_code", "ops", "level", "status", "reason", "aten_ops", "fingerprint",
                            "runtime_ms", "model"})
      EXPECT_TRUE(row.contains(key)) << key << " in " << row.dump();
    EXPECT_EQ(row["ops"], nlohmann::json({"torch.nn.functional.gelu", "torch.matmul"}));
    EXPECT_EQ(row["level"], 1);
    EXPECT_EQ(row["model"], "openai:http://127.0.0.1:" + port_ + "/v1:fake-proposer");
  }
  EXPECT_EQ(rows[0]["reason"], "valid");
  EXPECT_EQ(rows[0]["fingerprint"].get<std::string>().size(), 32u);
  EXPECT_GT(rows[0]["runtime_ms"].get<double>(), 0);
  EXPECT_NE(rows[1]["reason"].get<std::string>().find("duplicate"), std::string::npos) << rows[1]["reason"];
  EXPECT_NE(rows[1]["reason"].get<std::string>().find(rows[0]["id"].get<std::string>()), std::string::npos);
  EXPECT_NE(rows[3]["reason"].get<std::string>().find("torch.nn.functional.gelu"), std::string::npos)
      << rows[3]["reason"];
  EXPECT_EQ(rows[3]["failed_check"], "apis");
  EXPECT_EQ(rows[4]["failed_check"], "no_code");
  EXPECT_EQ(rows[4]["py_code"], "");
  EXPECT_TRUE(fs::exists(dir_ / "modules-logs" / "requests.jsonl"));

  // Kept rows are tasks.
  std::string kept;
  for (const auto& row : rows)
    if (row["status"] == "kept") kept += row.dump() + "\n";
  ASSERT_TRUE(write_file_atomic(dir_ / "kept.jsonl", kept).is_ok());
  auto tasks = load_task_jsonl(dir_ / "kept.jsonl");
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].id, rows[0]["id"].get<std::string>());
  EXPECT_EQ((*tasks)[1].id, rows[2]["id"].get<std::string>());
  EXPECT_EQ((*tasks)[0].ops, (std::vector<std::string>{"torch.nn.functional.gelu", "torch.matmul"}));
  EXPECT_EQ((*tasks)[0].level, 1);
  EXPECT_EQ((*tasks)[0].source, kGood);

  // The server cycles through the same replies: everything valid is now a duplicate of a kept row.
  auto second = propose();
  ASSERT_TRUE(second.exit.exited && second.exit.exit_code == 0) << second.stdout_text << second.stderr_text;
  EXPECT_NE(second.stdout_text.find("kept 0, rejected 5 (apis 1, duplicate 3, no_code 1)"), std::string::npos)
      << second.stdout_text;
  rows = read_rows(dir_ / "modules.jsonl");
  ASSERT_EQ(rows.size(), 10u);
  std::set<std::string> ids;
  for (const auto& row : rows) ids.insert(row["id"]);
  EXPECT_EQ(ids.size(), 10u) << "ids are unique across runs";
}

// --config: the evaluations' TOML; its [worker] (seen here: scratch_root, keep_scratch) and
// [sandbox] (taken by the same assignment) apply to the validation workers.
TEST_F(ProposeTest, EvalConfigAppliesToValidation) {
  fs::create_directories(dir_ / "scratch");
  std::string config = "[worker]\nscratch_root = \"" + (dir_ / "scratch").string() +
                       "\"\nkeep_scratch = true\n";
  ASSERT_TRUE(write_file_atomic(dir_ / "eval.toml", config).is_ok());
  auto run = propose({"--config", (dir_ / "eval.toml").string()});
  ASSERT_TRUE(run.exit.exited && run.exit.exit_code == 0) << run.stdout_text << run.stderr_text;
  int validation_dirs = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "scratch" / ("kz-scratch-" + std::to_string(::geteuid()))))
    validation_dirs += entry.path().filename().string().rfind("kz-validate-", 0) == 0;
  EXPECT_GT(validation_dirs, 0) << "the config's scratch_root and keep_scratch were applied";

  ASSERT_TRUE(write_file_atomic(dir_ / "bad.toml", "[sandbox]\nmax_processes = \"many\"\n").is_ok());
  auto bad = propose({"--config", (dir_ / "bad.toml").string()});
  EXPECT_NE(bad.exit.exit_code, 0);
  EXPECT_NE(bad.stderr_text.find("bad.toml"), std::string::npos) << "the error names the file: " << bad.stderr_text;
  EXPECT_NE(bad.stderr_text.find("max_processes"), std::string::npos) << bad.stderr_text;
}

TEST_F(ProposeTest, UnknownApiIsAUsageErrorWithASuggestion) {
  ProcessSpec spec;
  spec.argv = {kz_.string(), "propose", "--model", "openai:http://127.0.0.1:" + port_ + "/v1:m", "--apis",
               "torch.nn.functional.gelux", "--out", (dir_ / "x.jsonl").string()};
  spec.env = current_environment();
  auto run = run_process(spec, std::chrono::seconds(60));
  ASSERT_TRUE(run.ok());
  EXPECT_NE(run->exit.exit_code, 0);
  EXPECT_NE(run->stderr_text.find("did you mean torch.nn.functional.gelu"), std::string::npos) << run->stderr_text;
  EXPECT_FALSE(fs::exists(dir_ / "x.jsonl"));
}

}  // namespace
}  // namespace kz
