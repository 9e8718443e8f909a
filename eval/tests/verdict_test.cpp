// Verdict names and JSON round trips; unknown names from the worker are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "kz/eval/verdict.h"

namespace kz {
namespace {

TEST(Verdict, StatusAndCheckNamesRoundTrip) {
  for (auto s : {EvalStatus::ok, EvalStatus::compiled_not_run, EvalStatus::timeout, EvalStatus::infra_error})
    EXPECT_EQ(parse_status(status_name(s)), s);
  for (auto c : {Check::output_norm_mismatch, Check::input_mutated, Check::worker_crashed})
    EXPECT_EQ(parse_check(check_name(c)), c);
  EXPECT_FALSE(parse_status("great"));
  EXPECT_FALSE(parse_check("looks_fine"));
}

// The GPU memory checks, as the worker sends them: infra_error, never the candidate's.
TEST(Verdict, TheGpuMemoryChecksParse) {
  EXPECT_EQ(parse_check("out_of_memory_shared"), Check::out_of_memory_shared);
  EXPECT_EQ(parse_check("exceeds_gpu_memory"), Check::exceeds_gpu_memory);
  auto v = verdict_from_json({{"status", "infra_error"}, {"checks", {"exceeds_gpu_memory"}}});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->has_check(Check::exceeds_gpu_memory));
}

// Every status and check constant of worker/kz_worker/verdict.py is a name this side knows: one
// the C++ lists lack would turn the worker's verdict into a worker_protocol infra_error.
TEST(Verdict, EveryNameInTheWorkersListParses) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "KZ_SOURCE_DIR is not set (run through ctest)";
  std::ifstream file(std::filesystem::path(source_dir) / "worker" / "kz_worker" / "verdict.py");
  ASSERT_TRUE(file) << "worker/kz_worker/verdict.py";
  std::stringstream text;
  text << file.rdbuf();
  std::string source = text.str();
  const std::regex constant(R"re((?:^|\n)[A-Z][A-Z0-9_]* = "([a-z0-9_]+)")re");
  int names = 0;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), constant); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1];
    EXPECT_TRUE(parse_status(name) || parse_check(name)) << name << " is in verdict.py, not in verdict.h";
    ++names;
  }
  EXPECT_GT(names, 40) << "the constants were found";
}

TEST(Verdict, JsonRoundTripKeepsTheMemoryReportAndTheRetry) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  auto bare = to_json(v);
  EXPECT_FALSE(bare.contains("memory")) << "absent where the worker reported none";
  EXPECT_FALSE(bare.contains("retried_alone")) << "written only when true";
  EXPECT_FALSE(verdict_from_json(bare)->memory);
  MemoryReport m;
  m.reference_peak_mb = 1536.5;
  m.budget_mb = 4096;
  m.slots = 3;
  m.slot_mb = 1500;
  m.capacity_mb = 24000;
  m.card_mb = 81559;
  m.peak_mb = 3100.25;
  m.wait_s = 2.5;
  m.alone = false;
  m.estimate = "meta";
  v.memory = m;
  v.retried_alone = true;
  auto json = to_json(v);
  EXPECT_EQ(json["memory"]["slots"], 3);
  EXPECT_EQ(json["memory"]["estimate"], "meta");
  EXPECT_EQ(json["memory"]["alone"], false);
  EXPECT_EQ(json["retried_alone"], true);
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_TRUE(back->memory);
  EXPECT_EQ(back->memory->reference_peak_mb, 1536.5);
  EXPECT_EQ(back->memory->budget_mb, 4096);
  EXPECT_EQ(back->memory->slots, 3);
  EXPECT_EQ(back->memory->slot_mb, 1500);
  EXPECT_EQ(back->memory->capacity_mb, 24000);
  EXPECT_EQ(back->memory->card_mb, 81559);
  EXPECT_EQ(back->memory->peak_mb, 3100.25);
  EXPECT_EQ(back->memory->wait_s, 2.5);
  EXPECT_EQ(back->memory->alone, false);
  EXPECT_EQ(back->memory->estimate, "meta");
  EXPECT_TRUE(back->retried_alone);
}

// As the worker sends it: only what it knew; an absent figure stays absent (not 0), and one of the
// wrong type is left out rather than failing the verdict (diagnostics).
TEST(Verdict, AMemoryReportKeepsOnlyTheFieldsTheWorkerSent) {
  auto v = verdict_from_json({{"status", "infra_error"},
                              {"checks", {"exceeds_gpu_memory"}},
                              {"memory", {{"reference_peak_mb", 90000.0}, {"capacity_mb", 72000}, {"slots", "many"}}}});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  ASSERT_TRUE(v->memory);
  EXPECT_EQ(v->memory->reference_peak_mb, 90000.0);
  EXPECT_EQ(v->memory->capacity_mb, 72000);
  EXPECT_FALSE(v->memory->slots) << "not a number";
  EXPECT_FALSE(v->memory->budget_mb);
  EXPECT_FALSE(v->memory->alone);
  EXPECT_EQ(to_json(*v)["memory"], (nlohmann::json{{"reference_peak_mb", 90000.0}, {"capacity_mb", 72000.0}}));
  EXPECT_FALSE(v->retried_alone);
}

