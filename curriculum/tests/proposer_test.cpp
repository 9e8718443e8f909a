// ProposerPipeline (kz/curriculum/proposer.h) over a stand-in Generator whose replies are fixed:
// a valid module, prose with no code block, a renamed copy of the valid module and one that skips a
// requested API. Validation is the real one (the Python worker on the CPU, as curriculum_test's),
// so the decisions, the ids, the rows and the dedup across calls and against add_kept are the ones
// `kz propose` writes. Replies without code never start a worker: the error paths and several API
// sets are checked with those.
//
// CTest sets KZ_SOURCE_DIR (the shipped prompts/); run by hand from the repository root, "." works.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kz/curriculum/proposer.h"
#include "proposer_replies.h"
#include "kz/task/catalogue.h"

namespace kz {
namespace {

namespace fs = std::filesystem;
using test::fenced;
using test::kGood;
using test::kGoodRenamed;

fs::path prompts_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return fs::path(dir && *dir ? dir : ".") / "prompts";
}

std::string without_gelu() {
  std::string source = kGood;
  source.replace(source.find("F.gelu"), 6, "F.relu");
  return source;
}

// Records every request; answers each with `replies` (or with `failure` when it is set).
class StandInGenerator : public Generator {
 public:
  explicit StandInGenerator(std::vector<std::string> replies) : replies_(std::move(replies)) {}

  std::vector<Result<std::vector<Completion>>> generate(const std::vector<GenerationRequest>& requests) override {
    std::vector<Result<std::vector<Completion>>> results;
    for (const auto& request : requests) {
      requests_.push_back(request);
      if (!failure.is_ok()) {
        results.push_back(failure);
        continue;
      }
      std::vector<Completion> completions;
      for (const auto& text : replies_) {
        Completion completion;
        completion.text = text;
        completion.finish_reason = "stop";
        completions.push_back(std::move(completion));
      }
      results.push_back(std::move(completions));
    }
    return results;
  }
  std::string describe() const override { return "stand-in"; }

  const std::vector<GenerationRequest>& requests() const { return requests_; }
  Status failure = Status::ok();

