// The supervised start end to end, through build/kz as a user runs it: `kz train-tokenizer` on a
// hand-made corpus (test_corpus.h), then `kz sft` of a small model on the CPU with the compact
// prompts. Checks: the training loss falls and the evaluation loss is logged; the learning rate
// follows warm-up and cosine; the checkpoint is a Hugging Face dir that transformers loads with
// the engine's logits and chat template (tests/hf_sft.py); the in-process Generator tokenises the
// Coder's prompt to exactly the pair's prompt ids, and its greedy reply reproduces the memorised
// completion; a run stopped, or killed with SIGKILL, and resumed ends as one never stopped;
// errors name what is wrong.
// CTest sets KZ_SOURCE_DIR; KZ_BIN, KZ_PYTHON and KZ_HF_SFT are compiled in.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/llm/engine_generator.h"
#include "kz/llm/extract.h"
#include "kz/model/engine.h"
#include "kz/model/transformer.h"
#include "kz/sft/corpus.h"
#include "kz/sft/examples.h"
#include "test_corpus.h"

namespace kz::sft {
namespace {

using json = nlohmann::json;

constexpr int64_t kSteps = 80;  // enough for the 2-layer model to memorise six completions

fs::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return fs::path(dir && *dir ? dir : ".");
}

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("kz_sft_train_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(scratch()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

struct Ran {
  int code = -1;
  std::string output;  // stdout and stderr
};

Ran run(const std::string& args) {
  std::string command = std::string(KZ_BIN) + " " + args + " 2>&1";
  Ran ran;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return ran;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) ran.output.append(buffer, n);
  int status = ::pclose(pipe);
  ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

fs::path corpus_path() { return scratch() / "corpus.jsonl"; }
fs::path tokenizer_dir() { return scratch() / "tokenizer"; }
fs::path compact_prompts() { return source_dir() / "prompts" / "compact"; }

// A config of the shape the shipped tiny ones have, small enough for a test.
std::string config_text(const fs::path& corpus, int64_t steps, int64_t log_every, int64_t checkpoint_every) {
  return fmt::format(R"([model]
init = "tiny"
tokenizer = "{}"
hidden_size = 128
intermediate_size = 256
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 1024
initializer_range = 0.02
seed = 3

[data]
corpus = ["{}"]
prompts_dir = "{}"
max_seq_len = 1024

[train]
steps = {}
lr = 0.003
warmup_steps = 4
weight_decay = 0.0
batch_tokens = 4096
micro_batch_tokens = 4096
log_every = {}
eval_every = 10
checkpoint_every = {}
)",
                     tokenizer_dir().string(), corpus.string(), compact_prompts().string(), steps, log_every,
                     checkpoint_every);
}

fs::path write_config(const std::string& name, const std::string& text) {
  fs::path path = scratch() / name;
  std::ofstream(path) << text;
  return path;
}

// The corpus, the tokenizer and one run of kSteps steps, made once for the whole test binary.
struct Trained {
  fs::path run_dir = scratch() / "run";
  Ran tokenizer, sft;
  std::vector<json> metrics;
  Trained() {
    test::write_corpus(corpus_path().string(), 6, 8);
    tokenizer = run(fmt::format("train-tokenizer --corpus {} --out {} --vocab-size 1024 --prompts-dir {}",
                                corpus_path().string(), tokenizer_dir().string(), compact_prompts().string()));
    fs::path config = write_config("sft.toml", config_text(corpus_path(), kSteps, 1, 40));
    sft = run(fmt::format("sft --config {} --out {}", config.string(), run_dir.string()));
    auto rows = read_jsonl_log(run_dir / "metrics.jsonl");
    if (rows.ok()) metrics = *rows;
  }
  std::vector<json> rows(const std::string& kind) const {
    std::vector<json> out;
    for (const auto& r : metrics)
      if (r["kind"] == kind) out.push_back(r);
    return out;
  }
};

const Trained& trained() {
  static const Trained t;
  return t;
}

// The first training pair as kz sft built it (same corpus, tokenizer and template).
Example first_pair(const Tokenizer& tokenizer) {
  auto modules = load_corpus(corpus_path());
  EXPECT_TRUE(modules.ok());
  ExampleOptions options;
  options.prompts_dir = compact_prompts();
  auto set = build_examples({modules->front()}, options, tokenizer);
  EXPECT_TRUE(set.ok()) << set.status().to_string();
  return set->examples.front();
}

TEST(Sft, CommandsSucceed) {
  const Trained& t = trained();
  ASSERT_EQ(t.tokenizer.code, 0) << t.tokenizer.output;
  EXPECT_NE(t.tokenizer.output.find("bytes per token"), std::string::npos) << t.tokenizer.output;
  ASSERT_EQ(t.sft.code, 0) << t.sft.output;
  EXPECT_NE(t.sft.output.find(fmt::format("{} of {} steps", kSteps, kSteps)), std::string::npos) << t.sft.output;
  size_t last_lines = t.sft.output.rfind("step " + std::to_string(kSteps) + "/");
  ASSERT_NE(last_lines, std::string::npos) << t.sft.output;
  std::cerr << t.sft.output.substr(last_lines) << "\n";
}

TEST(Sft, TrainingLossFallsAndEvaluationLossIsLogged) {
  auto train = trained().rows("train");
  ASSERT_EQ(train.size(), static_cast<size_t>(kSteps));
  double first = train.front()["loss"].get<double>(), last = train.back()["loss"].get<double>();
  EXPECT_GT(first, 5.0);       // ~log(1024) from random init
  EXPECT_LT(last, first / 4);  // memorising six completions
  auto eval = trained().rows("eval");
  ASSERT_EQ(eval.size(), 9u);  // before the first step, then every 10
  EXPECT_EQ(eval.front()["step"], 0);
  EXPECT_EQ(eval.back()["step"], kSteps);
  EXPECT_GT(eval.back()["eval_tokens"].get<double>(), 0);
  EXPECT_LT(eval.back()["eval_loss"].get<double>(), eval.front()["eval_loss"].get<double>());
  EXPECT_GT(train.back()["tokens_per_s"].get<double>(), 0);
  auto summary = read_file(trained().run_dir / "summary.json");
  ASSERT_TRUE(summary.ok());
  EXPECT_NEAR(json::parse(*summary)["last_loss"].get<double>(), last, 1e-9);
}

TEST(Sft, LearningRateWarmsUpThenFollowsTheCosine) {
  auto train = trained().rows("train");
  ASSERT_EQ(train.size(), static_cast<size_t>(kSteps));
  const double lr = 0.003, min_lr = 0.1 * lr;
  const int warmup = 4;
  for (int s = 1; s <= kSteps; ++s) {
    double progress = static_cast<double>(s - 1 - warmup) / static_cast<double>(kSteps - warmup);
    double expected = s <= warmup ? lr * s / warmup : min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
    EXPECT_NEAR(train[s - 1]["lr"].get<double>(), expected, 1e-12) << "step " << s;
  }
}

TEST(Sft, CheckpointsAreHuggingFaceDirsThatTransformersLoads) {
  const fs::path final_dir = trained().run_dir / "final";
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(final_dir / file)) << file;
  EXPECT_TRUE(fs::exists(trained().run_dir / "checkpoints" / "iter-000040" / "model" / "model.safetensors"));
  auto latest = read_file(trained().run_dir / "checkpoints" / "LATEST");
  ASSERT_TRUE(latest.ok());
  EXPECT_NE(latest->find("iter-000080"), std::string::npos);

