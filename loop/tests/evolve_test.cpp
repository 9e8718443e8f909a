// `kz evolve` end to end, through build/kz (handed to kz-engine), real workers on the CPU (Triton
// under its interpreter) and real HTTP:
//  - configs/evolve-tiny-cpu.toml as shipped (tiny random-init models made by kz init-model, both
//    trainable): one full iteration, its run dir, logs, checkpoint and report; resuming adds one;
//  - a run whose roles are scripted OpenAI-compatible endpoints (scripted_roles_server.py: modules
//    chaining unary APIs, Triton kernels right half the time): modules reach the frontier and the
//    Coder phase has rewards to normalise; killed with SIGKILL in its second iteration and resumed,
//    it ends with the metrics, provenance and state of a run never killed; run as 2 data-parallel
//    ranks (kz evolve --nproc 2, Gloo), it writes the run dir one process writes, and each run
//    resumes at the other world size; the tiny trainable models on 2 ranks checkpoint the weights
//    one process does;
//  - a config with an unknown key is refused, naming the key.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <thread>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/sandbox/process.h"

#ifndef KZ_TEST_PYTHON3
#define KZ_TEST_PYTHON3 "python3"
#endif

namespace kz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path source_dir() { return std::getenv("KZ_SOURCE_DIR"); }

// Replaces every `from` in `text`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::vector<json> rows(const fs::path& path) {
  auto read = read_jsonl_log(path);
  EXPECT_TRUE(read.ok()) << read.status().to_string();
  return read.ok() ? *read : std::vector<json>{};
}

// Metrics rows without their timings (the only fields two equal runs may differ in).
std::vector<json> without_seconds(std::vector<json> metrics) {
  for (auto& row : metrics) row.erase("seconds");
  return metrics;
}

// A run's last checkpointed loop state, all but the logs' byte counts (which the timings' digits change).
json loop_state(const fs::path& run) {
  auto text = read_file(run / "checkpoints/iter-000002/state.json");
  json state = text.ok() ? json::parse(*text) : json::object();
  state.erase("logs");
  return state;
}

class EvolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("KZ_BINARY_DIR");
    ASSERT_TRUE(binary && *binary) << "KZ_BINARY_DIR is not set (run through ctest)";
    kz_ = fs::path(binary) / "kz";
    ASSERT_TRUE(fs::exists(fs::path(binary) / "kz-engine")) << "kz evolve needs kz-engine (libtorch)";
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-evolve-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
  }

  void TearDown() override {
    server_.reset();  // kills the server's process group
    std::error_code ignored;
    if (!HasFailure()) fs::remove_all(dir_, ignored);
  }

  ProcessSpec kz_spec(std::vector<std::string> args) const {
    ProcessSpec spec;
    spec.argv = {kz_.string()};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = current_environment();
    spec.cwd = source_dir();
    return spec;
  }

  RunResult kz(std::vector<std::string> args) const {
    auto run = run_process(kz_spec(std::move(args)), std::chrono::seconds(900));
    EXPECT_TRUE(run.ok()) << run.status().to_string();
    return run.ok() ? *run : RunResult{};
  }

  void start_scripted_server() {
    ProcessSpec spec;
    spec.argv = {KZ_TEST_PYTHON3, (source_dir() / "loop/tests/scripted_roles_server.py").string(),
                 (dir_ / "port").string()};
    spec.env = current_environment();
    auto server = Process::spawn(spec);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::make_unique<Process>(std::move(*server));
    for (int i = 0; i < 100 && !fs::exists(dir_ / "port"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto port = read_file(dir_ / "port");
    ASSERT_TRUE(port.ok()) << "the scripted server wrote no port";
    port_ = *port;
  }

  // The scripted run's config: both roles at the scripted endpoint, the four-API catalogue.
  fs::path scripted_config() const {
    std::string endpoint = "http://127.0.0.1:" + port_ + "/v1";
    std::string text = fmt_config(R"(
[run]
seed = 7
iterations = 2
catalogue = "loop/tests/data/unary_catalogue.toml"

[heldout]
suite = "suite/kzbench/level1"
tasks = 1

[proposer]
endpoint = "ENDPOINT"
endpoint_model = "scripted"
api_sets = 2
modules_per_set = 3
judge_attempts = 3

[api_sampler]
min_set_size = 2
max_set_size = 2

[frontier]
band_low = 0.2
band_high = 0.8

[coder]
endpoint = "ENDPOINT"
endpoint_model = "scripted"
tasks_per_iteration = 1
group_size = 3
generation_batch = 1

[eval]
config = "EVAL_CONFIG"
)",
                                  endpoint);
    // A fixed evaluation seed: two evaluations of one kernel (a batch's twins, a cache miss in one
    // run and a hit in another) then give one message, so two runs' logs can be compared whole.
    EXPECT_TRUE(write_file_atomic(dir_ / "eval.toml", "seed = 11\n").is_ok());
    text = replace_all(std::move(text), "EVAL_CONFIG", (dir_ / "eval.toml").string());
    fs::path path = dir_ / "scripted.toml";
    EXPECT_TRUE(write_file_atomic(path, text).is_ok());
    return path;
  }

  // configs/evolve-tiny-cpu.toml as shipped, its random-init models made in dir_ and its paths
  // pointing at them.
  void tiny_cpu_config(std::string& config) {
    for (auto [name, seed] : {std::pair{"tiny-proposer", "1"}, std::pair{"tiny-coder", "2"}}) {
      auto made = kz({"init-model", "--preset", "tiny", "--out", (dir_ / name).string(), "--seed", seed});
      ASSERT_EQ(made.exit.exit_code, 0) << made.stderr_text;
    }
    auto text = read_file(source_dir() / "configs/evolve-tiny-cpu.toml");
    ASSERT_TRUE(text.ok());
    config = replace_all(replace_all(*text, "runs/tiny-proposer", (dir_ / "tiny-proposer").string()),
                         "runs/tiny-coder", (dir_ / "tiny-coder").string());
  }

  // The tiny CPU config with the static curriculum and no held-out point at the start:
  // dir_/static.toml.
  void write_static_tiny_config() {
    std::string config;
    ASSERT_NO_FATAL_FAILURE(tiny_cpu_config(config));
    config = replace_all(config, "curriculum = \"frontier\"", "curriculum = \"static\"");
    config = replace_all(config, "static_suite = \"\"",
                         "static_suite = \"" + (source_dir() / "suite/kzbench/level1").string() + "\"");
    config = replace_all(config, "at_start = true", "at_start = false");
    ASSERT_TRUE(write_file_atomic(dir_ / "static.toml", config).is_ok());
  }

  static std::string fmt_config(std::string text, const std::string& endpoint) {
    return replace_all(std::move(text), "ENDPOINT", endpoint);
  }

  fs::path kz_, dir_;
  std::string port_;
  std::unique_ptr<Process> server_;
};

