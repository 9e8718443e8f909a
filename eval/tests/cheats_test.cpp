// The anti-cheating checks end to end: the real supervisor (static checks) and the real worker
// (worker/kz_worker/cheats.py) on device "cpu", one adversarial Triton candidate per cheat
// (eval/tests/cheats/, each file's docstring names the cheat and the check expected), plus the
// honest examples, which must pass with no check firing. A case names the policy it is judged under
// ([policy] mode; strict unless it says so): the policy fixtures run under both.
//
// All evaluations run once, in parallel, before the tests (SetUpTestSuite); each parameterised test
// then asserts on its verdict. Needs KZ_SOURCE_DIR (CTest sets it).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kz/core/files.h"
#include "kz/eval/evaluator.h"
#include "kz/task/task.h"
#include "test_support.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

using test::source_dir;

constexpr const char* kRelu = "suite/kzbench/level1/02_relu.py";
constexpr const char* kMse = "suite/kzbench/level2/20_mse_loss.py";
constexpr const char* kTiny = "eval/tests/fixtures/ref_tiny_output.py";
constexpr const char* kTranspose = "eval/tests/cheats/ref_transpose.py";
constexpr const char* kLinearRelu = "suite/kzbench/level2/16_linear_relu.py";

struct Case {
  std::string candidate;            // relative to the source dir
  std::string reference;
  std::vector<EvalStatus> statuses;  // the verdict is one of these
  std::vector<Check> any_of;        // at least one of these fired
  std::string format = "auto";
  std::string policy = "strict";
};

std::string cheat(const std::string& name) { return "eval/tests/cheats/" + name + ".py"; }

// fixture -> expected status and check. "static": the supervisor's scan; the rest are the worker's.
const std::vector<Case>& cheat_cases() {
  using S = EvalStatus;
  using C = Check;
  static const std::vector<Case> cases = {
      {cheat("torch_compute_in_forward"), kRelu, {S::cheat_detected}, {C::torch_compute_in_forward}},
      {cheat("torch_fallback_on_error"), kRelu, {S::cheat_detected}, {C::torch_compute_in_forward}},
      {cheat("kernel_never_launched"), kRelu, {S::cheat_detected}, {C::no_custom_kernel}},
      {cheat("inherits_reference"), kRelu, {S::cheat_detected}, {C::inherits_reference}},                   // static
      {cheat("uninitialised_output"), kRelu, {S::incorrect}, {C::output_mismatch, C::output_not_finite}},
      {cheat("partial_output"), kRelu, {S::incorrect}, {C::output_mismatch, C::output_not_finite}},
      {cheat("aliases_input"), kTranspose, {S::incorrect}, {C::output_aliases_input}},
      {cheat("mutates_inputs"), kRelu, {S::incorrect}, {C::input_mutated}},
      {cheat("side_stream"), kRelu, {S::cheat_detected}, {C::side_stream}},                                 // static
      {cheat("background_thread"), kRelu, {S::cheat_detected}, {C::background_thread}},                     // static
      {cheat("background_thread_hidden"), kRelu, {S::cheat_detected}, {C::background_thread}},
      {cheat("cache_by_pointer"), kRelu, {S::cheat_detected}, {C::replayed_output}},
      {cheat("cache_by_shape"), kRelu, {S::cheat_detected}, {C::replayed_output}},
      {cheat("replay_results"), kRelu, {S::cheat_detected}, {C::replayed_output}},
      {cheat("patch_timers"), kRelu, {S::cheat_detected}, {C::harness_access}},                             // static
      {cheat("patch_timers_hidden"), kRelu, {S::cheat_detected}, {C::harness_patched}},
      {cheat("patch_harness"), kRelu, {S::cheat_detected}, {C::harness_access}},                            // static
      {cheat("patch_harness_hidden"), kRelu, {S::cheat_detected}, {C::harness_patched}},
      {cheat("patch_closure_hidden"), kRelu, {S::cheat_detected}, {C::harness_patched}},
      {cheat("lazy_tensor_subclass"), kRelu, {S::cheat_detected}, {C::tensor_subclass}},                    // static
      {cheat("precision_fp16"), kRelu, {S::incorrect}, {C::output_mismatch}},
      {cheat("degenerate_zeros"), kTiny, {S::incorrect}, {C::output_norm_mismatch}},
      // The constant is the loss's expected value: within tolerance for some seeds, then the same
      // bits for a second input set give it away.
      {cheat("degenerate_constant"), kMse, {S::incorrect, S::cheat_detected}, {C::output_mismatch, C::replayed_output}},
      {cheat("reference_tampered"), kRelu, {S::cheat_detected}, {C::reference_tampered}},
      {cheat("steals_reference_output"), kRelu, {S::cheat_detected}, {C::harness_access}},
      {cheat("tensor_methods_hidden"), kRelu, {S::cheat_detected}, {C::harness_patched}},
      {cheat("function_mode_hidden"), kRelu, {S::cheat_detected}, {C::harness_patched}},
      {cheat("copies_expected_output_hidden"), kRelu, {S::cheat_detected}, {C::harness_access}},    // audit hook
      {cheat("forged_result_hidden"), kRelu, {S::cheat_detected}, {C::forged_message}},              // supervisor
      // The colleague's four (eval/tests/fixtures/): the static scan refuses them as written.
      {"eval/tests/fixtures/cheat_patches_tensor_methods.py", kRelu, {S::cheat_detected}, {C::harness_access}},
      {"eval/tests/fixtures/cheat_patches_reference_op.py", kRelu, {S::cheat_detected}, {C::harness_access}},
      {"eval/tests/fixtures/cheat_torch_function_mode.py", kRelu, {S::cheat_detected}, {C::tensor_subclass}},
      {"eval/tests/fixtures/cheat_forges_result.py", kRelu, {S::cheat_detected}, {C::harness_access}},
      // What ModelNew.forward may run: a decoy kernel beside PyTorch compute is refused under both
      // policies; an honest partial answer only under strict (it passes under kernelbench: honest_cases).
      {cheat("policy_decoy_kernel"), kLinearRelu, {S::cheat_detected}, {C::torch_compute_in_forward}},
      {cheat("policy_decoy_kernel"), kLinearRelu, {S::cheat_detected}, {C::no_kernel_effect}, "auto", "kernelbench"},
      {cheat("policy_partial_matmul_epilogue"), kLinearRelu, {S::cheat_detected}, {C::torch_compute_in_forward}},
  };
  return cases;
}

