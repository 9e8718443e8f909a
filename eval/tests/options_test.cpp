// EvalOptions: TOML overrides, validation, and the printed configuration.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "kz/eval/options.h"

namespace kz {
namespace {

TEST(Options, DefaultsValidate) { EXPECT_TRUE(EvalOptions{}.validate().is_ok()); }

TEST(Options, TomlOverridesNestedKeys) {
  EvalOptions o;
  auto status = apply_toml_text(R"(
device = "cuda:1"
trials = 7
[timing]
runs = 31
[tolerance]
atol_fp32 = 0.001
[size_overrides]
batch_size = 4
)", "test", o);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(o.device, "cuda:1");
  EXPECT_EQ(o.trials, 7);
  EXPECT_EQ(o.timing.runs, 31);
  EXPECT_DOUBLE_EQ(o.tolerance.atol_fp32, 0.001);
  EXPECT_EQ(o.size_overrides.at("batch_size"), 4);
}

TEST(Options, UnknownKeysAndWrongTypesAreNamed) {
  EvalOptions o;
  auto unknown = apply_toml_text("[timing]\nrunz = 3\n", "cfg.toml", o);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.message().find("timing.runz"), std::string::npos) << unknown.message();
  EXPECT_NE(unknown.message().find("cfg.toml"), std::string::npos);
  auto typed = apply_toml_text("trials = \"five\"\n", "cfg.toml", o);
  ASSERT_FALSE(typed.is_ok());
  EXPECT_NE(typed.message().find("trials"), std::string::npos);
}

TEST(Options, SyntaxErrorsGiveLineNumbers) {
  EvalOptions o;
  auto status = apply_toml_text("trials = 3\n[timing\n", "broken.toml", o);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("broken.toml:2"), std::string::npos) << status.message();
}

TEST(Options, InvalidValuesAreRejected) {
  EvalOptions o;
  EXPECT_FALSE(apply_toml_text("trials = 0\n", "t", o).is_ok());
  EvalOptions p;
  EXPECT_FALSE(apply_toml_text("device = \"tpu\"\n", "t", p).is_ok());
  EvalOptions q;
  EXPECT_FALSE(apply_toml_text("format = \"fortran\"\n", "t", q).is_ok());
  EvalOptions r;
  EXPECT_FALSE(apply_toml_text("[tuning]\nspare_servers = -1\n", "t", r).is_ok());
  EvalOptions every_format, some;
  EXPECT_EQ(every_format.kernel_share, "cuda") << "the default";
  EXPECT_TRUE(apply_toml_text("kernel_share = \"all\"\n", "t", every_format).is_ok());
  EXPECT_EQ(every_format.kernel_share, "all");
  EXPECT_FALSE(apply_toml_text("kernel_share = \"triton\"\n", "t", some).is_ok());
  for (const char* connections : {"-1", "33"}) {
    EvalOptions c;
    EXPECT_FALSE(apply_toml_text(fmt::format("[worker]\ncuda_connections = {}\n", connections), "t", c).is_ok())
        << connections;
  }
  for (const char* niceness : {"-21", "1"}) {
    EvalOptions n;
    EXPECT_FALSE(apply_toml_text(fmt::format("[tuning]\ntiming_niceness = {}\n", niceness), "t", n).is_ok()) << niceness;
  }
  for (const char* niceness : {"-21", "20"}) {
    EvalOptions n;
    EXPECT_FALSE(apply_toml_text(fmt::format("[tuning]\nprebuild_niceness = {}\n", niceness), "t", n).is_ok())
        << niceness;
  }
  for (const char* niceness : {"-21", "1"}) {  // above 0 the worker could not be set back without privileges
    EvalOptions n;
    EXPECT_FALSE(apply_toml_text(fmt::format("[tuning]\nprepare_niceness = {}\n", niceness), "t", n).is_ok())
        << niceness;
  }
  for (const char* niceness : {"-21", "1"}) {
    EvalOptions n;
    EXPECT_FALSE(apply_toml_text(fmt::format("[tuning]\ncompile_niceness = {}\n", niceness), "t", n).is_ok())
        << niceness;
  }
  EvalOptions compiled;
  EXPECT_TRUE(apply_toml_text("[tuning]\ncompile_niceness = -5\n", "t", compiled).is_ok());  // the default is -10
  EXPECT_EQ(compiled.tuning.compile_niceness, -5);
  EvalOptions idle, sometimes;
  EXPECT_EQ(idle.tuning.nvcc_side_by_side, "always") << "the default";
  EXPECT_TRUE(apply_toml_text("[tuning]\nnvcc_side_by_side = \"idle\"\n", "t", idle).is_ok());
  EXPECT_EQ(idle.tuning.nvcc_side_by_side, "idle");
  EXPECT_FALSE(apply_toml_text("[tuning]\nnvcc_side_by_side = \"sometimes\"\n", "t", sometimes).is_ok());
  EvalOptions favoured;  // builds first: below 0
  EXPECT_TRUE(apply_toml_text("[tuning]\nprebuild_niceness = -6\n", "t", favoured).is_ok());  // the default is -5
  EXPECT_EQ(favoured.tuning.prebuild_niceness, -6);
  EvalOptions prepared;  // the first wave's preparation beside the builds
  EXPECT_TRUE(apply_toml_text("[tuning]\nprepare_niceness = -7\n", "t", prepared).is_ok());  // the default is -5
  EXPECT_EQ(prepared.tuning.prepare_niceness, -7);
  EvalOptions small_shm, negative_shm;
  EXPECT_TRUE(apply_toml_text("[sandbox]\nshm_mb = 64\n", "t", small_shm).is_ok());
  EXPECT_EQ(small_shm.sandbox.shm_mb, 64);
  EXPECT_FALSE(apply_toml_text("[sandbox]\nshm_mb = -1\n", "t", negative_shm).is_ok());
  EvalOptions off;
  EXPECT_TRUE(apply_toml_text("[tuning]\ntiming_niceness = 0\nsyntax_check = false\n", "t", off).is_ok());
  EXPECT_EQ(off.tuning.timing_niceness, 0);
  EXPECT_FALSE(off.tuning.syntax_check);
}