// The wait for GPU memory is entered from load_reference, and comes after it in stage_s.
TEST(Verdict, AwaitMemoryComesAfterTheReferenceInStageSeconds) {
  auto v = verdict_from_json(
      {{"status", "ok"},
       {"profile", {{"stage_s", {{"compile", 3.0}, {"load_reference", 1.0}, {"await_memory", 2.0}, {"startup", 0.5}}}}}});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->profile.stage_s, (std::vector<std::pair<std::string, double>>{
                            {"startup", 0.5}, {"load_reference", 1.0}, {"await_memory", 2.0}, {"compile", 3.0}}));
}

TEST(Verdict, JsonRoundTripKeepsTimingAndChecks) {
  Verdict v = make_verdict(EvalStatus::incorrect, {Check::output_mismatch, Check::input_mutated}, "bad");
  v.task_id = "02_relu";
  v.compiled = true;
  v.candidate_timing = TimingStats{2.0, 2.1, 0.1, 1.9, 2.5, 1.95, 2.3, 100};
  v.reference_timing = TimingStats{4.0, 4.1, 0.1, 3.9, 4.5, 3.95, 4.3, 100};
  v.speedup = 2.0;
  auto json = to_json(v);
  EXPECT_EQ(json["status"], "incorrect");
  EXPECT_EQ(json["runtime_ms"], 2.0);
  EXPECT_EQ(json["ref_runtime_ms"], 4.0);
  EXPECT_EQ(json["checks"][1], "input_mutated");
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->checks, v.checks);
  EXPECT_EQ(back->speedup, 2.0);
  EXPECT_EQ(back->candidate_timing->p90_ms, 2.3);
  EXPECT_TRUE(back->has_check(Check::output_mismatch));
  EXPECT_FALSE(json["profile"].contains("timing_end")) << "no end chosen, none written";
}

TEST(Verdict, JsonRoundTripKeepsTheTimingEndAndItsGaps) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  v.candidate_timing = TimingStats{0.5, 0.5, 0.01, 0.48, 0.6, 0.49, 0.52, 100};
  v.reference_timing = TimingStats{0.2, 0.2, 0.01, 0.19, 0.3, 0.19, 0.21, 100};
  v.profile.timing_end = "device_sync";
  v.profile.reference_gap_ms = 0.012;
  v.profile.candidate_gap_ms = 0.4;
  v.profile.launch_spin = "gated";
  auto json = to_json(v);
  EXPECT_EQ(json["profile"]["timing_end"], "device_sync");
  EXPECT_EQ(json["profile"]["launch_spin"], "gated");
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.timing_end, "device_sync");
  EXPECT_EQ(back->profile.launch_spin, "gated");
  EXPECT_EQ(back->profile.reference_gap_ms, 0.012);
  EXPECT_EQ(back->profile.candidate_gap_ms, 0.4);
}

TEST(Verdict, JsonRoundTripKeepsStageSeconds) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  v.profile.stage_s = {{"startup", 1.5}, {"compile", 0.25}, {"timing", 2.0}};
  auto json = to_json(v);
  EXPECT_EQ(json["profile"]["stage_s"]["compile"], 0.25);
  EXPECT_FALSE(json.contains("stage_s") || json.contains("wall_s")) << "telemetry stays in the profile";
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.stage_s, v.profile.stage_s) << "in the order the stages run, as recorded";
  EXPECT_TRUE(to_json(make_verdict(EvalStatus::format_error, {}, "no worker"))["profile"]["stage_s"].empty());
}

TEST(Verdict, JsonRoundTripKeepsTheStartupsParts) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("startup_s")) << "absent where no worker reported it (a verdict the static checks decided)";
  v.profile.startup_s = {{"device", 0.75}, {"server", 4.5}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.startup_s, v.profile.startup_s);
}

TEST(Verdict, JsonRoundTripKeepsTheCorrectnessStagesParts) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("correctness_s")) << "absent where the stage was not reached";
  v.profile.correctness_s = {{"audit", 0.5}, {"replay_probe", 0.125}, {"trials", 0.25}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.correctness_s, v.profile.correctness_s);
}

TEST(Verdict, JsonRoundTripKeepsTheCompileStagesParts) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("compile_s")) << "absent where the stage was not reached";
  v.profile.compile_s = {{"construct", 0.25}, {"import", 0.125}, {"nvrtc", 0.0625}, {"to_device", 0.5}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.compile_s, v.profile.compile_s);
}