TEST_F(EvolveTest, TheTinyCpuConfigRunsAFullIterationAndResumesForAnother) {
  std::string config;
  ASSERT_NO_FATAL_FAILURE(tiny_cpu_config(config));
  ASSERT_TRUE(write_file_atomic(dir_ / "tiny.toml", config).is_ok());
  fs::path run = dir_ / "run";

  auto first = kz({"evolve", "--config", (dir_ / "tiny.toml").string(), "--out", run.string()});
  ASSERT_EQ(first.exit.exit_code, 0) << first.stderr_text;
  EXPECT_NE(first.stdout_text.find("1 iterations done"), std::string::npos) << first.stdout_text;

  // The held-out start (iteration 0), then one row per phase, each with the fields the report plots.
  auto metrics = rows(run / "metrics.jsonl");
  ASSERT_EQ(metrics.size(), 4u);
  std::vector<std::string> phases;
  for (const auto& row : metrics) {
    phases.push_back(row.at("phase"));
    EXPECT_EQ(row.at("iteration"), phases.size() == 1 ? 0 : 1);
    for (const char* key : {"frontier_size", "evaluations", "seconds", "proposer_steps", "coder_steps"})
      EXPECT_TRUE(row.contains(key)) << key << " missing in " << row.dump();
    for (const char* stage : {"generate", "evaluate", "train"}) EXPECT_TRUE(row["seconds"].contains(stage));
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"heldout", "proposer", "coder", "heldout"}));
  // Random weights write no code: every module is rejected with -1, and the held-out suite ran.
  EXPECT_EQ(metrics[1].at("reward_mean"), -1.0);
  for (size_t r : {0, 3}) {
    EXPECT_EQ(metrics[r].at("pass_at_1"), 0.0);
    EXPECT_EQ(metrics[r].at("samples"), 2);
  }
  for (const char* key : {"reward_mean", "correct_rate", "gate_on_share", "kl", "entropy", "clip_fraction"})
    EXPECT_TRUE(metrics[2].contains(key)) << key;

  // The held-out start's kernels, every proposal with its model and reason, then the held-out kernels.
  auto provenance = rows(run / "provenance.jsonl");
  ASSERT_EQ(provenance.size(), 8u);  // held-out 2 tasks x 1 sample, api_sets 2 x modules_per_set 2, held-out
  EXPECT_EQ(provenance[0].at("iteration"), 0);
  EXPECT_EQ(provenance[0].at("phase"), "heldout");
  provenance.erase(provenance.begin(), provenance.begin() + 2);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(provenance[r].at("kind"), "module");
    EXPECT_NE(provenance[r].at("model").get<std::string>().find("tiny-proposer"), std::string::npos);
    EXPECT_EQ(provenance[r].at("reward"), -1.0);
  }
  for (size_t r = 4; r < 6; ++r) {
    EXPECT_EQ(provenance[r].at("kind"), "kernel");
    EXPECT_EQ(provenance[r].at("phase"), "heldout");
    EXPECT_NE(provenance[r].at("model").get<std::string>().find("tiny-coder"), std::string::npos);
    EXPECT_TRUE(provenance[r].at("prompt").is_string());
  }
  for (const char* file : {"config.toml", "eval.toml", "run.json", "report.html", "checkpoints/LATEST",
                           "checkpoints/iter-000001/MANIFEST.json", "checkpoints/iter-000001/state.json",
                           "checkpoints/iter-000001/proposer/model/model.safetensors",
                           "checkpoints/iter-000001/coder/trainer/trainer_state.json",
                           "heldout/iter-000000/summary.json", "heldout/iter-000001/summary.json"})
    EXPECT_TRUE(fs::exists(run / file)) << file;

  // --iterations is the total: 1 again does nothing, 2 runs one more.
  auto again = kz({"evolve", "--resume", run.string(), "--iterations", "1"});
  ASSERT_EQ(again.exit.exit_code, 0) << again.stderr_text;
  EXPECT_EQ(rows(run / "metrics.jsonl").size(), 4u);
  auto more = kz({"evolve", "--resume", run.string(), "--iterations", "2"});
  ASSERT_EQ(more.exit.exit_code, 0) << more.stderr_text;
  metrics = rows(run / "metrics.jsonl");
  ASSERT_EQ(metrics.size(), 7u);  // a resumed run does not measure its start again
  EXPECT_EQ(metrics[4].at("iteration"), 2);
  EXPECT_TRUE(fs::exists(run / "checkpoints/iter-000002/state.json"));

  // A new run into a dir that holds one is refused.
  auto clash = kz({"evolve", "--config", (dir_ / "tiny.toml").string(), "--out", run.string()});
  EXPECT_NE(clash.exit.exit_code, 0);
  EXPECT_NE(clash.stderr_text.find("already holds a run"), std::string::npos) << clash.stderr_text;
}

