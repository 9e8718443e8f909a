// The typed outcome of one evaluation: status, the checks that fired, timings.
//
// Status and check names are shared with the Python worker (worker/kz_worker/verdict.py); a
// name the C++ side does not know is an infra_error, so the two lists cannot drift apart.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/status.h"

namespace kz {

#define KZ_EVAL_STATUSES(X)                                                 \
  X(ok)                /* correct (and timed, on a GPU) */                   \
  X(compiled_not_run)  /* CPU machine: cuda/cuda-rtc sources compiled only */ \
  X(format_error)      /* fits no kernel format / no ModelNew */              \
  X(compile_error)     /* nvcc, NVRTC, Triton or Python syntax failed */      \
  X(runtime_error)     /* exception, crash or CUDA fault while running */     \
  X(incorrect)         /* ran, but a correctness check fired */              \
  X(timeout)           /* a stage ran past its deadline */                    \
  X(cheat_detected)    /* an anti-cheating check fired */                     \
  X(sandbox_violation) /* the candidate broke a sandbox rule */               \
  X(infra_error)       /* KernelZero or the reference failed, not the candidate */

#define KZ_EVAL_CHECKS(X)                                                       \
  X(no_model_new) X(python_syntax) X(kernel_compile) X(no_kernel_compiled)      \
  X(constructor_failed) X(forward_failed) X(output_type) X(output_structure)    \
  X(output_shape) X(output_dtype) X(output_device) X(output_not_finite)         \
  X(output_mismatch) X(output_norm_mismatch) X(output_aliases_input)            \
  X(input_mutated) X(wrong_after_timing) X(reference_failed)                    \
  /* anti-cheating (worker/kz_worker/cheats.py, eval/src/static_checks.cpp) */   \
  X(harness_patched) X(reference_tampered) X(torch_compute_in_forward)          \
  X(no_custom_kernel) X(no_kernel_effect) X(low_custom_kernel_share)            \
  X(output_aliases_reference) X(replayed_output)                                \
  X(wrong_during_timing) X(background_thread) X(inherits_reference)             \
  X(side_stream) X(tensor_subclass) X(harness_access) X(forged_message)         \
  /* sandbox (kz/sandbox/process.h limits, worker/kz_worker/sandbox.py audit hook) */ \
  X(cpu_limit) X(file_size_limit) X(scratch_limit) X(process_limit) X(memory_limit) \
  X(network_access) X(filesystem_write) X(process_spawn) X(process_signal)      \
  /* GPU memory (infra_error: the GPU's, not the candidate's; worker/kz_worker/gpu_memory.py) */ \
  X(out_of_memory_shared) X(exceeds_gpu_memory) X(gpu_memory_held_elsewhere)    \
  /* a build killed by SIGKILL (infra_error: the machine's memory; worker/kz_worker/errors.py) */ \
  X(build_killed)                                                                \
  X(format_unrecognised) X(no_code_block) X(stage_timeout) X(worker_crashed) X(worker_protocol)

enum class EvalStatus {
#define KZ_X(name) name,
  KZ_EVAL_STATUSES(KZ_X)
#undef KZ_X
};

enum class Check {
#define KZ_X(name) name,
  KZ_EVAL_CHECKS(KZ_X)
#undef KZ_X
};

const char* status_name(EvalStatus status);
std::optional<EvalStatus> parse_status(std::string_view name);
const char* check_name(Check check);
std::optional<Check> parse_check(std::string_view name);

// How the worker reserved and used GPU memory (worker/kz_worker/gpu_memory.py), in MB; every field
// optional, as the worker reports it. Diagnostics, and the figures an exceeds_gpu_memory or
// out_of_memory_shared verdict's message names.
struct MemoryReport {
  std::optional<double> reference_peak_mb;  // the reference's inputs + forward peak, estimated
  std::optional<double> budget_mb;          // GPU memory the evaluation reserved
  std::optional<int> slots;                 // memory slots held
  std::optional<double> slot_mb;            // one slot's share of capacity_mb
  std::optional<double> capacity_mb;        // what the evaluations on this GPU may share
  std::optional<double> card_mb;            // the card's memory
  std::optional<double> peak_mb;            // the worker's measured peak allocation
  std::optional<double> wait_s;             // seconds waiting for the reservation (stage await_memory)
  std::optional<bool> alone;                // held every slot (a retry alone: request gpu_alone)
  std::string estimate;                     // how reference_peak_mb was had: "meta" or "measured"; "" unsaid
};

// Median and spread of one model's timed runs, in milliseconds.
struct TimingStats {
  double median_ms = 0, mean_ms = 0, std_ms = 0, min_ms = 0, max_ms = 0, p10_ms = 0, p90_ms = 0;
  int runs = 0;
};

// Where an evaluation's seconds (and CPU) went: telemetry for the throughput reports, never part of a
// reward or of the verdict's outcome. Every field is measured by the worker unless it says otherwise.
struct VerdictProfile {
  double wall_s = 0;                // the whole evaluation, process start to verdict (the supervisor's)
  // A `cuda` candidate pre-built by kz eval-suite or kz serve-eval on a GPU: the wall_s of its
  // compile-only pre-build, which ran before this evaluation and is not in wall_s. Unset otherwise,
  // and where the build failed there (that verdict is the pre-build's own: its wall_s is the pre-build).
  std::optional<double> prebuild_s;
  // When kz eval-suite or kz serve-eval ran it, in seconds from the batch's start (its submission,
  // in the service): this evaluation's start, and its pre-build's (with prebuild_s: the batch's
  // timeline, the builds' critical path). Unset from kz eval; a final pre-build verdict has
  // started_s only.
  std::optional<double> started_s;
  std::optional<double> prebuild_started_s;
  // Seconds per worker stage (startup, load_reference, compile, correctness, timing, recheck),
  // measured by the supervisor; empty when no worker ran (static checks, cache hits keep the
  // stored run's).
  std::vector<std::pair<std::string, double>> stage_s;
  // Where the startup stage's seconds went, with a fork server: "server", the wait for one to be
  // forked or started (the first time, its zygote's imports), measured by the supervisor; "device",
  // the wait for its child's CUDA context, clock and launch gate, reported by the worker with, where
  // it waited, each step's own seconds ("device_context", "device_clock", "device_launch_gate",
  // "device_kernels": the harness's checks run once, their kernels loaded). The rest is the child's
  // own set-up. For a worker started for one request: "imports", "device" (the wait for the device
  // after the imports, with the same steps where it waited) and, on a GPU, "early_context" (its CUDA
  // context, made in a thread beside the imports).
  std::vector<std::pair<std::string, double>> startup_s;
  // Where the load_reference stage's seconds went (import: the reference module and its init inputs;
  // build: its Model on the device; inputs: every input set and reference output; warm_up: the
  // launch hooks, the audit's warm-up and the identity snapshot), GPU-lock waits included. Empty
  // when not reached.
  std::vector<std::pair<std::string, double>> load_reference_s;
  // Where the compile stage's seconds went (import: the candidate's module; construct: its ModelNew
  // built; to_device: moved to the device with the reference's weights; nvrtc: kz_rtc's compiles, a
  // `cuda-rtc` request's only, inside import and construct), GPU-lock waits included. Empty when not
  // reached.
  std::vector<std::pair<std::string, double>> compile_s;
  // Where the correctness stage's seconds went (audit, trials, replay_probe), GPU-lock waits
  // included. Empty when not reached.
  std::vector<std::pair<std::string, double>> correctness_s;
  // Where the timing's exclusive hold went (inputs, warmup, timed; inside the last two new_round,
  // guard: the Guard's verifies between runs, and samples: the sampled outputs' live checks and
  // copies). Empty when not timed.
  std::vector<std::pair<std::string, double>> timing_s;
  // The timing's work after its exclusive hold, under the shared lock and not in timing_s ("checks":
  // comparing the sampled outputs and inputs copied in the hold). Empty when not timed.
  std::vector<std::pair<std::string, double>> timing_after_hold_s;
  // Where a `cuda` candidate's load_inline build spent its seconds (import_to_build, load_inline,
  // ninja and its steps, kz-nvcc's phases: worker/kz_worker/compile/load_inline.py, build_parts),
  // reported by the worker that built; for a pre-built candidate, its pre-build's, with
  // "worker_start" (that worker's stages before compile). Empty when nothing built.
  std::vector<std::pair<std::string, double>> build_s;
  // GPU with the shared-GPU lock ([tuning] exclusive_timing): seconds the worker waited for the lock, and
  // held it exclusive (its timing).
  std::optional<double> gpu_wait_s, gpu_exclusive_s;
  // gpu_wait_s by the stage that waited (load_reference, compile, correctness, timing, recheck).
  // Empty without the lock or without a wait.
  std::vector<std::pair<std::string, double>> gpu_wait_by_stage_s;
  // CPU seconds (user + system) the worker spent on this request: "worker", its own process (all its
  // threads; a fork server's child counts from its fork, so its device preparation is in and the
  // zygote's imports are not; a worker started for the request counts its imports too), and
  // "subprocesses", those it waited for (a build's ninja, nvcc and compilers; Triton's ptxas and
  // launcher builds). Empty when no worker reported (a crash, a timeout, a static verdict) and in a
  // replay from the verdict cache.
  std::vector<std::pair<std::string, double>> cpu_s;
  // A pre-built `cuda` candidate: its pre-build's CPU seconds (the sum of that verdict's cpu_s).
  std::optional<double> prebuild_cpu_s;
  // Where both models' timed samples ended (worker/kz_worker/timing.py): "stream" (the end event
  // on the current stream as the forward returned) or "device_sync" (after a device-wide
  // synchronize: the candidate left work running on another stream); empty when untimed. Why: each
  // model's median gap between the two ends.
  std::string timing_end;
  double reference_gap_ms = 0, candidate_gap_ms = 0;
  // How each timed run's launch spin ended: "gated" (by the host once it had issued the run, at
  // most [timing] launch_spin_us), "fixed" (after launch_spin_us: the driver refused the gate) or
  // "none" (launch_spin_us = 0); empty when untimed.
  std::string launch_spin;
};

struct Verdict {
  std::string task_id;
  std::string candidate;            // the candidate's file (or label)
  std::string format;               // the format evaluated (after auto-detection)
  std::string device;
  std::string policy;               // the policy it was judged under ([policy] mode): strict or kernelbench
  EvalStatus status = EvalStatus::infra_error;
  bool compiled = false;
  bool correct = false;
  std::string stage;                // the last stage entered
  std::vector<Check> checks;        // every check that fired
  std::string message;
  int trials = 0, trials_passed = 0;
  double max_abs_error = 0, max_rel_norm_error = 0;
  std::optional<TimingStats> reference_timing, candidate_timing;
  std::optional<double> speedup;    // reference median / candidate median, when timed
  // [timing] baseline = "compile": torch.compile of the reference, timed beside it, and its median
  // over the candidate's. Unset otherwise, or where Inductor could not compile the reference.
  std::optional<TimingStats> compiled_reference_timing;
  std::optional<double> compile_speedup;
  // GPU, where the audit was profiled (`cuda`, every kernel format with kernel_share = "all" or under
  // policy kernelbench or a min_custom_kernel_share): the share of the audit forward's kernel time in
  // the candidate's own kernels.
  std::optional<double> custom_kernel_share;
  // Checks that could not run in this evaluation, with why: on a GPU, `cuda`'s no_custom_kernel
  // when the profiler gave no kernel list (no CUPTI). It passes then, as a check that cannot tell
  // must not cost the Coder a correct answer, and the verdict says so. Empty almost always.
  std::vector<std::pair<Check, std::string>> unchecked;
  uint64_t seed = 0;
  // GPU memory reserved and used, where the worker reported it (on a GPU, from the worker that
  // reserves memory); nullopt otherwise. What an exceeds_gpu_memory or out_of_memory_shared
  // verdict's message names.
  std::optional<MemoryReport> memory;
  // Run a second time with every memory slot of its GPU held (request gpu_alone), after the first
  // run's out_of_memory_shared: this verdict is the second run's, its profile's wall_s both runs'.
  bool retried_alone = false;
  bool cached = false;              // replayed from the verdict cache (kz/eval/cache.h); no worker ran
  VerdictProfile profile;           // where its seconds went

  bool has_check(Check check) const;
};

nlohmann::json to_json(const Verdict& verdict);
Result<Verdict> verdict_from_json(const nlohmann::json& json);

// Builds the verdict for a failure the supervisor detects itself (timeout, crash, ...).
Verdict make_verdict(EvalStatus status, std::vector<Check> checks, std::string message);

// A `cuda` candidate's finished compile-only pre-build (kz eval-suite, kz serve-eval), for the
// evaluation that follows it: when it started (seconds from the batch's start), its wall seconds,
// and where they went (its build_s, with "worker_start": its worker's startup and load_reference).
struct PreBuild {
  double started_s = 0, seconds = 0;
  std::vector<std::pair<std::string, double>> build_s;
  std::optional<double> cpu_s;  // the build's worker and subprocesses, where it reported them
};
PreBuild prebuild_of(const Verdict& build_verdict, double started_s);
// Puts the pre-build on the profile of the evaluation after it (prebuild_started_s, prebuild_s,
// prebuild_cpu_s, build_s).
void attach_prebuild(Verdict& verdict, const PreBuild& prebuild);

}  // namespace kz