  auto tokenizer = Tokenizer::load(final_dir);
  ASSERT_TRUE(tokenizer.ok());
  Example pair = first_pair(*tokenizer);
  std::vector<int64_t> ids(pair.prompt_ids.begin(), pair.prompt_ids.end());
  ids.insert(ids.end(), pair.completion_ids.begin(), pair.completion_ids.end());
  std::vector<int64_t> positions = {0, static_cast<int64_t>(pair.prompt_ids.size()) - 1,
                                    static_cast<int64_t>(ids.size()) - 2};
  auto prompt = load_prompt_template(compact_prompts() / "coder_triton.toml");
  ASSERT_TRUE(prompt.ok());
  auto messages = coder_messages(*prompt, load_corpus(corpus_path())->front().reference);
  ASSERT_TRUE(messages.ok());
  json request = {{"ids", ids}, {"positions", positions}, {"messages", json::array()}};
  for (const auto& m : *messages) request["messages"].push_back({{"role", m.role}, {"content", m.content}});
  std::ofstream(scratch() / "hf_in.json") << request.dump();
  std::string command = fmt::format("{} {} {} {} {}", KZ_PYTHON, KZ_HF_SFT, final_dir.string(),
                                    (scratch() / "hf_in.json").string(), (scratch() / "hf_out.json").string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  json theirs = json::parse(*read_file(scratch() / "hf_out.json"));
  EXPECT_EQ(theirs["chat_ids"].get<std::vector<int64_t>>(),
            std::vector<int64_t>(pair.prompt_ids.begin(), pair.prompt_ids.end()));

  auto model = model::CausalLM::load(final_dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  c10::NoGradGuard no_grad;
  auto logits = (*model)->logits(at::tensor(ids).unsqueeze(0));
  ASSERT_TRUE(logits.ok());
  for (size_t i = 0; i < positions.size(); ++i) {
    auto hf = theirs["logits"][i].get<std::vector<float>>();
    at::Tensor ours = logits->select(0, 0).select(0, positions[i]);
    at::Tensor reference = at::tensor(hf);
    EXPECT_LT((ours - reference).abs().max().item<double>(), 1e-4) << "position " << positions[i];
  }
}

TEST(Sft, GeneratorPromptIsThePairsAndGreedyReplyReproducesTheCompletion) {
  model::EngineOptions engine;
  engine.model_dir = trained().run_dir / "final";
  auto generator = open_engine_generator(engine, {});
  ASSERT_TRUE(generator.ok()) << generator.status().to_string();
  auto tokenizer = Tokenizer::load(engine.model_dir);
  ASSERT_TRUE(tokenizer.ok());
  Example pair = first_pair(*tokenizer);
  // The request kz evolve's Coder phase sends for this module (loop/src/evolve.cpp).
  auto prompt = load_prompt_template(compact_prompts() / "coder_triton.toml");
  ASSERT_TRUE(prompt.ok());
  auto reference = load_corpus(corpus_path())->front().reference;
  auto messages = build_messages(*prompt, {{"reference_source", reference}});
  ASSERT_TRUE(messages.ok());
  GenerationRequest request;
  request.id = "coder/train-000000";
  request.messages = *messages;
  request.params.temperature = 0;
  request.params.max_tokens = static_cast<int>(pair.completion_ids.size()) + 8;
  auto results = (*generator)->generate({request});
  ASSERT_TRUE(results[0].ok()) << results[0].status().to_string();
  const Completion& reply = results[0]->front();
  EXPECT_EQ(reply.prompt_token_ids, std::vector<int64_t>(pair.prompt_ids.begin(), pair.prompt_ids.end()));
  size_t same = 0;
  while (same < reply.token_ids.size() && same < pair.completion_ids.size() &&
         reply.token_ids[same] == pair.completion_ids[same])
    ++same;
  std::cerr << "greedy reply: " << same << " of " << pair.completion_ids.size()
            << " completion tokens reproduced before the first difference\n"
            << reply.text << "\n";
  EXPECT_GE(same * 2, pair.completion_ids.size()) << reply.text;
  EXPECT_TRUE(extract_code(reply.text).has_value()) << reply.text;
}

// The metrics rows and final weights of two runs are the same (timings aside).
void expect_same_run(const fs::path& a, const fs::path& b) {
  auto rows_a = read_jsonl_log(a / "metrics.jsonl"), rows_b = read_jsonl_log(b / "metrics.jsonl");
  ASSERT_TRUE(rows_a.ok() && rows_b.ok());
  ASSERT_EQ(rows_a->size(), rows_b->size());
  for (size_t i = 0; i < rows_a->size(); ++i)
    for (const char* key : {"step", "loss", "lr", "grad_norm", "eval_loss"})
      if ((*rows_a)[i].contains(key)) {
        EXPECT_EQ((*rows_a)[i][key], (*rows_b)[i][key]) << b << " row " << i << " " << key;
      }
  auto model_a = model::CausalLM::load(a / "final"), model_b = model::CausalLM::load(b / "final");
  ASSERT_TRUE(model_a.ok() && model_b.ok());
  auto params_b = (*model_b)->named_parameters();
  for (const auto& p : (*model_a)->named_parameters()) EXPECT_TRUE(p.value().equal(params_b[p.key()])) << p.key();
}

TEST(Sft, KilledRunResumesToTheUninterruptedOne) {
  ASSERT_EQ(trained().tokenizer.code, 0);  // the corpus and the tokenizer
  fs::path config = write_config("killed.toml", config_text(corpus_path(), 12, 1, 1));
  fs::path whole = scratch() / "whole-12", killed = scratch() / "killed";
  Ran a = run(fmt::format("sft --config {} --out {}", config.string(), whole.string()));
  ASSERT_EQ(a.code, 0) << a.output;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // only async-signal-safe calls before exec
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execl(KZ_BIN, KZ_BIN, "sft", "--config", config.c_str(), "--out", killed.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // SIGKILL once the first checkpoint is in place: mid-step, mid-checkpoint or mid-log.
  int status = 0;
  bool ended = false;
  for (int waited_ms = 0; !fs::exists(killed / "checkpoints" / "LATEST") && waited_ms < 300000; waited_ms += 5) {
    if ((ended = ::waitpid(pid, &status, WNOHANG) == pid)) break;
    ::usleep(5000);
  }
  ASSERT_FALSE(ended) << "kz sft ended before its first checkpoint";
  ::usleep(100000);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  Ran resumed = run(fmt::format("sft --resume {}", killed.string()));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("(step 12 of 12)"), std::string::npos) << "the kill came after the last step";
  expect_same_run(whole, killed);
}

TEST(Sft, StoppedAndResumedRunEqualsAnUninterruptedOne) {
  ASSERT_EQ(trained().tokenizer.code, 0);  // the corpus and the tokenizer
  fs::path config = write_config("short.toml", config_text(corpus_path(), 8, 1, 3));
  fs::path whole = scratch() / "whole", split = scratch() / "split";
  Ran a = run(fmt::format("sft --config {} --out {}", config.string(), whole.string()));
  ASSERT_EQ(a.code, 0) << a.output;
  Ran b = run(fmt::format("sft --config {} --out {} --stop-at-step 5", config.string(), split.string()));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("stopped: kz sft --resume"), std::string::npos) << b.output;
  EXPECT_FALSE(fs::exists(split / "final"));
  Ran c = run(fmt::format("sft --resume {}", split.string()));
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("resuming from"), std::string::npos) << c.output;
  expect_same_run(whole, split);
  // Periodic checkpoints at 3 and 6, then the last; only the newest two kept.
  EXPECT_FALSE(fs::exists(split / "checkpoints" / "iter-000003"));
  EXPECT_TRUE(fs::exists(split / "checkpoints" / "iter-000006"));
  EXPECT_TRUE(fs::exists(split / "checkpoints" / "iter-000008"));
  // The checkpoint it resumed from (5) is gone by the end; the final model still has its tokenizer.
  EXPECT_TRUE(fs::exists(split / "final" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(split / "checkpoints" / "iter-000008" / "model" / "tokenizer.json"));
}

// Data parallel (docs/scale.md): 2 Gloo ranks to a checkpoint, resumed at world size 1, give the
// run of one process (the rows of each step dealt out to the ranks, the gradients averaged), up to
// float summation order; rank 1 writes nothing and says nothing.
TEST(Sft, DataParallelRunResumesAtWorldSizeOne) {
  ASSERT_EQ(trained().tokenizer.code, 0);  // the corpus and the tokenizer
  fs::path config = write_config("dp.toml", config_text(corpus_path(), 6, 1, 3));
  fs::path whole = scratch() / "dp-whole", split = scratch() / "dp-split";
  Ran a = run(fmt::format("sft --config {} --out {}", config.string(), whole.string()));
  ASSERT_EQ(a.code, 0) << a.output;
  Ran b = run(fmt::format("sft --nproc 2 --config {} --out {} --stop-at-step 3", config.string(), split.string()));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("data parallel: 2 ranks over gloo"), std::string::npos) << b.output;
  size_t stopped = 0;
  for (size_t at = b.output.find("stopped: kz sft --resume"); at != std::string::npos;
       at = b.output.find("stopped: kz sft --resume", at + 1))
    ++stopped;
  EXPECT_EQ(stopped, 1u) << "rank 0 alone reports: " << b.output;
  EXPECT_TRUE(fs::exists(split / "checkpoints" / "iter-000003"));
  Ran c = run(fmt::format("sft --resume {}", split.string()));
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("resuming from"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("data parallel"), std::string::npos) << c.output;
  auto rows_a = read_jsonl_log(whole / "metrics.jsonl"), rows_b = read_jsonl_log(split / "metrics.jsonl");
  ASSERT_TRUE(rows_a.ok() && rows_b.ok());
  ASSERT_EQ(rows_a->size(), rows_b->size());
  for (size_t i = 0; i < rows_a->size(); ++i)
    for (const char* key : {"loss", "grad_norm", "eval_loss"})
      if ((*rows_a)[i].contains(key)) {
        EXPECT_NEAR((*rows_a)[i][key].get<double>(), (*rows_b)[i][key].get<double>(), 1e-3) << "row " << i << " " << key;
      }
  auto model_a = model::CausalLM::load(whole / "final"), model_b = model::CausalLM::load(split / "final");
  ASSERT_TRUE(model_a.ok() && model_b.ok());
  auto params_b = (*model_b)->named_parameters();
  double worst = 0;
  for (const auto& p : (*model_a)->named_parameters()) {
    const double difference = (p.value() - params_b[p.key()]).abs().max().item<double>();
    EXPECT_LT(difference, 1e-3) << p.key();
    worst = std::max(worst, difference);
  }
  std::cout << "2 ranks then 1 against 1 throughout: max |weight difference| " << worst << "\n";
}