// The ablation's static curriculum: no Proposer phase; each iteration's Coder tasks are the next
// share of the fixed suite, so two iterations cover twice as many distinct tasks.
TEST_F(EvolveTest, AStaticCurriculumTrainsTheCoderOnAFixedSuite) {
  ASSERT_NO_FATAL_FAILURE(write_static_tiny_config());
  fs::path run = dir_ / "run";

  auto done = kz({"evolve", "--config", (dir_ / "static.toml").string(), "--out", run.string(), "--iterations", "2"});
  ASSERT_EQ(done.exit.exit_code, 0) << done.stderr_text;
  std::vector<std::string> phases;
  for (const auto& row : rows(run / "metrics.jsonl")) phases.push_back(row.at("phase"));
  EXPECT_EQ(phases, (std::vector<std::string>{"coder", "heldout", "coder", "heldout"}));
  std::set<std::string> tasks;
  for (const auto& row : rows(run / "provenance.jsonl")) {
    EXPECT_EQ(row.at("kind"), "kernel") << "a static run proposes no module: " << row.dump();
    if (row.at("phase") == "coder") tasks.insert(row.at("task_id").get<std::string>());
  }
  EXPECT_EQ(tasks.size(), 4u);  // tasks_per_iteration 2, two iterations, 15 tasks to cycle through
}

// The tiny trainable models on two ranks: both load them, rank 0's weights are broadcast, the
// gradient sync is attached, the Coder's two tasks are split between the ranks, and rank 0's
// checkpoint holds the weights one process ends with (random weights write no code, so no update
// runs here: rl_policy_update_dp_test compares updates).
TEST_F(EvolveTest, TwoRanksOfTheTinyModelsCheckpointWhatOneProcessDoes) {
  ASSERT_NO_FATAL_FAILURE(write_static_tiny_config());
  const std::string config = (dir_ / "static.toml").string();
  fs::path one = dir_ / "one", two = dir_ / "two";
  auto alone = kz({"evolve", "--config", config, "--out", one.string(), "--iterations", "1"});
  ASSERT_EQ(alone.exit.exit_code, 0) << alone.stderr_text;
  auto ranks = kz({"evolve", "--nproc", "2", "--config", config, "--out", two.string(), "--iterations", "1"});
  ASSERT_EQ(ranks.exit.exit_code, 0) << ranks.stderr_text;
  EXPECT_NE(ranks.stderr_text.find("(2 ranks)"), std::string::npos) << ranks.stderr_text;
  EXPECT_EQ(without_seconds(rows(two / "metrics.jsonl")), without_seconds(rows(one / "metrics.jsonl")));
  EXPECT_EQ(rows(two / "provenance.jsonl"), rows(one / "provenance.jsonl"));
  for (const char* role : {"coder", "proposer"}) {
    const fs::path weights = fs::path("checkpoints/iter-000001") / role / "model/model.safetensors";
    auto mine = read_file(two / weights), theirs = read_file(one / weights);
    ASSERT_TRUE(mine.ok() && theirs.ok()) << weights;
    EXPECT_TRUE(*mine == *theirs) << weights;
  }
}