 private:
  std::vector<std::string> replies_;
  std::vector<GenerationRequest> requests_;
};

std::vector<ApiEntry> apis(const std::vector<std::string>& names) {
  auto catalogue = load_api_catalogue(default_api_catalogue_path());
  EXPECT_TRUE(catalogue.ok()) << catalogue.status().to_string();
  if (!catalogue.ok()) return {};
  auto found = find_apis(*catalogue, names);
  EXPECT_TRUE(found.ok()) << found.status().to_string();
  return found.ok() ? *found : std::vector<ApiEntry>{};
}

ProposerOptions options() {
  ProposerOptions options;
  options.n = 4;
  options.level = 2;
  options.temperature = 0.5;
  options.max_tokens = 1000;
  options.seed = 7;
  options.prompts_dir = prompts_dir();
  options.jobs = 2;
  return options;
}

TEST(ProposerPipeline, KeepsTheValidModuleAndSaysWhyTheOthersWereRejected) {
  StandInGenerator generator({fenced("Here is a module.", kGood), "I am sorry, I cannot write that module.",
                              fenced("Another one:", kGoodRenamed), fenced("With relu:", without_gelu())});
  auto pipeline = ProposerPipeline::create(generator, options());
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().to_string();
  auto gelu_matmul = apis({"torch.nn.functional.gelu", "torch.matmul"});
  ASSERT_EQ(gelu_matmul.size(), 2u);

  std::vector<std::pair<size_t, size_t>> progress;
  std::vector<std::string> validated;
  auto batches = pipeline->propose({gelu_matmul}, [&](size_t done, size_t total, const std::string& id) {
    progress.emplace_back(done, total);
    if (done > 0) validated.push_back(id);
  });
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();

  // One request with the options' sampling parameters and a prompt naming the APIs and the level.
  ASSERT_EQ(generator.requests().size(), 1u);
  const auto& request = generator.requests()[0];
  EXPECT_EQ(request.id, "propose");
  EXPECT_EQ(request.params.n, 4);
  EXPECT_DOUBLE_EQ(request.params.temperature, 0.5);
  EXPECT_EQ(request.params.max_tokens, 1000);
  EXPECT_EQ(request.params.seed, std::optional<uint64_t>(7));
  std::string prompt;
  for (const auto& message : request.messages) prompt += message.content + "\n";
  EXPECT_NE(prompt.find("- torch.nn.functional.gelu\n- torch.matmul"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("2"), std::string::npos) << prompt;

  ASSERT_EQ(batches->size(), 1u);
  const ProposalBatch& batch = (*batches)[0];
  EXPECT_EQ(batch.apis.size(), 2u);
  ASSERT_EQ(batch.proposals.size(), 4u);
  const auto& good = batch.proposals[0];
  const auto& garbage = batch.proposals[1];
  const auto& renamed = batch.proposals[2];
  const auto& no_gelu = batch.proposals[3];

  EXPECT_TRUE(good.kept) << good.reason;
  EXPECT_EQ(good.reason, "valid");
  EXPECT_EQ(good.failed_check, "");
  ASSERT_TRUE(good.code.has_value());
  EXPECT_EQ(*good.code, kGood);
  EXPECT_EQ(good.id.rfind("prop-", 0), 0u) << good.id;
  EXPECT_EQ(good.id.size(), 17u) << good.id;
  EXPECT_TRUE(good.verdict.valid);
  EXPECT_GT(good.verdict.runtime_ms, 0);

  EXPECT_FALSE(garbage.kept);
  EXPECT_FALSE(garbage.code.has_value());
  EXPECT_EQ(garbage.failed_check, "no_code");
  EXPECT_EQ(garbage.reason, "no_code: the reply holds no code block");

  EXPECT_FALSE(renamed.kept);
  EXPECT_EQ(renamed.failed_check, "duplicate");
  EXPECT_TRUE(renamed.verdict.valid) << renamed.verdict.reason;
  EXPECT_NE(renamed.reason.find("duplicate: same ATen ops and output shapes as " + good.id), std::string::npos)
      << renamed.reason;

  EXPECT_FALSE(no_gelu.kept);
  EXPECT_EQ(no_gelu.failed_check, "apis") << no_gelu.reason;
  EXPECT_NE(no_gelu.reason.find("gelu"), std::string::npos) << no_gelu.reason;

  std::set<std::string> ids;
  for (const auto& p : batch.proposals) ids.insert(p.id);
  EXPECT_EQ(ids.size(), 4u);

  // Progress: a start, then one call per reply (those without code included).
  ASSERT_EQ(progress.size(), 5u);
  EXPECT_EQ(progress.front(), (std::pair<size_t, size_t>{0, 4}));
  EXPECT_EQ(progress.back(), (std::pair<size_t, size_t>{4, 4}));
  EXPECT_EQ(std::set<std::string>(validated.begin(), validated.end()), ids);

  // The rows `kz propose` appends.
  auto row = pipeline->to_row(good, batch, "openai:http://x/v1:m");
  EXPECT_EQ(row["id"], good.id);
  EXPECT_EQ(row["py_code"], kGood);
  EXPECT_EQ(row["ops"], nlohmann::json::array({"torch.nn.functional.gelu", "torch.matmul"}));
  EXPECT_EQ(row["level"], 2);
  EXPECT_EQ(row["status"], "kept");
  EXPECT_EQ(row["reason"], "valid");
  EXPECT_EQ(row["failed_check"], "");
  EXPECT_EQ(row["fingerprint"], good.verdict.fingerprint);
  EXPECT_TRUE(row["runtime_ms"].is_number());
  EXPECT_EQ(row["model"], "openai:http://x/v1:m");
  auto rejected = pipeline->to_row(garbage, batch, "m");
  EXPECT_EQ(rejected["status"], "rejected");
  EXPECT_EQ(rejected["failed_check"], "no_code");
  EXPECT_EQ(rejected["py_code"], "");
  EXPECT_TRUE(rejected["runtime_ms"].is_null());

  // A second call remembers the first: the same module is now a duplicate, under a new id.
  auto again_batches = pipeline->propose({gelu_matmul});  // same generator: same four replies
  ASSERT_TRUE(again_batches.ok()) << again_batches.status().to_string();
  const auto& repeat = (*again_batches)[0].proposals[0];
  EXPECT_FALSE(repeat.kept);
  EXPECT_EQ(repeat.failed_check, "duplicate");
  EXPECT_EQ(repeat.id, good.id + "-2");
  for (const auto& p : (*again_batches)[0].proposals) EXPECT_FALSE(p.kept) << p.id << ": " << p.reason;
}

TEST(ProposerPipeline, ModulesKeptEarlierAreDuplicatesAndTheirIdsAreNotReused) {
  StandInGenerator generator({fenced("Here:", kGoodRenamed)});
  auto opts = options();
  opts.n = 1;
  auto pipeline = ProposerPipeline::create(generator, opts);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().to_string();
  pipeline->add_kept("earlier-run", kGood, "");
  auto batches = pipeline->propose({apis({"torch.nn.functional.gelu", "torch.matmul"})});
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();
  const auto& p = (*batches)[0].proposals.at(0);
  EXPECT_FALSE(p.kept);
  EXPECT_EQ(p.failed_check, "duplicate");
  EXPECT_NE(p.reason.find("similar to earlier-run"), std::string::npos) << p.reason;
}

TEST(ProposerPipeline, ReservedIdsGetASuffix) {
  StandInGenerator generator({"no code here"});
  auto opts = options();
  opts.n = 1;
  auto first = ProposerPipeline::create(generator, opts);
  ASSERT_TRUE(first.ok());
  auto batches = first->propose({apis({"torch.matmul"})});
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();
  std::string id = (*batches)[0].proposals.at(0).id;

  auto second = ProposerPipeline::create(generator, opts);
  ASSERT_TRUE(second.ok());
  second->reserve_id(id);
  auto again = second->propose({apis({"torch.matmul"})});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].proposals.at(0).id, id + "-2");
}

