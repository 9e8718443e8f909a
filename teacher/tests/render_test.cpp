// The teacher's writers and corpus files, without the evaluator: every reference and candidate is
// Python that compiles, every reference runs (the worker's interpreter, torch on the CPU) and gives
// the shape its kind says, unfused candidates launch one kernel per op and fused ones one, and the
// corpus lands where kz eval-suite looks, with the JSONL keys docs/formats.md lists.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/sandbox/process.h"
#include "kz/eval/suite.h"
#include "kz/task/task.h"
#include "kz/teacher/corpus.h"

namespace kz::teacher {
namespace {

namespace fs = std::filesystem;

std::string python() {
  const char* env = std::getenv("KZ_PYTHON");
  return env && *env ? env : KZ_TEST_PYTHON;
}

fs::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir ? fs::path(dir) : fs::path();
}

TeachOptions options_for(const fs::path& out, Split split, int count, int scale = 1) {
  TeachOptions options;
  options.out_dir = out;
  options.count = count;
  options.seed = 1;
  options.split = split;
  options.scale = scale;
  return options;
}

nlohmann::json expected_shape(const ModuleSpec& m) {
  bool per_row = m.kind == Kind::reduction &&
                 (m.reducer == Reducer::sum || m.reducer == Reducer::mean || m.reducer == Reducer::max);
  return per_row ? nlohmann::json::array({m.rows}) : nlohmann::json::array({m.rows, m.cols});
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class TeacherFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-teacher-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    scratch_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_, ignored);
  }
  fs::path scratch_;
};

TEST_F(TeacherFiles, EveryFileIsPythonAndEveryReferenceRuns) {
  ASSERT_FALSE(source_dir().empty()) << "KZ_SOURCE_DIR is not set (run through ctest)";
  nlohmann::json expected = nlohmann::json::object();
  // The held-out split at scale 2: its references run at their cpu_sizes, the sampled sizes.
  for (auto [split, count, scale] : {std::tuple{Split::train, 24, 1}, std::tuple{Split::heldout, 8, 2}}) {
    TeachOptions options = options_for(scratch_ / split_name(split), split, count, scale);
    auto corpus = make_corpus(options);
    ASSERT_TRUE(write_corpus(options, corpus).is_ok());
    for (const CorpusEntry& entry : corpus)
      expected[(fs::path(split_name(split)) / entry.reference_file).string()] = expected_shape(entry.module);
  }
  ASSERT_TRUE(write_file_atomic(scratch_ / "expected.json", expected.dump()).is_ok());

  ProcessSpec spec;
  spec.argv = {python(), (source_dir() / "teacher/tests/check_python.py").string(), scratch_.string()};
  spec.env = current_environment();
  spec.env["PYTHONDONTWRITEBYTECODE"] = "1";
  auto result = run_process(spec, std::chrono::seconds(240));
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_TRUE(result->exit.exited && result->exit.exit_code == 0)
      << result->exit.describe() << "\n" << result->stdout_text << result->stderr_text;
}

TEST_F(TeacherFiles, TheCorpusLandsWhereEvalSuiteLooks) {
  TeachOptions options = options_for(scratch_, Split::train, 12);
  options.variants = 2;
  auto corpus = make_corpus(options);
  ASSERT_TRUE(write_corpus(options, corpus).is_ok());

  auto tasks = load_tasks(scratch_ / "suite");
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), corpus.size());
  auto entries = discover_candidates(*tasks, scratch_ / "candidates");
  ASSERT_TRUE(entries.ok()) << entries.status().to_string();
  EXPECT_EQ(entries->size(), corpus.size() * 2 /* formats */ * 2 /* fusions */ * 2 /* variants */);
  for (const Task& task : *tasks) {
    auto entry = std::find_if(corpus.begin(), corpus.end(), [&](const CorpusEntry& e) { return e.id == task.id; });
    ASSERT_NE(entry, corpus.end()) << task.id;
    EXPECT_EQ(task.level, level(entry->module)) << task.id;
  }

  auto lines = read_jsonl_log(scratch_ / "corpus.jsonl");
  ASSERT_TRUE(lines.ok()) << lines.status().to_string();
  ASSERT_EQ(lines->size(), corpus.size());
  for (size_t i = 0; i < lines->size(); ++i) {
    const nlohmann::json& line = (*lines)[i];
    EXPECT_EQ(line.at("id"), fmt::format("train-{:06d}", i));
    EXPECT_EQ(line.at("split"), "train");
    EXPECT_TRUE(line.at("level") == 1 || line.at("level") == 2);
    EXPECT_TRUE(line.at("apis").is_array() && !line.at("apis").empty());
    EXPECT_EQ(line.at("ops"), expression(corpus[i].module));
    EXPECT_EQ(line.at("reference"), corpus[i].reference);
    EXPECT_EQ(line.at("provenance").at("generator"), "kz teach");
    EXPECT_EQ(line.at("provenance").at("teacher_version"), kTeacherVersion);
    EXPECT_EQ(line.at("provenance").at("seed"), 1);
    EXPECT_EQ(line.at("provenance").at("index"), i);
    ASSERT_EQ(line.at("candidates").size(), 8u);
    for (const nlohmann::json& c : line.at("candidates")) {
      EXPECT_TRUE(c.at("format") == "triton" || c.at("format") == "cuda-rtc");
      EXPECT_TRUE(c.at("fusion") == "unfused" || c.at("fusion") == "fused");
      EXPECT_TRUE(c.at("block_size").is_number_integer());
      EXPECT_NE(c.at("source").get<std::string>().find("class ModelNew"), std::string::npos);
      EXPECT_TRUE(c.at("verdict").is_null());  // not checked
      EXPECT_TRUE(c.at("speedup").is_null());
      EXPECT_TRUE(fs::exists(scratch_ / c.at("file").get<std::string>()));
    }
  }

  // A smaller corpus in the same directory leaves no stale files behind.
  options.count = 3;
  ASSERT_TRUE(write_corpus(options, make_corpus(options)).is_ok());
  auto fewer = load_tasks(scratch_ / "suite");
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(fewer->size(), 3u);
}