// The honest candidates: every Triton example, two references evaluated as torch candidates, and
// under policy kernelbench an honest partial answer and an example (whose kernel's work must reach
// its output, as every honest one's does).
const std::vector<Case>& honest_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> list;
    if (source_dir().empty()) return list;
    for (const char* level : {"level1", "level2"}) {
      for (const auto& entry : fs::directory_iterator(source_dir() / "suite/kzbench" / level)) {
        std::string name = entry.path().filename().string();
        std::string reference = std::string("suite/kzbench/") + level + "/" + name;
        list.push_back({"suite/examples/triton/" + name, reference, {EvalStatus::ok}, {}});
      }
    }
    std::sort(list.begin(), list.end(), [](const Case& a, const Case& b) { return a.candidate < b.candidate; });
    list.push_back({kRelu, kRelu, {EvalStatus::ok}, {}, "torch"});
    list.push_back({"suite/kzbench/level2/18_add_layernorm.py", "suite/kzbench/level2/18_add_layernorm.py",
                    {EvalStatus::ok}, {}, "torch"});
    list.push_back({cheat("policy_partial_matmul_epilogue"), kLinearRelu, {EvalStatus::ok}, {}, "auto", "kernelbench"});
    list.push_back({"suite/examples/triton/16_linear_relu.py", kLinearRelu, {EvalStatus::ok}, {}, "auto", "kernelbench"});
    return list;
  }();
  return cases;
}

std::string key_of(const Case& c) { return c.format + ":" + c.policy + ":" + c.candidate + "@" + c.reference; }