// A rank that fails stops the others, and the launcher names it.
TEST(Sft, DataParallelFailureNamesTheRank) {
  Ran ran = run(fmt::format("launch --nproc 2 -- sft --resume {}", (scratch() / "no-such-run").string()));
  EXPECT_NE(ran.code, 0);
  EXPECT_NE(ran.output.find("kz launch: rank "), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("the other ranks were stopped"), std::string::npos) << ran.output;
}

TEST(Sft, ErrorsNameTheLineTheKeyAndTheRun) {
  ASSERT_EQ(trained().sft.code, 0);
  std::string corpus = *read_file(corpus_path());
  fs::path bad_corpus = scratch() / "bad.jsonl";
  std::ofstream(bad_corpus) << corpus.substr(0, corpus.find('\n') + 1) << "{\"id\": \"broken\"\n";
  fs::path config = write_config("bad-corpus.toml", config_text(bad_corpus, 8, 1, 0));
  Ran ran = run(fmt::format("sft --config {} --out {}", config.string(), (scratch() / "bad-run").string()));
  EXPECT_NE(ran.code, 0);
  EXPECT_NE(ran.output.find("bad.jsonl:2: not valid JSON"), std::string::npos) << ran.output;
  config = write_config("bad-key.toml", config_text(corpus_path(), 8, 1, 0) + "lrr = 1\n");
  ran = run(fmt::format("sft --config {} --out {}", config.string(), (scratch() / "bad-key").string()));
  EXPECT_NE(ran.code, 0);
  EXPECT_NE(ran.output.find("unknown config key 'train.lrr'"), std::string::npos) << ran.output;
  config = write_config("again.toml", config_text(corpus_path(), 8, 1, 0));
  ran = run(fmt::format("sft --config {} --out {}", config.string(), trained().run_dir.string()));
  EXPECT_NE(ran.code, 0);
  EXPECT_NE(ran.output.find("already holds a kz sft run"), std::string::npos) << ran.output;
}

}  // namespace
}  // namespace kz::sft