TEST(ProposerPipeline, OneRequestPerApiSetAndABatchEach) {
  StandInGenerator generator({"no code", "still none"});
  auto opts = options();
  opts.n = 2;
  auto pipeline = ProposerPipeline::create(generator, opts);
  ASSERT_TRUE(pipeline.ok());
  auto batches = pipeline->propose({apis({"torch.matmul"}), apis({"torch.nn.functional.gelu", "torch.matmul"})});
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();
  ASSERT_EQ(generator.requests().size(), 2u);
  EXPECT_EQ(generator.requests()[0].id, "propose-0");
  EXPECT_EQ(generator.requests()[1].id, "propose-1");
  ASSERT_EQ(batches->size(), 2u);
  EXPECT_EQ((*batches)[0].apis.size(), 1u);
  EXPECT_EQ((*batches)[1].apis.size(), 2u);
  EXPECT_EQ((*batches)[1].proposals.size(), 2u);
  // The same texts under two prompts: ids stay unique across the call.
  EXPECT_NE((*batches)[0].proposals[0].id, (*batches)[1].proposals[0].id);
  auto row = pipeline->to_row((*batches)[1].proposals[0], (*batches)[1], "m");
  EXPECT_EQ(row["ops"], nlohmann::json::array({"torch.nn.functional.gelu", "torch.matmul"}));
}

TEST(ProposerPipeline, AFailedRequestFailsTheCallAndLeavesNoTrace) {
  StandInGenerator generator({"no code"});
  auto opts = options();
  opts.n = 1;
  auto pipeline = ProposerPipeline::create(generator, opts);
  ASSERT_TRUE(pipeline.ok());
  generator.failure = io_error("connection refused");
  auto failed = pipeline->propose({apis({"torch.matmul"})});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().to_string().find("connection refused"), std::string::npos) << failed.status().to_string();
  EXPECT_NE(failed.status().to_string().find("stand-in"), std::string::npos) << failed.status().to_string();
  // The failed call's ids were not used: the next call gives the same id without a suffix.
  generator.failure = Status::ok();
  auto ok = pipeline->propose({apis({"torch.matmul"})});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[0].proposals.at(0).id.size(), 17u) << (*ok)[0].proposals.at(0).id;

  EXPECT_FALSE(pipeline->propose({{}}).ok()) << "an empty API set is an error";
}

TEST(ProposerPipeline, CreateChecksOptionsAndThePrompt) {
  StandInGenerator generator({});
  auto bad = options();
  bad.n = 0;
  EXPECT_EQ(ProposerPipeline::create(generator, bad).status().code(), StatusCode::invalid_argument);
  bad = options();
  bad.max_tokens = 0;
  EXPECT_FALSE(ProposerPipeline::create(generator, bad).ok());
  bad = options();
  bad.validation.dedup_threshold = 0;
  EXPECT_FALSE(ProposerPipeline::create(generator, bad).ok());
  bad = options();
  bad.prompts_dir = "/nonexistent/prompts";
  auto missing = ProposerPipeline::create(generator, bad);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().to_string().find("proposer.toml"), std::string::npos) << missing.status().to_string();
}

}  // namespace
}  // namespace kz
