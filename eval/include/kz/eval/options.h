// Every setting of the evaluation protocol, with its default, and its TOML form.
//
// configs/eval.toml writes out every default below; `kz config show` prints the resolved values.
// A [section] key in TOML maps to the struct of the same name.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "kz/core/status.h"

namespace kz {

struct ToleranceOptions {
  double atol_fp32 = 1e-4;      // |out - ref| <= atol + rtol * |ref|, elementwise (KernelBench fp32)
  double rtol_fp32 = 1e-4;
  double norm_tol_fp32 = 1e-3;  // ||out - ref|| / ||ref||: catches zeros for near-zero references
  double atol_half = 1e-2;      // fp16 and bf16
  double rtol_half = 1e-2;
  double norm_tol_half = 2e-2;
};

struct TimingOptions {
  bool enabled = true;      // time on GPUs (never on the CPU)
  int warmup_runs = 3;      // untimed passes over all input sets, per model
  int runs = 100;           // timed runs per model, reference and candidate interleaved
  int input_sets = 4;       // rotating fresh input sets (defeats caching by pointer)
  int l2_flush_mb = 256;    // buffer written before each run; > the H200's 60 MB L2
};

struct StageTimeouts {
  double startup_s = 120;        // Python + torch import, up to the first message
  double load_reference_s = 120;
  double compile_s = 900;        // load_inline builds take ~1 min on a GPU host, more on 2 CPU cores
  double correctness_s = 300;    // all trials (the Triton interpreter is slow)
  double timing_s = 300;
  double recheck_s = 120;
};

struct WorkerOptions {
  std::string python;            // interpreter; empty: $KZ_PYTHON, else the build's default venv
  std::filesystem::path worker_dir;   // folder holding kz_worker/ and kz_rtc/; empty: the source tree's
  std::filesystem::path cache_dir;    // compile caches (torch extensions, Triton); empty: ~/.cache/kernelzero
  std::filesystem::path scratch_root; // per-evaluation scratch dirs; empty: $TMPDIR or /tmp
  bool keep_scratch = false;     // keep scratch dirs (debugging)
};

struct EvalOptions {
  std::string device = "cpu";    // "cpu" or "cuda:N"
  std::string format = "auto";   // auto | cuda | triton | cuda-rtc | torch
  int trials = 5;                // correctness trials, each on fresh random inputs
  uint64_t seed = 0;             // 0: a fresh secret seed per evaluation; else fixed (reproducible)
  bool use_cpu_sizes = true;     // apply a reference's `cpu_sizes` when the device is the CPU
  std::map<std::string, long long> size_overrides;  // module constant -> value, applied last
  int jobs = 0;                  // eval-suite workers at once; 0: CPU cores on cpu, 1 on a GPU
  ToleranceOptions tolerance;
  TimingOptions timing;
  StageTimeouts timeouts;
  WorkerOptions worker;

  Status validate() const;
};

// Overrides fields of `options` with the keys present in the TOML table; unknown keys and
// wrongly typed values are errors naming the key.
// `origin` names the text in error messages (a file path, "--config", ...).
Status apply_toml_text(std::string_view text, std::string_view origin, EvalOptions& options);
Status apply_toml_file(const std::filesystem::path& path, EvalOptions& options);
// The complete configuration as TOML text (what `kz config show` prints).
std::string to_toml(const EvalOptions& options);

}  // namespace kz