TEST(Verdict, JsonRoundTripKeepsTheLoadReferenceStagesPartsAndTheWaitsByStage) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("load_reference_s")) << "absent where the stage was not reached";
  EXPECT_FALSE(to_json(v)["profile"].contains("gpu_wait_by_stage_s")) << "absent where nothing waited for the GPU";
  v.profile.load_reference_s = {{"build", 0.25}, {"import", 0.125}, {"inputs", 0.5}, {"warm_up", 0.0625}};
  v.profile.gpu_wait_by_stage_s = {{"correctness", 0.75}, {"load_reference", 0.375}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.load_reference_s, v.profile.load_reference_s);
  EXPECT_EQ(back->profile.gpu_wait_by_stage_s, v.profile.gpu_wait_by_stage_s);
}

TEST(Verdict, JsonRoundTripKeepsTheTimingsParts) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("timing_s")) << "absent where nothing was timed";
  v.profile.timing_s = {{"checks", 0.03}, {"inputs", 0.01}, {"timed", 0.2}, {"warmup", 0.05}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.timing_s, v.profile.timing_s);
}

TEST(Verdict, JsonRoundTripKeepsTheTimingsWorkAfterItsHold) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("timing_after_hold_s")) << "absent where nothing was timed";
  v.profile.timing_s = {{"checks", 0.03}, {"timed", 0.2}};
  v.profile.timing_after_hold_s = {{"checks", 0.125}};
  auto json = to_json(v);
  EXPECT_EQ(json["profile"]["timing_after_hold_s"]["checks"], 0.125);
  EXPECT_EQ(json["profile"]["timing_s"]["checks"], 0.03) << "a field of its own: timing_s stays the exclusive hold";
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.timing_after_hold_s, v.profile.timing_after_hold_s);
  EXPECT_EQ(back->profile.timing_s, v.profile.timing_s);
}

TEST(Verdict, JsonRoundTripKeepsGpuLockSeconds) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("gpu_wait_s")) << "absent where no GPU lock was taken";
  v.profile.gpu_wait_s = 3.5;
  v.profile.gpu_exclusive_s = 0.25;
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.gpu_wait_s, 3.5);
  EXPECT_EQ(back->profile.gpu_exclusive_s, 0.25);
}

TEST(Verdict, JsonRoundTripKeepsThePreBuildSeconds) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("prebuild_s")) << "absent where nothing was pre-built";
  v.profile.prebuild_s = 41.5;
  auto json = to_json(v);
  EXPECT_EQ(json["profile"]["prebuild_s"], 41.5);
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.prebuild_s, 41.5);
  EXPECT_FALSE(verdict_from_json(to_json(make_verdict(EvalStatus::ok, {}, "")))->profile.prebuild_s);
}

TEST(Verdict, JsonRoundTripKeepsTheBatchTimeline) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("started_s")) << "absent outside eval-suite";
  EXPECT_FALSE(to_json(v)["profile"].contains("prebuild_started_s"));
  v.profile.started_s = 40.25;
  v.profile.prebuild_started_s = 0.5;
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.started_s, 40.25);
  EXPECT_EQ(back->profile.prebuild_started_s, 0.5);
}

TEST(Verdict, JsonRoundTripKeepsTheBuildsParts) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v)["profile"].contains("build_s")) << "absent where nothing was built";
  v.profile.build_s = {{"load_inline", 6.5}, {"ninja", 6.25}, {"ninja_cuda", 6.0}};
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.build_s, v.profile.build_s);
}

TEST(Verdict, JsonRoundTripKeepsTheCpuSeconds) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  auto bare = to_json(v);
  EXPECT_FALSE(bare["profile"].contains("cpu_s")) << "absent where no worker reported it";
  EXPECT_FALSE(bare["profile"].contains("prebuild_cpu_s"));
  v.profile.cpu_s = {{"subprocesses", 0.25}, {"worker", 1.5}};  // a JSON object's order: by name
  v.profile.prebuild_cpu_s = 11.125;
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->profile.cpu_s, v.profile.cpu_s);
  EXPECT_EQ(back->profile.prebuild_cpu_s, 11.125);
}