TEST_F(EvolveTest, AKilledAndResumedRunEndsAsOneNeverKilled) {
  start_scripted_server();
  fs::path config = scripted_config();
  fs::path whole = dir_ / "whole", killed = dir_ / "killed";

  auto reference = kz({"evolve", "--config", config.string(), "--out", whole.string()});
  ASSERT_EQ(reference.exit.exit_code, 0) << reference.stderr_text;
  auto metrics = rows(whole / "metrics.jsonl");
  ASSERT_EQ(metrics.size(), 7u);  // the held-out start, then 3 phases x 2 iterations
  // The scripted roles give the loop something to do: modules judged, the frontier filled, the
  // Coder's groups rewarded with some correct and some incorrect kernels.
  int judged = 0, joined = 0, coder_samples = 0;
  for (const auto& row : metrics) {
    if (row["phase"] == "proposer") judged += row.at("judged").get<int>(), joined += row.at("joined_frontier").get<int>();
    if (row["phase"] == "coder") coder_samples += row.at("samples").get<int>();
  }
  EXPECT_GT(judged, 0);
  EXPECT_GT(joined, 0) << "no module reached the frontier";
  EXPECT_GT(coder_samples, 0);
  int kernels = 0;
  for (const auto& row : rows(whole / "provenance.jsonl"))
    if (row["kind"] == "kernel" && row["phase"] != "heldout") {  // the scripted Coder writes no held-out code
      ++kernels;
      EXPECT_TRUE(row.at("status") == "ok" || row.at("status") == "incorrect") << row.dump();
      if (row["file"].is_string()) EXPECT_TRUE(fs::exists(whole / row["file"].get<std::string>()));
    }
  EXPECT_GT(kernels, 0);

  // The same run, killed once its second iteration has logged a kernel, then resumed.
  auto started = Process::spawn(kz_spec({"evolve", "--config", config.string(), "--out", killed.string()}));
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  Process run = std::move(*started);
  bool in_second = false;
  for (int i = 0; i < 3000 && !in_second; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto log = read_file(killed / "provenance.jsonl");
    in_second = log.ok() && log->find(R"("iteration":2,"kind":"kernel")") != std::string::npos;
    if (run.wait_for(std::chrono::milliseconds(0))) break;
  }
  ASSERT_TRUE(in_second) << "the run never reached its second iteration's kernels: " << run.stderr_tail();
  run.kill_group(SIGKILL);
  auto exit = run.kill_and_reap();
  EXPECT_EQ(exit.term_signal, SIGKILL) << exit.describe();

  auto resumed = kz({"evolve", "--resume", killed.string()});
  ASSERT_EQ(resumed.exit.exit_code, 0) << resumed.stderr_text;
  EXPECT_NE(resumed.stderr_text.find("resumed from"), std::string::npos) << resumed.stderr_text;
  EXPECT_EQ(without_seconds(rows(killed / "metrics.jsonl")), without_seconds(metrics));
  EXPECT_EQ(rows(killed / "provenance.jsonl"), rows(whole / "provenance.jsonl"));
  EXPECT_EQ(loop_state(killed), loop_state(whole));
}

// `kz evolve --nproc 2`: two Gloo ranks share every phase's tasks (the judge's modules, the
// Coder's tasks, the held-out suite) and write one run dir, the one a single process writes: the
// same files, metrics, provenance, loop state and kernels. Each run then resumes at the other
// world size for a third iteration, and the two still agree.
TEST_F(EvolveTest, TwoRanksWriteTheRunDirOfOneProcess) {
  start_scripted_server();
  fs::path config = scripted_config();
  fs::path one = dir_ / "one", two = dir_ / "two";
  // Two Coder tasks and two held-out tasks, so that both ranks have some in every phase.
  const std::vector<std::string> sets = {"--set", "coder.tasks_per_iteration=2", "--set", "heldout.tasks=2"};
  auto run = [&](const fs::path& out, std::vector<std::string> args) {
    args.insert(args.end(), {"--config", config.string(), "--out", out.string()});
    args.insert(args.end(), sets.begin(), sets.end());
    return kz(args);
  };
  auto alone = run(one, {"evolve"});
  ASSERT_EQ(alone.exit.exit_code, 0) << alone.stderr_text;
  auto ranks = run(two, {"evolve", "--nproc", "2"});
  ASSERT_EQ(ranks.exit.exit_code, 0) << ranks.stderr_text;
  EXPECT_NE(ranks.stderr_text.find("data parallel: 2 ranks over gloo"), std::string::npos) << ranks.stderr_text;

  auto metrics = without_seconds(rows(two / "metrics.jsonl"));
  EXPECT_EQ(metrics, without_seconds(rows(one / "metrics.jsonl")));
  EXPECT_EQ(rows(two / "provenance.jsonl"), rows(one / "provenance.jsonl"));
  EXPECT_EQ(loop_state(two), loop_state(one));
  std::set<std::string> coder_tasks;
  for (const auto& row : rows(two / "provenance.jsonl"))
    if (row["kind"] == "kernel" && row["phase"] == "coder") coder_tasks.insert(row.at("task_id").get<std::string>());
  EXPECT_GE(coder_tasks.size(), 2u) << "the Coder phase must have had a task on each rank";

  // The same files; the kernels, modules and prompts byte for byte, every verdict in the results.
  auto files = [](const fs::path& dir) {
    std::set<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(dir))
      if (entry.is_regular_file()) out.insert(fs::relative(entry.path(), dir).string());
    return out;
  };
  const auto written = files(two);
  EXPECT_EQ(written, files(one));
  for (const std::string& file : written) {
    if (file.starts_with("iterations/") && !file.ends_with(".jsonl")) {
      auto mine = read_file(two / file), theirs = read_file(one / file);
      ASSERT_TRUE(mine.ok() && theirs.ok()) << file;
      EXPECT_EQ(*mine, *theirs) << file;
    } else if (file.ends_with("-results.jsonl")) {
      EXPECT_EQ(rows(two / file).size(), rows(one / file).size()) << file;
    }
  }

  auto resumed_alone = kz({"evolve", "--resume", two.string(), "--iterations", "3"});
  ASSERT_EQ(resumed_alone.exit.exit_code, 0) << resumed_alone.stderr_text;
  auto resumed_on_two = kz({"evolve", "--nproc", "2", "--resume", one.string(), "--iterations", "3"});
  ASSERT_EQ(resumed_on_two.exit.exit_code, 0) << resumed_on_two.stderr_text;
  auto third = without_seconds(rows(two / "metrics.jsonl"));
  EXPECT_EQ(third.size(), metrics.size() + 3) << "a third iteration: proposer, coder, held-out";
  EXPECT_EQ(third, without_seconds(rows(one / "metrics.jsonl")));
  EXPECT_EQ(rows(two / "provenance.jsonl"), rows(one / "provenance.jsonl"));
}

