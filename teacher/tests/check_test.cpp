// The teacher's candidates through the real evaluation engine on the CPU (check_corpus, as
// `kz teach --check` runs it): four modules covering every kind (broadcast elementwise, a softmax
// and an RMS norm with prologues, a gemm with an epilogue), their triton candidates unfused and
// fused under the interpreter (ok), one module's cuda-rtc candidates compiled by NVRTC
// (compiled_not_run), and a candidate broken on purpose, which the check must report.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/eval/suite.h"
#include "kz/eval/worker_client.h"
#include "kz/teacher/corpus.h"

namespace kz::teacher {
namespace {

namespace fs = std::filesystem;

Step unary(Op op) { return Step{op, Operand::none, ""}; }
Step binary(Op op, Operand operand, std::string value) { return Step{op, operand, std::move(value)}; }

ModuleSpec module(Kind kind, std::vector<Step> chain, Reducer reducer = Reducer::none) {
  ModuleSpec spec;
  spec.kind = kind;
  spec.chain = std::move(chain);
  spec.reducer = reducer;
  spec.rows = 32;
  spec.cols = kind == Kind::gemm ? 48 : 96;  // not a multiple of every block: the masks matter
  spec.inner = kind == Kind::gemm ? 64 : 0;
  return spec;
}

class TeacherCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-teacher-check-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    scratch_ = *dir;
  }
  void TearDown() override {
    stop_fork_servers();
    std::error_code ignored;
    fs::remove_all(scratch_, ignored);
  }
  fs::path scratch_;
};

TEST_F(TeacherCheck, TeacherCandidatesPassTheEvaluatorAndABrokenOneIsReported) {
  TeachOptions options;
  options.out_dir = scratch_;
  options.count = 4;
  options.variants = 1;
  options.formats = {Format::triton};
  std::vector<ModuleSpec> modules = {
      module(Kind::elementwise, {binary(Op::mul, Operand::row, "row"), unary(Op::gelu_tanh),
                                 binary(Op::maximum, Operand::col, "col"), binary(Op::sub, Operand::scalar, "0.5")}),
      module(Kind::reduction, {binary(Op::add, Operand::full, "y"), unary(Op::tanh)}, Reducer::softmax),
      module(Kind::reduction, {unary(Op::silu)}, Reducer::rms_norm),
      module(Kind::gemm, {binary(Op::add, Operand::row, "row"), unary(Op::sigmoid)}),
  };
  std::vector<CorpusEntry> corpus;
  for (size_t i = 0; i < modules.size(); ++i) {
    TeachOptions these = options;
    if (i == 1) these.formats = {Format::triton, Format::cuda_rtc};  // the row kernels' CUDA through NVRTC
    corpus.push_back(make_entry(modules[i], static_cast<int>(i), these));
  }
  // Broken on purpose: the elementwise module's fused kernel subtracts where it should add.
  CorpusEntry broken = make_entry(modules[0], 4, options);
  broken.candidates.erase(broken.candidates.begin());  // keeps the fused one, whose scalar is a literal
  ASSERT_EQ(broken.candidates.size(), 1u);
  std::string& source = broken.candidates[0].source;
  size_t at = source.find("h = h - 0.5");
  ASSERT_NE(at, std::string::npos) << source;
  source.replace(at, 11, "h = h + 0.5");
  corpus.push_back(broken);
  ASSERT_TRUE(write_corpus(options, corpus).is_ok());

  EvalOptions eval;
  eval.trials = 2;
  eval.cache.enabled = false;  // every candidate runs its worker: a stored verdict would test nothing
  auto evaluator = Evaluator::create(eval);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status().to_string();
  SuiteRunOptions run;
  run.jobs = default_jobs(eval);
  std::ostringstream progress;
  auto report = check_corpus(*evaluator, run, options, corpus, progress);
  ASSERT_TRUE(report.ok()) << report.status().to_string() << "\n" << progress.str();

  EXPECT_EQ(report->candidates, 4 * 2 + 2 + 1) << report->render();
  ASSERT_EQ(report->failures.size(), 1u) << report->render();
  EXPECT_NE(report->failures[0].find("train-000004"), std::string::npos) << report->failures[0];
  EXPECT_EQ((report->counts["triton unfused"]["ok"]), 4) << report->render();
  EXPECT_EQ((report->counts["triton fused"]["ok"]), 4) << report->render();
  EXPECT_EQ((report->counts["cuda-rtc unfused"]["compiled_not_run"]), 1) << report->render();
  EXPECT_EQ((report->counts["cuda-rtc fused"]["compiled_not_run"]), 1) << report->render();

  // The verdicts are in the corpus that was rewritten.
  auto lines = read_jsonl_log(scratch_ / "corpus.jsonl");
  ASSERT_TRUE(lines.ok()) << lines.status().to_string();
  ASSERT_EQ(lines->size(), corpus.size());
  for (size_t i = 0; i < 4; ++i)
    for (const nlohmann::json& c : (*lines)[i].at("candidates"))
      EXPECT_TRUE(c.at("verdict") == "ok" || c.at("verdict") == "compiled_not_run") << c.dump();
  EXPECT_EQ((*lines)[4].at("candidates")[0].at("verdict"), "incorrect");
  EXPECT_TRUE(fs::exists(scratch_ / "check.jsonl"));
}

}  // namespace
}  // namespace kz::teacher