// The throughput knobs are a table of their own; [timing] and [worker] no longer take them.
TEST(Options, ThroughputKnobsLiveInTheTuningTable) {
  EvalOptions o;
  ASSERT_TRUE(apply_toml_text("[tuning]\njobs = 3\ngpu_jobs = 4\nexclusive_timing = false\nfork_server = \"never\"\n",
                              "t", o).is_ok());
  EXPECT_EQ(o.tuning.jobs, 3);
  EXPECT_EQ(o.tuning.gpu_jobs, 4);
  EXPECT_FALSE(o.tuning.exclusive_timing);
  EXPECT_EQ(o.tuning.fork_server, "never");
  for (const char* moved : {"[timing]\ngpu_jobs = 4\n", "[worker]\nfork_server = \"never\"\n", "jobs = 3\n",
                            "[tuning]\ngpu_jobs = 0\n", "[tuning]\njobs = -1\n"}) {
    EvalOptions m;
    EXPECT_FALSE(apply_toml_text(moved, "t", m).is_ok()) << moved;
  }
  EXPECT_NE(to_toml(EvalOptions{}).find("[tuning]"), std::string::npos) << "config show writes the table";
}

TEST(Options, ThePolicyAndTheToleranceRuleAreNamedValues) {
  EvalOptions o;
  EXPECT_EQ(o.policy.mode, "strict") << "the default";
  EXPECT_EQ(o.tolerance.rule, "kz") << "the default";
  ASSERT_TRUE(apply_toml_text("[policy]\nmode = \"kernelbench\"\nmin_custom_kernel_share = 0.3\n"
                              "[tolerance]\nrule = \"float64\"\n", "t", o).is_ok());
  EXPECT_EQ(o.policy.mode, "kernelbench");
  EXPECT_DOUBLE_EQ(o.policy.min_custom_kernel_share, 0.3);
  EXPECT_EQ(o.tolerance.rule, "float64");
  EXPECT_EQ(o.timing.baseline, "eager") << "the default";
  ASSERT_TRUE(apply_toml_text("[timing]\nbaseline = \"compile\"\n", "t", o).is_ok());
  EXPECT_EQ(o.timing.baseline, "compile");
  for (const char* bad : {"[policy]\nmode = \"lenient\"\n", "[policy]\nmin_custom_kernel_share = 1.5\n",
                          "[policy]\nmin_custom_kernel_share = -0.1\n", "[tolerance]\nrule = \"loose\"\n",
                          "[timing]\nbaseline = \"jit\"\n"}) {
    EvalOptions b;
    EXPECT_FALSE(apply_toml_text(bad, "t", b).is_ok()) << bad;
  }
}