TEST_F(EvolveTest, TheCodersSamplesCanGoToAnEvaluationService) {
  start_scripted_server();
  auto spawned = Process::spawn(kz_spec({"serve-eval", "--port", "0", "--device", "cpu"}));
  ASSERT_TRUE(spawned.ok()) << spawned.status().to_string();
  Process service = std::move(*spawned);
  std::smatch url;
  static const std::regex serving(R"(serving evaluations on (http://127\.0\.0\.1:[0-9]+)/v1)");
  std::string log;
  for (int i = 0; i < 600 && !std::regex_search(log, url, serving); ++i) {
    ASSERT_FALSE(service.wait_for(std::chrono::milliseconds(100))) << "kz serve-eval exited: " << service.stderr_tail();
    log = service.stderr_tail();
  }
  ASSERT_FALSE(url.empty()) << log;
  auto text = read_file(scripted_config());
  ASSERT_TRUE(text.ok());
  std::string remote = replace_all(*text, "[eval]\n", "[eval]\nurl = \"" + url[1].str() + "\"\n");
  ASSERT_TRUE(write_file_atomic(dir_ / "remote.toml", remote).is_ok());

  fs::path run = dir_ / "remote";
  auto evolved = kz({"evolve", "--config", (dir_ / "remote.toml").string(), "--out", run.string(), "--iterations", "1"});
  ASSERT_EQ(evolved.exit.exit_code, 0) << evolved.stderr_text;
  int ok = 0, incorrect = 0;
  for (const auto& row : rows(run / "provenance.jsonl"))
    if (row["kind"] == "kernel" && row["phase"] != "heldout") {
      ok += row["status"] == "ok";
      incorrect += row["status"] == "incorrect";
    }
  EXPECT_GT(ok, 0);
  EXPECT_GT(incorrect, 0);
  auto results = read_file(run / "iterations/iter-000001/judge-results.jsonl");
  ASSERT_TRUE(results.ok()) << "the service's verdicts are logged as they arrive";
  EXPECT_NE(results->find("\"status\""), std::string::npos);
  // The service did them: its count of finished evaluations covers every kernel with code.
  ProcessSpec health;
  health.argv = {KZ_TEST_PYTHON3, "-c",
                 "import json, sys, urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1] + "
                 "'/v1/health'))['done'])",
                 url[1].str()};
  health.env = current_environment();
  auto done = run_process(health, std::chrono::seconds(30));
  ASSERT_TRUE(done.ok() && done->exit.exit_code == 0) << (done.ok() ? done->stderr_text : done.status().to_string());
  EXPECT_GE(std::stoi(done->stdout_text), ok + incorrect);
  service.kill_and_reap();
}