TEST(Verdict, APreBuildGoesOnTheEvaluationAfterIt) {
  Verdict build = make_verdict(EvalStatus::compiled_not_run, {}, "built");
  build.profile.cpu_s = {{"worker", 1.25}, {"subprocesses", 8.5}};
  build.profile.wall_s = 9.5;
  build.profile.stage_s = {{"startup", 1.5}, {"load_reference", 0.25}, {"compile", 7.5}};
  build.profile.build_s = {{"load_inline", 7.0}};
  PreBuild prebuild = prebuild_of(build, 0.125);
  EXPECT_EQ(prebuild.started_s, 0.125);
  EXPECT_EQ(prebuild.seconds, 9.5);
  using Parts = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(prebuild.build_s, (Parts{{"load_inline", 7.0}, {"worker_start", 1.75}})) << "the stages before compile";

  Verdict evaluation = make_verdict(EvalStatus::ok, {}, "correct");
  attach_prebuild(evaluation, prebuild);
  EXPECT_EQ(evaluation.profile.prebuild_started_s, 0.125);
  EXPECT_EQ(evaluation.profile.prebuild_s, 9.5);
  EXPECT_EQ(evaluation.profile.prebuild_cpu_s, 9.75) << "the build's worker and its subprocesses";
  EXPECT_TRUE(evaluation.profile.cpu_s.empty()) << "the evaluation's own CPU is its worker's to report";
  EXPECT_EQ(evaluation.profile.build_s, prebuild.build_s);

  Verdict rebuilt = make_verdict(EvalStatus::ok, {}, "correct");  // it built again itself: its own parts stay
  rebuilt.profile.build_s = {{"load_inline", 3.0}};
  attach_prebuild(rebuilt, prebuild);
  EXPECT_EQ(rebuilt.profile.build_s, (Parts{{"load_inline", 3.0}}));
  EXPECT_TRUE(prebuild_of(make_verdict(EvalStatus::compiled_not_run, {}, ""), 0).build_s.empty())
      << "no worker_start alone where nothing was built (a kept build)";
  EXPECT_FALSE(prebuild_of(make_verdict(EvalStatus::compiled_not_run, {}, ""), 0).cpu_s) << "none reported";
}

TEST(Verdict, UntimedVerdictHasNullSpeedup) {
  auto json = to_json(make_verdict(EvalStatus::ok, {}, "correct"));
  EXPECT_TRUE(json["speedup"].is_null());
  EXPECT_TRUE(json["runtime_ms"].is_null());
  EXPECT_TRUE(json["timing"].is_null());
}

TEST(Verdict, JsonRoundTripKeepsTheChecksThatCouldNotRun) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  EXPECT_FALSE(to_json(v).contains("unchecked")) << "absent where every check ran";
  v.unchecked = {{Check::no_custom_kernel, "the profiler did not start (RuntimeError: CUPTI)"}};
  auto json = to_json(v);
  EXPECT_EQ(json["unchecked"]["no_custom_kernel"], "the profiler did not start (RuntimeError: CUPTI)");
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->unchecked, v.unchecked);
}

TEST(Verdict, JsonRoundTripKeepsThePolicyAndTheCustomKernelShare) {
  Verdict v = make_verdict(EvalStatus::cheat_detected, {Check::no_kernel_effect}, "a decoy");
  v.policy = "kernelbench";
  v.custom_kernel_share = 0.25;
  auto back = verdict_from_json(to_json(v));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->policy, "kernelbench");
  EXPECT_EQ(back->custom_kernel_share, 0.25);
  EXPECT_TRUE(back->has_check(Check::no_kernel_effect));
}

TEST(Verdict, JsonRoundTripKeepsTheSpeedupOverTorchCompile) {
  Verdict v = make_verdict(EvalStatus::ok, {}, "correct");
  v.reference_timing = v.candidate_timing = TimingStats{.median_ms = 2, .runs = 100};
  v.speedup = 1.0;
  EXPECT_FALSE(to_json(v).contains("compile_speedup")) << "absent without a compile baseline";
  v.compiled_reference_timing = TimingStats{.median_ms = 1, .runs = 100};
  v.compile_speedup = 0.5;
  auto json = to_json(v);
  EXPECT_EQ(json["timing"]["compiled"]["median_ms"], 1.0);
  auto back = verdict_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->compile_speedup, 0.5);
  ASSERT_TRUE(back->compiled_reference_timing.has_value());
  EXPECT_EQ(back->compiled_reference_timing->median_ms, 1.0);
}

TEST(Verdict, UnknownNamesFromTheWorkerAreErrors) {
  EXPECT_FALSE(verdict_from_json({{"status", "fine"}}).ok());
  EXPECT_FALSE(verdict_from_json({{"status", "ok"}, {"checks", {"made_up"}}}).ok());
  EXPECT_FALSE(verdict_from_json({{"status", "ok"}, {"unchecked", {{"made_up", "why"}}}}).ok());
  EXPECT_FALSE(verdict_from_json({{"status", "ok"}, {"unchecked", {{"no_custom_kernel", 1}}}}).ok()) << "no reason";
  EXPECT_FALSE(verdict_from_json({{"status", "ok"}, {"unchecked", "no_custom_kernel"}}).ok()) << "not an object";
  EXPECT_FALSE(verdict_from_json(nlohmann::json::array()).ok());
}

}  // namespace
}  // namespace kz
