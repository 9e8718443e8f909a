// The supervised start's data path without libtorch: the corpus reader and its errors, the
// prompt -> completion pairs (the Proposer's prompt checked against ProposerPipeline's own
// request), the filters and the fusion draw, the train / eval split, rows with their loss masks,
// packing, the plan of steps and micro-batches, the config and the shipped configs, and the
// corpus tokenizer. CTest sets KZ_SOURCE_DIR (prompts/, configs/).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "kz/core/config_fields.h"
#include "kz/core/files.h"
#include "kz/core/toml.h"
#include "kz/curriculum/proposer.h"
#include "kz/llm/extract.h"
#include "kz/model/chat_template.h"
#include "kz/model/init_model.h"
#include "kz/model/tokenizer_train.h"
#include "kz/sft/batches.h"
#include "kz/sft/corpus.h"
#include "kz/sft/corpus_tokenizer.h"
#include "kz/sft/examples.h"
#include "kz/sft/sft_config.h"
#include "test_corpus.h"

namespace kz::sft {
namespace {

fs::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return fs::path(dir && *dir ? dir : ".");
}

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("kz_sft_data_test_" + std::to_string(::getpid()));
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

// The test corpus (6 train modules, 2 heldout) and a tokenizer trained on it and prompts/.
struct Fixture {
  fs::path corpus = scratch() / "corpus.jsonl";
  std::vector<CorpusModule> modules;
  std::optional<Tokenizer> tokenizer;
  Fixture() {
    test::write_corpus(corpus.string(), 6, 8);
    auto loaded = load_corpus(corpus);
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    if (loaded.ok()) modules = *loaded;
    CorpusTokenizerOptions options;
    options.corpora = {corpus};
    options.prompts_dir = source_dir() / "prompts";
    options.vocab_size = 1024;
    options.out_dir = scratch() / "tokenizer";
    auto report = train_corpus_tokenizer(options);
    EXPECT_TRUE(report.ok()) << report.status().to_string();
    auto t = Tokenizer::load(options.out_dir);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (t.ok()) tokenizer = *t;
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

ExampleOptions coder_options() {
  ExampleOptions o;
  o.prompts_dir = source_dir() / "prompts";
  o.max_seq_len = 1 << 20;  // the full templates run to thousands of this small vocabulary's tokens
  return o;
}

std::string decode(const std::vector<TokenId>& ids) { return fixture().tokenizer->decode(ids); }

// ---- the corpus ----------------------------------------------------------------------------

std::string error_of(const std::string& lines) {
  fs::path path = scratch() / "bad.jsonl";
  std::ofstream(path) << lines;
  auto loaded = load_corpus(path);
  EXPECT_FALSE(loaded.ok());
  return loaded.ok() ? "" : loaded.status().message();
}

std::string row_without(const std::string& key) {
  auto row = test::corpus_row(test::unary_ops()[0], 0, 1);
  row.erase(key);
  return row.dump();
}

TEST(Corpus, ReadsEveryField) {
  const auto& m = fixture().modules;
  ASSERT_EQ(m.size(), 8u);
  EXPECT_EQ(m[0].id, "train-000000");
  EXPECT_EQ(m[0].split, "train");
  EXPECT_EQ(m[7].split, "heldout");
  EXPECT_EQ(m[0].apis, std::vector<std::string>{"torch.relu"});
  EXPECT_EQ(m[0].ops, "relu(x)");
  ASSERT_EQ(m[0].candidates.size(), 6u);
  EXPECT_EQ(m[0].candidates[2].fusion, "fused");
  EXPECT_EQ(m[0].candidates[2].block_size, 512);
  EXPECT_EQ(m[0].candidates[3].verdict, std::optional<std::string>("incorrect"));
  EXPECT_FALSE(m[0].candidates[4].verdict.has_value());
}

TEST(Corpus, ErrorsNameTheFileLineAndField) {
  std::string good = test::corpus_row(test::unary_ops()[1], 1, 8).dump() + "\n";
  std::string msg = error_of(good + "{\"id\": \"x\",\n");
  EXPECT_NE(msg.find("bad.jsonl:2: not valid JSON"), std::string::npos) << msg;
  msg = error_of(good + "\n" + row_without("reference") + "\n");
  EXPECT_NE(msg.find("bad.jsonl:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing field 'reference'"), std::string::npos) << msg;
  auto row = test::corpus_row(test::unary_ops()[0], 0, 1);
  row["candidates"][1].erase("verdict");
  msg = error_of(row.dump());
  EXPECT_NE(msg.find("missing field 'candidates[1].verdict'"), std::string::npos) << msg;
  row = test::corpus_row(test::unary_ops()[0], 0, 1);
  row["level"] = "one";
  msg = error_of(row.dump());
  EXPECT_NE(msg.find("field 'level' must be a number, not string"), std::string::npos) << msg;
  row["level"] = 1;
  row["split"] = "validation";
  EXPECT_NE(error_of(row.dump()).find("\"validation\", not \"train\" or \"heldout\""), std::string::npos);
  msg = error_of(good + good);
  EXPECT_NE(msg.find("bad.jsonl:2: id 'train-000001' appears on an earlier line"), std::string::npos) << msg;
  EXPECT_NE(error_of("[1, 2]\n").find("bad.jsonl:1: not a JSON object"), std::string::npos);
}

// ---- pairs -----------------------------------------------------------------------------------

TEST(Pairs, FencedReplyGivesTheCodeBackThroughExtract) {
  std::string code = test::triton_source(test::unary_ops()[0], "relu_kernel", 256);
  EXPECT_EQ(extract_code(fenced_reply(code)), std::optional<std::string>(code));
  code.pop_back();  // no final newline: extraction adds it
  EXPECT_EQ(extract_code(fenced_reply(code)), std::optional<std::string>(code + "\n"));
}

TEST(Pairs, CoderPairIsTheRenderedTemplateThenTheFencedCandidate) {
  const auto& f = fixture();
  auto set = build_examples({f.modules[0]}, coder_options(), *f.tokenizer);
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ASSERT_EQ(set->examples.size(), 1u);
  const Example& e = set->examples[0];
  auto prompt = load_prompt_template(source_dir() / "prompts" / "coder_triton.toml");
  ASSERT_TRUE(prompt.ok());
  auto messages = build_messages(*prompt, {{"reference_source", f.modules[0].reference}});
  ASSERT_TRUE(messages.ok());
  std::vector<ChatTurn> turns;
  for (const auto& m : *messages) turns.push_back({m.role, m.content});
  EXPECT_EQ(e.prompt_ids, f.tokenizer->encode(render_chatml(turns, true, f.tokenizer->chat_template())));
  EXPECT_TRUE(decode(e.prompt_ids).ends_with("<|im_start|>assistant\n"));
  std::string completion = decode(e.completion_ids);
  ASSERT_TRUE(completion.ends_with("```<|im_end|>")) << completion;
  EXPECT_EQ(e.completion_ids.back(), *f.tokenizer->token_to_id("<|im_end|>"));
  auto code = extract_code(completion.substr(0, completion.size() - std::string("<|im_end|>").size()));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(code->find("relu_kernel[(triton.cdiv(n, "), std::string::npos) << *code;
  EXPECT_FALSE(e.fused);  // the default draw: mostly unfused
}

class RecordingGenerator : public Generator {
 public:
  std::vector<Result<std::vector<Completion>>> generate(const std::vector<GenerationRequest>& requests) override {
    std::vector<Result<std::vector<Completion>>> out;
    for (const auto& r : requests) {
      requests_.push_back(r);
      Completion c;
      c.text = "no code here";
      out.push_back(std::vector<Completion>{c});
    }
    return out;
  }
  std::string describe() const override { return "recording"; }
  std::vector<GenerationRequest> requests_;
};

TEST(Pairs, ProposerPromptIsTheOneTheProposerPipelineSends) {
  RecordingGenerator generator;
  ProposerOptions options;
  options.n = 1;
  options.level = 2;
  options.prompts_dir = source_dir() / "prompts";
  auto pipeline = ProposerPipeline::create(generator, options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().to_string();
  ApiEntry relu{"torch.relu", "activation", {"relu"}}, add{"torch.add", "elementwise", {"add"}};
  auto proposed = pipeline->propose({{relu, add}});
  ASSERT_TRUE(proposed.ok()) << proposed.status().to_string();
  ASSERT_EQ(generator.requests_.size(), 1u);
  auto prompt = load_prompt_template(options.prompts_dir / "proposer.toml");
  ASSERT_TRUE(prompt.ok());
  auto ours = proposer_messages(*prompt, {"torch.relu", "torch.add"}, 2);
  ASSERT_TRUE(ours.ok());
  const auto& theirs = generator.requests_[0].messages;
  ASSERT_EQ(ours->size(), theirs.size());
  for (size_t i = 0; i < theirs.size(); ++i) {
    EXPECT_EQ((*ours)[i].role, theirs[i].role);
    EXPECT_EQ((*ours)[i].content, theirs[i].content);
  }
}

TEST(Pairs, ProposerPairEndsInTheFencedReference) {
  const auto& f = fixture();
  ExampleOptions o = coder_options();
  o.role = Role::proposer;
  auto set = build_examples({f.modules[1]}, o, *f.tokenizer);
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ASSERT_EQ(set->examples.size(), 1u);
  EXPECT_NE(decode(set->examples[0].prompt_ids).find("- torch.sigmoid\n"), std::string::npos);
  EXPECT_EQ(decode(set->examples[0].completion_ids), fenced_reply(f.modules[1].reference) + "<|im_end|>");
}

// The loop's sampler lists an API set in any order: a Proposer pair lists its module's APIs in an
// order shuffled by the module's id, every one of them, the same in every build.
TEST(Pairs, ProposerPromptListsTheApisInAnOrderFixedByTheModule) {
  const auto& f = fixture();
  ExampleOptions o = coder_options();
  o.role = Role::proposer;
  CorpusModule module = f.modules[1];
  module.apis = {"torch.a", "torch.b", "torch.c", "torch.d", "torch.e", "torch.f"};
  auto listed = [&](const CorpusModule& m) {
    auto set = build_examples({m}, o, *f.tokenizer);
    EXPECT_TRUE(set.ok()) << set.status().to_string();
    std::string prompt = set.ok() && !set->examples.empty() ? decode(set->examples[0].prompt_ids) : "";
    std::vector<std::pair<size_t, std::string>> at;
    for (const auto& api : m.apis) {
      auto pos = prompt.find("- " + api);
      EXPECT_NE(pos, std::string::npos) << api << " is not listed";
      at.emplace_back(pos, api);
    }
    std::sort(at.begin(), at.end());
    std::vector<std::string> order;
    for (const auto& [pos, api] : at) order.push_back(api);
    return order;
  };
  EXPECT_EQ(listed(module), listed(module));
  bool shuffled = false;
  for (int k = 0; k < 4 && !shuffled; ++k) {
    module.id = "module-" + std::to_string(k);
    shuffled = listed(module) != module.apis;
  }
  EXPECT_TRUE(shuffled) << "the APIs are listed in the module's own order";
}

std::vector<std::string> labels(const ExampleOptions& o, const std::vector<CorpusModule>& modules) {
  auto set = build_examples(modules, o, *fixture().tokenizer);
  EXPECT_TRUE(set.ok()) << set.status().to_string();
  std::vector<std::string> out;
  if (set.ok())
    for (const auto& e : set->examples) out.push_back(e.label);
  std::sort(out.begin(), out.end());  // the variants come in a seeded order
  return out;
}

TEST(Pairs, OnlyCheckedCandidatesOfTheAskedFormatsTrain) {
  const auto& m = fixture().modules;
  ExampleOptions o = coder_options();
  o.unfused_share = 1.0;
  o.candidates_per_module = 10;
  EXPECT_EQ(labels(o, {m[0]}), (std::vector<std::string>{"train-000000 triton unfused 1024",
                                                        "train-000000 triton unfused 256"}));
  o.accept_unchecked = true;  // the null verdict joins; "incorrect" never does
  EXPECT_EQ(labels(o, {m[0]}).size(), 3u);
  o.formats = {"cuda-rtc"};
  EXPECT_EQ(labels(o, {m[0]}), std::vector<std::string>{"train-000000 cuda-rtc unfused 256"});
  o.formats = {"cuda"};  // no candidate: counted, and the template is never needed
  auto set = build_examples({m[0]}, o, *fixture().tokenizer);
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->without_candidate, 1u);
}

TEST(Pairs, UnfusedShareDrawsTheFusionPerModule) {
  ExampleOptions o = coder_options();
  auto fused_count = [&](double share) {
    o.unfused_share = share;
    auto set = build_examples(fixture().modules, o, *fixture().tokenizer);
    EXPECT_TRUE(set.ok());
    size_t fused = 0;
    for (const auto& e : set->examples) fused += e.fused;
    EXPECT_EQ(set->examples.size(), 8u);
    return fused;
  };
  EXPECT_EQ(fused_count(1.0), 0u);
  EXPECT_EQ(fused_count(0.0), 8u);
  size_t half = fused_count(0.5);
  EXPECT_GT(half, 0u);
  EXPECT_LT(half, 8u);
}

TEST(Pairs, PairsLongerThanMaxSeqLenAreCountedNotCut) {
  ExampleOptions o = coder_options();
  o.max_seq_len = 50;
  auto set = build_examples(fixture().modules, o, *fixture().tokenizer);
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE(set->examples.empty());
  EXPECT_EQ(set->too_long, 8u);
}

TEST(Split, HeldoutFractionAndNone) {
  const auto& m = fixture().modules;
  auto heldout = split_modules(m, "heldout", 0, 0);
  ASSERT_TRUE(heldout.ok());
  EXPECT_EQ(heldout->train.size(), 6u);
  ASSERT_EQ(heldout->eval.size(), 2u);
  EXPECT_EQ(heldout->eval[0].split, "heldout");
  auto fraction = split_modules(m, "fraction", 0.5, 0);
  ASSERT_TRUE(fraction.ok()) << fraction.status().to_string();
  EXPECT_EQ(fraction->train.size() + fraction->eval.size(), 6u);  // heldout modules never train
  for (const auto& e : fraction->eval) EXPECT_EQ(e.split, "train");
  auto none = split_modules(m, "none", 0, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->eval.empty());
  std::vector<CorpusModule> only_train(m.begin(), m.begin() + 6);
  EXPECT_NE(split_modules(only_train, "heldout", 0, 0).status().message().find("no heldout module"), std::string::npos);
}

// ---- rows and the plan -----------------------------------------------------------------------

Example synthetic(size_t prompt, size_t completion, TokenId first) {
  Example e;
  for (size_t i = 0; i < prompt; ++i) e.prompt_ids.push_back(first + static_cast<TokenId>(i));
  for (size_t i = 0; i < completion; ++i) e.completion_ids.push_back(1000 + first + static_cast<TokenId>(i));
  return e;
}

TEST(Rows, LossMaskCoversCompletionTargetsOnly) {
  std::vector<Example> examples = {synthetic(3, 2, 0), synthetic(2, 3, 10)};
  RowTokens one = row_tokens({0}, examples);
  EXPECT_EQ(one.ids, (std::vector<TokenId>{0, 1, 2, 1000, 1001}));
  EXPECT_EQ(one.loss_mask, (std::vector<uint8_t>{0, 0, 1, 1}));
  RowTokens packed = row_tokens({0, 1}, examples);
  EXPECT_EQ(packed.ids.size(), 10u);
  // The second example's prompt is never a target; its completion is.
  EXPECT_EQ(packed.loss_mask, (std::vector<uint8_t>{0, 0, 1, 1, 0, 0, 1, 1, 1}));
}

std::vector<Example> many(size_t n) {
  std::vector<Example> examples;
  for (size_t i = 0; i < n; ++i) examples.push_back(synthetic(5 + i % 7, 3 + i % 5, static_cast<TokenId>(i)));
  return examples;
}

TEST(Plan, StepsAndMicroBatchesKeepTheirBudgetsAndCoverEveryExampleOncePerEpoch) {
  auto examples = many(40);
  BatchOptions o;
  o.batch_tokens = 60;
  o.micro_batch_tokens = 40;
  auto steps = plan_epoch(examples, o, 3, 0);
  std::multiset<uint32_t> seen;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (s + 1 < steps.size()) {
      EXPECT_GE(steps[s].tokens, o.batch_tokens);
    }
    size_t tokens = 0;
    for (const auto& micro : steps[s].micro_batches) {
      size_t longest = 0;
      for (const Row& row : micro) {
        longest = std::max(longest, row_length(row, examples));
        tokens += row_length(row, examples);
        seen.insert(row.begin(), row.end());
      }
      EXPECT_TRUE(micro.size() == 1 || micro.size() * longest <= o.micro_batch_tokens);
    }
    EXPECT_EQ(tokens, steps[s].tokens);
  }
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(std::set<uint32_t>(seen.begin(), seen.end()).size(), 40u);
}

TEST(Plan, ShardsDealEveryRowOfAStepToExactlyOneRank) {
  auto examples = many(40);
  BatchOptions o;
  o.batch_tokens = 200;
  o.micro_batch_tokens = 40;
  auto steps = plan_epoch(examples, o, 3, 0);
  ASSERT_FALSE(steps.empty());
  const Step& step = steps.front();
  EXPECT_EQ(shard_step(step, examples, o.micro_batch_tokens, 0, 1), step.micro_batches);
  std::multiset<uint32_t> whole, dealt;
  for (const auto& micro : step.micro_batches)
    for (const Row& row : micro) whole.insert(row.begin(), row.end());
  for (int rank = 0; rank < 3; ++rank)
    for (const auto& micro : shard_step(step, examples, o.micro_batch_tokens, rank, 3)) {
      size_t longest = 0;
      for (const Row& row : micro) {
        longest = std::max(longest, row_length(row, examples));
        dealt.insert(row.begin(), row.end());
      }
      EXPECT_TRUE(micro.size() == 1 || micro.size() * longest <= o.micro_batch_tokens);
    }
  EXPECT_EQ(dealt, whole);
  // More ranks than rows: the last ranks get nothing (and still take part in the step).
  Step one{0, {{{0}}}, row_length({0}, examples)};
  EXPECT_EQ(shard_step(one, examples, 40, 0, 2).size(), 1u);
  EXPECT_TRUE(shard_step(one, examples, 40, 1, 2).empty());
}

TEST(Plan, PackingFillsRowsUpToRowTokens) {
  auto examples = many(40);
  BatchOptions o;
  o.packing = true;
  o.row_tokens = 32;
  o.batch_tokens = 1 << 20;
  auto steps = plan_epoch(examples, o, 3, 0);
  ASSERT_EQ(steps.size(), 1u);
  size_t rows = 0, total = 0;
  for (const auto& micro : steps[0].micro_batches)
    for (const Row& row : micro) {
      ++rows;
      total += row_length(row, examples);
      EXPECT_LE(row_length(row, examples), o.row_tokens);
      EXPECT_GE(row.size(), 1u);
    }
  EXPECT_LE(rows, 24u);  // 8 to 22 tokens each: mostly two per row
  EXPECT_EQ(total, steps[0].tokens);
}

TEST(Plan, DeterministicPerSeedAndEpochAndStepsSpanEpochs) {
  auto examples = many(30);
  BatchOptions o;
  o.batch_tokens = 50;
  auto first_rows = [&](uint64_t seed, int64_t epoch) {
    std::vector<Row> rows;
    for (const auto& step : plan_epoch(examples, o, seed, epoch))
      for (const auto& micro : step.micro_batches) rows.insert(rows.end(), micro.begin(), micro.end());
    return rows;
  };
  EXPECT_EQ(first_rows(1, 0), first_rows(1, 0));
  EXPECT_NE(first_rows(1, 0), first_rows(1, 1));
  EXPECT_NE(first_rows(1, 0), first_rows(2, 0));
  size_t per_epoch = plan_epoch(examples, o, 1, 0).size();
  auto plan = plan_training(examples, o, 1, 0, static_cast<int64_t>(per_epoch) + 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->size(), per_epoch + 2);
  EXPECT_EQ(plan->back().epoch, 1);
  auto epochs = plan_training(examples, o, 1, 3, 0);
  ASSERT_TRUE(epochs.ok());
  EXPECT_EQ(epochs->back().epoch, 2);
  EXPECT_FALSE(plan_training({}, o, 1, 1, 0).ok());
}

// ---- config ----------------------------------------------------------------------------------

TEST(Config, ShippedConfigsLoadAndWriteEveryKey) {
  for (const char* name : {"sft-coder-tiny-cpu.toml", "sft-proposer-tiny-cpu.toml", "sft-coder-gpu.toml",
                           "sft-proposer-gpu.toml"}) {
    fs::path path = source_dir() / "configs" / name;
    auto config = load_sft_config(path);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    auto text = read_file(path);
    ASSERT_TRUE(text.ok());
    auto table = parse_toml(*text, path.string());
    ASSERT_TRUE(table.ok());
    SftConfig defaults;
    for (const auto& entry : sft_config_table(defaults)) {
      std::string section = entry.key.substr(0, entry.key.find('.')), key = entry.key.substr(entry.key.find('.') + 1);
      EXPECT_TRUE((*table)[section][key]) << name << " does not write " << entry.key;
    }
  }
}

std::string config_error(const std::string& text) {
  fs::path path = scratch() / "bad.toml";
  std::ofstream(path) << "[data]\ncorpus = [\"c.jsonl\"]\n" << text;
  auto config = load_sft_config(path);
  EXPECT_FALSE(config.ok());
  return config.ok() ? "" : config.status().message();
}

TEST(Config, ErrorsNameTheKey) {
  EXPECT_NE(config_error("[train]\nlrr = 1\n").find("unknown config key 'train.lrr'"), std::string::npos);
  EXPECT_NE(config_error("role = \"critic\"\n").find("data.role"), std::string::npos);
  EXPECT_NE(config_error("formats = [\"opencl\"]\n").find("\"opencl\""), std::string::npos);
  EXPECT_NE(config_error("[train]\nsteps = 5\nwarmup_steps = 5\n").find("warmup_steps"), std::string::npos);
  fs::path path = scratch() / "no_corpus.toml";
  std::ofstream(path) << "[train]\nsteps = 5\n";
  EXPECT_NE(load_sft_config(path).status().message().find("[data] corpus"), std::string::npos);
}

// ---- the tokenizer ---------------------------------------------------------------------------

TEST(CorpusTokenizer, FollowsTheConventionsAndLearnsTheTemplates) {
  const Tokenizer& t = *fixture().tokenizer;
  EXPECT_EQ(t.eos_id(), t.token_to_id("<|im_end|>"));
  EXPECT_EQ(t.pad_id(), t.token_to_id("<|endoftext|>"));
  EXPECT_TRUE(t.chat_template().chatml);
  CorpusTokenizerOptions options;
  options.corpora = {fixture().corpus};
  options.prompts_dir = "";
  options.vocab_size = 1024;
  options.out_dir = scratch() / "tokenizer-without-prompts";
  auto report = train_corpus_tokenizer(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->templates, 0u);
  auto without = Tokenizer::load(options.out_dir);
  ASSERT_TRUE(without.ok());
  auto system = load_prompt_template(source_dir() / "prompts" / "coder_triton.toml");
  ASSERT_TRUE(system.ok());
  // The templates' words became tokens: the system prompt takes far fewer ids.
  EXPECT_LT(t.encode(system->system).size() * 3, without->encode(system->system).size() * 2);
}

TEST(CorpusTokenizer, AWeightCountsAsThatManyCopies) {
  std::vector<std::string> docs = {"def kernel(x_ptr): pass", "tl.load(x_ptr + offs)"};
  BpeTrainOptions options = model::chatml_bpe_options(300);
  auto weighted = train_byte_level_bpe(docs, {3, 1}, options);
  auto repeated = train_byte_level_bpe({docs[0], docs[0], docs[0], docs[1]}, options);
  ASSERT_TRUE(weighted.ok() && repeated.ok());
  EXPECT_EQ(weighted->tokenizer_json, repeated->tokenizer_json);
  EXPECT_NE(weighted->tokenizer_json, train_byte_level_bpe(docs, options)->tokenizer_json);
  EXPECT_FALSE(train_byte_level_bpe(docs, {1}, options).ok());
}

// ---- the fresh model (kz init-model's writer with a given tokenizer and shape) ---------------

TEST(InitModel, TakesTheTrainedTokenizerAndTheShape) {
  const Tokenizer& tokenizer = *fixture().tokenizer;  // written to scratch()/tokenizer
  model::InitModelOptions init;
  init.preset = "tiny";
  init.out_dir = scratch() / "init";
  init.tokenizer_dir = scratch() / "tokenizer";
  init.weights = false;
  init.shape = {96, 192, 3, 4, 2, 1024, 512, 0.02};
  auto report = model::init_model(init);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->config.hidden_size, 96);
  EXPECT_EQ(report->config.num_hidden_layers, 3);
  EXPECT_EQ(report->config.vocab_size, 1024);
  EXPECT_EQ(report->config.max_position_embeddings, 512);
  EXPECT_EQ(*read_file(init.out_dir / "tokenizer.json"), *read_file(scratch() / "tokenizer" / "tokenizer.json"));
  EXPECT_EQ(report->eos_token_id, *tokenizer.token_to_id("<|im_end|>"));
  init.shape = {100, 0, 0, 3, 0, 1024, 0, 0};
  EXPECT_NE(model::init_model(init).status().message().find("not a multiple of num_attention_heads"), std::string::npos);
  init.shape = {};  // tiny's 512 ids are fewer than the tokenizer's
  EXPECT_NE(model::init_model(init).status().message().find("more than vocab_size 512"), std::string::npos);
}

}  // namespace
}  // namespace kz::sft