TEST_F(EvolveTest, ARunStopsWhereItsTrainingBudgetIsSpent) {
  start_scripted_server();
  fs::path run = dir_ / "budget";
  // --set over the file: iterations 5, but a budget of one evaluation, spent by the first judge.
  auto done = kz({"evolve", "--config", scripted_config().string(), "--out", run.string(), "--set", "run.iterations=5",
                  "--set", "run.max_evaluations = 1", "--set", "reward.mode=ungated"});
  ASSERT_EQ(done.exit.exit_code, 0) << done.stderr_text;
  EXPECT_NE(done.stderr_text.find("the training budget is spent"), std::string::npos) << done.stderr_text;
  std::vector<std::string> phases;
  int64_t training = 0, all = 0;
  for (const auto& row : rows(run / "metrics.jsonl")) {
    phases.push_back(row.at("phase"));
    training = row.at("training_evaluations").get<int64_t>(), all = row.at("evaluations").get<int64_t>();
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"heldout", "proposer", "coder", "heldout"}));
  EXPECT_GE(training, 1);
  EXPECT_GE(all, training);  // the held-out suite's evaluations count in the total only
  auto saved = read_file(run / "config.toml");
  ASSERT_TRUE(saved.ok());
  EXPECT_NE(saved->find("max_evaluations = 1\n"), std::string::npos) << "the overrides are the run's config";
  EXPECT_NE(saved->find("mode = \"ungated\""), std::string::npos);

  auto bad = kz({"evolve", "--config", scripted_config().string(), "--out", (dir_ / "bad").string(), "--set",
                 "run.iteratoins=2"});
  EXPECT_NE(bad.exit.exit_code, 0);
  EXPECT_NE(bad.stderr_text.find("run.iteratoins"), std::string::npos) << bad.stderr_text;
  auto resumed = kz({"evolve", "--resume", run.string(), "--set", "run.iterations=6"});
  EXPECT_NE(resumed.exit.exit_code, 0) << "a resumed run keeps its config";
}

TEST_F(EvolveTest, AnUnknownConfigKeyIsNamed) {
  ASSERT_TRUE(write_file_atomic(dir_ / "bad.toml", "[coder]\ngroup_sise = 4\n").is_ok());
  auto run = kz({"evolve", "--config", (dir_ / "bad.toml").string(), "--out", (dir_ / "run").string()});
  EXPECT_NE(run.exit.exit_code, 0);
  EXPECT_NE(run.stderr_text.find("coder.group_sise"), std::string::npos) << run.stderr_text;
  ASSERT_TRUE(write_file_atomic(dir_ / "type.toml", "[coder]\ngroup_size = \"four\"\n").is_ok());
  run = kz({"evolve", "--config", (dir_ / "type.toml").string(), "--out", (dir_ / "run2").string()});
  EXPECT_NE(run.stderr_text.find("coder.group_size"), std::string::npos) << run.stderr_text;
}

// A trainable role's update trains softmax(logits / temperature): top-p's truncation and greedy
// decoding, which it cannot follow, are refused; with one shared model, so are two temperatures.
TEST_F(EvolveTest, ATrainableRoleThatSamplesOffPolicyIsRefused) {
  std::string config = (source_dir() / "configs/evolve-tiny-cpu.toml").string();  // refused before any model loads
  auto run = kz({"evolve", "--config", config, "--out", (dir_ / "run").string(), "--set", "coder.top_p=0.95"});
  EXPECT_NE(run.exit.exit_code, 0);
  EXPECT_NE(run.stderr_text.find("[coder]: a trainable role samples with top_p 1"), std::string::npos)
      << run.stderr_text;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.jsonl")) << "refused before anything ran";
  run = kz({"evolve", "--config", config, "--out", (dir_ / "run2").string(), "--set", "proposer.temperature=0.0"});
  EXPECT_NE(run.stderr_text.find("[proposer]: a trainable role"), std::string::npos) << run.stderr_text;
  run = kz({"evolve", "--config", config, "--out", (dir_ / "run3").string(), "--set", "run.shared_policy=true",
            "--set", "coder.temperature=0.8"});
  EXPECT_NE(run.stderr_text.find("temperature must be equal"), std::string::npos) << run.stderr_text;
}

}  // namespace
}  // namespace kz