// The wait for GPU memory other evaluations hold has a deadline of its own (stage await_memory).
TEST(Options, TheMemoryWaitHasATimeoutOfItsOwn) {
  EvalOptions o;
  EXPECT_EQ(o.timeouts.await_memory_s, 3600) << "the default";
  ASSERT_TRUE(apply_toml_text("[timeouts]\nawait_memory_s = 60.0\n", "t", o).is_ok());
  EXPECT_EQ(o.timeouts.await_memory_s, 60);
  EXPECT_EQ(o.timeouts.load_reference_s, 120) << "the evaluation's own stages are timed apart";
  EXPECT_NE(to_toml(o).find("await_memory_s = 60"), std::string::npos) << "kz config show prints it";
  EvalOptions zero;
  EXPECT_FALSE(apply_toml_text("[timeouts]\nawait_memory_s = 0.0\n", "t", zero).is_ok());
}

// The wait for the card itself to free what the slots promise: sent with every GPU request, 0 allowed.
TEST(Options, TheDeviceMemoryWaitIsAConfigValue) {
  EvalOptions o;
  EXPECT_EQ(o.timeouts.device_memory_wait_s, 30) << "the default";
  ASSERT_TRUE(apply_toml_text("[timeouts]\ndevice_memory_wait_s = 0.0\n", "t", o).is_ok()) << "0: no wait";
  EXPECT_EQ(o.timeouts.device_memory_wait_s, 0);
  EXPECT_NE(to_toml(o).find("device_memory_wait_s = 0"), std::string::npos) << "kz config show prints it";
  EvalOptions negative;
  auto bad = apply_toml_text("[timeouts]\ndevice_memory_wait_s = -1.0\n", "t", negative);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("device_memory_wait_s"), std::string::npos) << bad.message();
}

TEST(Options, PrintedConfigParsesBackToTheSameValues) {
  EvalOptions o;
  o.trials = 9;
  o.timing.l2_flush_mb = 128;
  o.timing.launch_spin_us = 75;
  o.tolerance.norm_tol_half = 0.5;
  o.size_overrides["dim"] = 64;
  o.tuning.gpu_jobs = 3;
  std::string text = to_toml(o);
  EvalOptions back;
  auto status = apply_toml_text(text, "printed", back);
  ASSERT_TRUE(status.is_ok()) << status.to_string() << "\n" << text;
  EXPECT_EQ(back.trials, 9);
  EXPECT_EQ(back.timing.l2_flush_mb, 128);
  EXPECT_EQ(back.timing.launch_spin_us, 75);
  EXPECT_DOUBLE_EQ(back.tolerance.norm_tol_half, 0.5);
  EXPECT_EQ(back.size_overrides.at("dim"), 64);
  EXPECT_EQ(back.tuning.gpu_jobs, 3);
}

TEST(Options, ShippedConfigFileMatchesTheDefaults) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr);
  EvalOptions from_file;
  auto status = apply_toml_file(std::filesystem::path(source_dir) / "configs" / "eval.toml", from_file);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(to_toml(from_file), to_toml(EvalOptions{}));
}

}  // namespace
}  // namespace kz