class CheatsTest : public ::testing::TestWithParam<Case> {
 public:
  // Evaluates every case once, a few at a time.
  static void SetUpTestSuite() {
    if (source_dir().empty()) return;
    std::vector<Case> all = cheat_cases();
    all.insert(all.end(), honest_cases().begin(), honest_cases().end());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next++) < all.size();) {
        const Case& c = all[i];
        EvalOptions o;
        o.trials = 2;
        o.format = c.format;
        o.policy.mode = c.policy;
        o.cache.enabled = false;  // every case runs its worker: a stored verdict would test nothing
        std::string outcome;
        Verdict verdict;
        auto evaluator = Evaluator::create(o);
        auto task = load_task_file(source_dir() / c.reference);
        auto source = read_file(source_dir() / c.candidate);
        if (!evaluator.ok() || !task.ok() || !source.ok()) {
          outcome = "could not set up the evaluation";
        } else {
          auto v = evaluator->evaluate(*task, Candidate{c.candidate, *source});
          if (v.ok()) verdict = *v;
          else outcome = v.status().to_string();
        }
        std::lock_guard lock(mutex_);
        verdicts_[key_of(c)] = verdict;
        if (!outcome.empty()) errors_[key_of(c)] = outcome;
      }
    };
    unsigned jobs = std::clamp(std::thread::hardware_concurrency(), 2u, 6u);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < jobs; ++t) threads.emplace_back(work);
    for (auto& t : threads) t.join();
  }

  static const Verdict* verdict_for(const Case& c) {
    std::lock_guard lock(mutex_);
    auto error = errors_.find(key_of(c));
    if (error != errors_.end()) {
      ADD_FAILURE() << c.candidate << ": " << error->second;
      return nullptr;
    }
    auto it = verdicts_.find(key_of(c));
    return it == verdicts_.end() ? nullptr : &it->second;
  }

 protected:
  void SetUp() override {
    if (source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  }

 private:
  static std::mutex mutex_;
  static std::map<std::string, Verdict> verdicts_;
  static std::map<std::string, std::string> errors_;
};

std::mutex CheatsTest::mutex_;
std::map<std::string, Verdict> CheatsTest::verdicts_;
std::map<std::string, std::string> CheatsTest::errors_;

std::string dump(const Verdict& v) { return to_json(v).dump(2); }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = fs::path(info.param.candidate).stem().string() + (info.param.format == "torch" ? "_torch" : "") +
                     (info.param.policy == "strict" ? "" : "_" + info.param.policy);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

using CaughtTest = CheatsTest;
using HonestTest = CheatsTest;

TEST_P(CaughtTest, WithItsCheck) {
  const Case& c = GetParam();
  const Verdict* v = verdict_for(c);
  ASSERT_NE(v, nullptr);
  std::string statuses;
  for (EvalStatus s : c.statuses) statuses += std::string(statuses.empty() ? "" : " or ") + status_name(s);
  EXPECT_NE(std::find(c.statuses.begin(), c.statuses.end(), v->status), c.statuses.end())
      << "expected " << statuses << "\n" << dump(*v);
  bool fired = std::any_of(c.any_of.begin(), c.any_of.end(), [&](Check k) { return v->has_check(k); });
  std::string expected;
  for (Check k : c.any_of) expected += std::string(expected.empty() ? "" : " or ") + check_name(k);
  EXPECT_TRUE(fired) << "expected " << expected << "\n" << dump(*v);
  EXPECT_FALSE(v->correct) << dump(*v);
}

TEST_P(HonestTest, PassesWithNoCheck) {
  const Verdict* v = verdict_for(GetParam());
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(status_name(v->status), std::string("ok")) << dump(*v);
  EXPECT_EQ(v->policy, GetParam().policy) << "every verdict says the policy it was judged under";
  EXPECT_TRUE(v->checks.empty()) << dump(*v);
  EXPECT_TRUE(v->correct) << dump(*v);
}

INSTANTIATE_TEST_SUITE_P(Cheats, CaughtTest, ::testing::ValuesIn(cheat_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Examples, HonestTest, ::testing::ValuesIn(honest_cases()), case_name);

TEST(CheatsTable, CoversEveryFixture) {
  ASSERT_FALSE(source_dir().empty());
  std::vector<std::string> listed;
  for (const Case& c : cheat_cases()) listed.push_back(c.candidate);
  for (const auto& entry : fs::directory_iterator(source_dir() / "eval/tests/cheats")) {
    std::string name = entry.path().filename().string();
    if (name.rfind("ref_", 0) == 0) continue;  // references
    // GPU-only fixtures (they need a run on a GPU: cuda / cuda-rtc candidates, timing).
    if (name.rfind("cuda_", 0) == 0 || name == "cache_by_pointer_late.py" || name == "side_stream_hidden.py")
      continue;
    EXPECT_NE(std::find(listed.begin(), listed.end(), "eval/tests/cheats/" + name), listed.end())
        << name << " has no row in cheat_cases()";
  }
  EXPECT_EQ(honest_cases().size(), 24u);
}

}  // namespace
}  // namespace kz
