// Validating a module written by the Proposer before it becomes a reference task.
//
// The checks run in the Python worker (worker/kz_worker/validate.py, request mode
// "validate_module"), in a fresh process per module with the same isolation and stage deadlines as
// an evaluation (kz/eval/worker_client.h): loads, runs, deterministic, outputs finite and
// non-degenerate, depends on every input, executes every requested API (by the ATen ops its
// forward dispatches), runtime in a band. The first check that fails is the verdict. A module that
// is not valid Python fails `loads` before any worker starts ([tuning] syntax_check;
// kz/eval/syntax_check.h), in the worker's words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/eval/options.h"
#include "kz/task/catalogue.h"

namespace kz {

struct ModuleValidationOptions {
  std::string device = "cpu";     // "cpu" or "cuda:N"
  // CUDA only: the median forward time must lie in [min, max]. Below the minimum, launch overhead
  // dominates and a custom kernel has nothing to win; above the maximum, every evaluation (100
  // timed runs of two models) gets slow.
  double time_band_min_ms = 0.05;
  double time_band_max_ms = 50.0;
  // CPU only: the median forward time (at the module's cpu_sizes) may not exceed this; CPU
  // evaluations run the Triton interpreter, so a slow module makes every evaluation slow.
  double cpu_max_ms = 2000.0;
  int timing_runs = 5;             // forwards timed for the median (after one warm-up)
  uint64_t seed = 1234;            // seeds model construction and inputs: validation is reproducible
  bool use_cpu_sizes = true;       // apply the module's cpu_sizes on the CPU
  // Stage deadlines (seconds); past one the worker's process group is killed and the module rejected.
  double startup_s = 120;          // Python + torch import, up to the first message
  double load_s = 60;              // importing the module
  double check_s = 120;            // each of: build, determinism, outputs, inputs, apis
  double runtime_s = 120;          // the timed runs
  // Near-duplicates (kz/curriculum/dedup.h): a module whose normalised 5-gram shingles have a
  // Jaccard similarity >= this with a kept module's is a duplicate of it.
  double dedup_threshold = 0.8;
  WorkerOptions worker;            // interpreter, worker dir, scratch: as for evaluations
  TuningOptions tuning;            // fork servers, zygotes, the syntax check: as for evaluations
  // The Proposer's module is model-written code: it runs in the evaluations' sandbox (limits,
  // no network, read-only mounts, the audit hook; a refused operation rejects it as `sandbox`).
  SandboxOptions sandbox;

  Status validate() const;
};

struct ModuleVerdict {
  bool valid = false;
  std::string reason;                    // "valid", or "<check>: why" (the Proposer can act on it)
  // The check that failed: loads, runs, deterministic, outputs, uses_inputs, apis, runtime, sandbox, or
  // (the supervisor's) stage_timeout, worker_crashed, worker_protocol. Empty when valid.
  std::string failed_check;
  std::vector<std::string> aten_ops;     // sorted unique ATen ops forward executed
  std::vector<std::vector<int64_t>> output_shapes;
  std::string fingerprint;               // hash of the ATen op multiset + output shapes (dedup key); empty unless valid
  double runtime_ms = 0;                 // median forward time; 0 when not reached
};

// Validates `source` against the requested APIs. A bad module (syntax error, crash, hang, ...) is
// a verdict with valid = false; a non-ok Result means KernelZero could not run the worker.
Result<ModuleVerdict> validate_module(const std::string& source, const std::vector<ApiEntry>& apis,
                                      const ModuleValidationOptions& options);

}  // namespace kz