TEST(TeacherRender, UnfusedLaunchesOneKernelPerOpAndFusedOne) {
  ModuleSampler sampler(2, Split::train);
  for (int i = 0; i < 40; ++i) {
    ModuleSpec m = sampler.next();
    // A gemm's unfused candidate adds its bias in a kernel of its own.
    size_t ops = op_sequence(m).size() + (m.kind == Kind::gemm ? 1 : 0);
    for (Format format : {Format::triton, Format::cuda_rtc}) {
      const char* launch = format == Format::triton ? "_kernel[" : "self.kernels.";
      int block = block_sizes(m, format).back();
      std::string unfused = render_candidate(m, {format, Fusion::unfused, block});
      std::string fused = render_candidate(m, {format, Fusion::fused, block});
      EXPECT_EQ(count_of(unfused, launch), ops) << expression(m) << "\n" << unfused;
      EXPECT_EQ(count_of(fused, launch), 1u) << expression(m) << "\n" << fused;
      const char* constant = m.kind == Kind::gemm ? "TILE = " : format == Format::triton ? "BLOCK = " : "THREADS = ";
      EXPECT_NE(fused.find(fmt::format("{}{}", constant, block)), std::string::npos) << fused;
    }
  }
}

TEST(TeacherRender, ScaleMultipliesTheSizesAndCpuSizesKeepTheSampledOnes) {
  ModuleSpec m;
  m.kind = Kind::gemm;
  m.rows = 32;
  m.inner = 64;
  m.cols = 96;
  m.chain = {{Op::relu, Operand::none, ""}};
  std::string scaled = render_reference(m, 8);
  EXPECT_NE(scaled.find("batch_size = 256\nin_features = 512\nout_features = 768\n"), std::string::npos) << scaled;
  EXPECT_NE(scaled.find("cpu_sizes = {\"batch_size\": 32, \"in_features\": 64, \"out_features\": 96}"), std::string::npos)
      << scaled;
  EXPECT_EQ(render_reference(m, 1).find("cpu_sizes"), std::string::npos);
}

TEST(TeachOptions, ValidateRefusesWhatCannotBeWritten) {
  TeachOptions good = options_for("/tmp/out", Split::train, 4);
  EXPECT_TRUE(good.validate().is_ok());
  auto refused = [&](auto change) {
    TeachOptions o = good;
    change(o);
    return o.validate().code() == StatusCode::invalid_argument;
  };
  EXPECT_TRUE(refused([](TeachOptions& o) { o.out_dir.clear(); }));
  EXPECT_TRUE(refused([](TeachOptions& o) { o.count = 0; }));
  EXPECT_TRUE(refused([](TeachOptions& o) { o.variants = 4; }));
  EXPECT_TRUE(refused([](TeachOptions& o) { o.scale = 0; }));
  EXPECT_TRUE(refused([](TeachOptions& o) { o.formats = {Format::triton, Format::triton}; }));
  EXPECT_TRUE(refused([](TeachOptions& o) { o.formats.clear(); }));
}

}  // namespace
}  // namespace kz::teacher
