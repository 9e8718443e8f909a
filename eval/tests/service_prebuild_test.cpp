// The evaluation service's `cuda` pre-builds through the real thing: load_inline and this machine's
// nvcc, on the CPU. There a `cuda` evaluation is a build and no more (compiled_not_run), so the
// service pre-builds only with prebuild = "always"; the build then moves ahead of the evaluation,
// which loads it. Slow (nvcc on a small CPU): label "slow", beside eval_cuda_compile_test.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include <fmt/format.h>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/eval/sandbox.h"
#include "service_fixture.h"
#include "test_support.h"

namespace kz {
namespace {

using test::ServiceTest;
namespace fs = std::filesystem;

std::string source(const std::string& relative) {
  auto text = read_file(test::source_dir() / relative);
  if (!text.ok()) ADD_FAILURE() << "read_file(" << relative << "): " << text.status().to_string();
  return text.ok() ? *text : std::string();
}

ServiceItem relu_item(const std::string& id, const std::string& candidate) {
  return ServiceItem{id, source("suite/kzbench/level1/02_relu.py"), source(candidate), "auto", "02_relu", ""};
}

TEST_F(ServiceTest, CudaJobsArePreBuiltBeforeTheirEvaluation) {
  if (test::source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  if (!test::have_nvcc()) GTEST_SKIP() << "nvcc not found";
  start(
      2,
      [&](EvalOptions& eval) {
        eval.format = "auto";
        eval.worker.cache_dir = dir_ / "compile-cache";  // fresh: nvcc really runs
      },
      [](ServiceOptions& service) {
        service.prebuild = "always";
        service.compile_jobs = 2;
      });
  EXPECT_EQ(service_->compile_jobs(), 2);
  auto health = client().health();
  ASSERT_TRUE(health.ok()) << health.status().to_string();
  EXPECT_EQ((*health)["compile_jobs"], 2);

  ServiceClient c = client();
  auto submission = c.submit({relu_item("cuda", "suite/examples/cuda/02_relu.py"),
                              relu_item("broken", "eval/tests/fixtures/cuda_compile_error.py"),
                              relu_item("triton", "suite/examples/triton/02_relu.py"),
                              relu_item("niced", "eval/tests/fixtures/cuda_build_reports_niceness.py")});
  ASSERT_TRUE(submission.ok()) << submission.status().to_string();
  auto results = c.wait(submission->batch, std::chrono::minutes(15));
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  ASSERT_EQ(results->size(), 4u);
  for (const auto& result : *results) ASSERT_TRUE(result.verdict.has_value()) << result.job;
  const Verdict& cuda = *(*results)[0].verdict;
  const Verdict& broken = *(*results)[1].verdict;
  const Verdict& triton = *(*results)[2].verdict;
  const Verdict& niced = *(*results)[3].verdict;

  // Built ahead (prebuild_s, from the batch's submission), then evaluated: the build is loaded.
  EXPECT_EQ(status_name(cuda.status), std::string("compiled_not_run")) << to_json(cuda).dump(2);
  const VerdictProfile& built = cuda.profile;
  ASSERT_TRUE(built.prebuild_s && built.prebuild_started_s && built.started_s) << to_json(cuda).dump(2);
  EXPECT_GT(*built.prebuild_s, 0);
  EXPECT_GE(*built.started_s, *built.prebuild_started_s + *built.prebuild_s - 0.5) << "evaluated after its build";
  EXPECT_LT(built.wall_s, *built.prebuild_s) << "the evaluation loads the pre-built extension: " << to_json(cuda).dump(2);
  // Where the pre-build's seconds went, reported by the worker that built (load_inline.py, build_parts).
  std::map<std::string, double> parts(built.build_s.begin(), built.build_s.end());
  for (const char* part : {"worker_start", "import_to_build", "load_inline", "ninja", "ninja_cuda", "ninja_cpp",
                           "ninja_link", "nvcc_host_chain", "nvcc_device_chain", "nvcc_host_compile"})
    EXPECT_TRUE(parts.contains(part)) << part << " in " << to_json(cuda).dump(2);
  EXPECT_GT(parts["ninja_cuda"], 0.5) << "nvcc took seconds";
  EXPECT_LE(parts["ninja"], parts["load_inline"]);
  EXPECT_LE(parts["worker_start"] + parts["import_to_build"] + parts["load_inline"], *built.prebuild_s)
      << "parts of the pre-build's wall time";
  // Its CPU seconds: the build's worker and, in its subprocesses, nvcc's steps and the compilers.
  ASSERT_TRUE(built.prebuild_cpu_s) << to_json(cuda).dump(2);
  EXPECT_GT(*built.prebuild_cpu_s, 1.0) << to_json(cuda).dump(2);
  // The build was kept by the supervisor (no worker can write there), and nothing was built in a
  // directory that workers share.
  int libraries = 0;
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(extension_builds_dir(dir_ / "compile-cache"), error))
    libraries += entry.path().extension() == ".so";
  EXPECT_EQ(libraries, 1) << "the correct candidate's library, kept";
  EXPECT_FALSE(fs::exists(dir_ / "compile-cache" / "torch_extensions"));

  // A failed build is the verdict: no evaluation follows it.
  EXPECT_EQ(status_name(broken.status), std::string("compile_error")) << to_json(broken).dump(2);
  EXPECT_TRUE(broken.has_check(Check::kernel_compile));
  EXPECT_TRUE(broken.profile.started_s.has_value());
  EXPECT_FALSE(broken.profile.prebuild_s.has_value()) << "the pre-build's own verdict";
  EXPECT_TRUE(std::any_of(broken.profile.build_s.begin(), broken.profile.build_s.end(),
                          [](const auto& part) { return part.first == "load_inline"; }))
      << "a failed build reports its seconds too: " << to_json(broken).dump(2);

  // The pre-build ran at [tuning] prebuild_niceness (-5 by default: the builds first) where this
  // process may lower a nice value, else at its own: the fixture's build worker puts its nice value
  // into the CUDA source nvcc refuses (nvcc inheriting it: core's NiceIncrementIsInheritedByGrandchildren).
  errno = 0;
  int own = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  int favoured = std::clamp(own + EvalOptions{}.tuning.prebuild_niceness, -20, 19);
  int expected = nice_value_allowed(favoured) ? favoured : own;
  EXPECT_EQ(status_name(niced.status), std::string("compile_error")) << to_json(niced).dump(2);
  EXPECT_NE(niced.message.find(fmt::format("kz-build-niceness[{}]", expected)), std::string::npos)
      << "expected nice " << expected << ": " << niced.message;

  // Other formats are never pre-built.
  EXPECT_EQ(triton.status, EvalStatus::ok) << to_json(triton).dump(2);
  EXPECT_FALSE(triton.profile.prebuild_s.has_value());
  EXPECT_TRUE(triton.profile.build_s.empty()) << "nothing built";
  EXPECT_TRUE(triton.profile.started_s.has_value());

  // A cached verdict is not built again: the repeat is a lookup.
  auto again = c.submit({relu_item("cuda", "suite/examples/cuda/02_relu.py")});
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto repeat = c.wait(again->batch, std::chrono::minutes(5));
  ASSERT_TRUE(repeat.ok() && repeat->size() == 1u && (*repeat)[0].verdict);
  EXPECT_TRUE((*repeat)[0].verdict->cached) << to_json(*(*repeat)[0].verdict).dump(2);
  EXPECT_FALSE((*repeat)[0].verdict->profile.prebuild_s.has_value()) << "no pre-build for a cache hit";
}

}  // namespace
}  // namespace kz
