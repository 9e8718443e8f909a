// The evaluation engine's supervisor: evaluates one candidate against one reference task in a
// fresh worker process and turns every outcome into a Verdict.
//
// The worker (worker/kz_worker, Python) runs the protocol: same init and weights, N trials on
// fresh inputs, exact output checks, GPU timing interleaved with the reference. The supervisor
// owns what the worker cannot be trusted with: stage deadlines (it kills the worker's process
// group), crashes and CUDA faults (the process dies, the verdict says how), and the final word on
// statuses. Nothing a candidate does can outlive its worker or affect the next evaluation.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kz/core/status.h"
#include "kz/eval/cache.h"
#include "kz/eval/format.h"
#include "kz/eval/options.h"
#include "kz/eval/syntax_check.h"
#include "kz/eval/verdict.h"
#include "kz/eval/worker_client.h"
#include "kz/task/task.h"

namespace kz {

struct Candidate {
  std::string label;   // shown in verdicts and tables: usually the file path
  std::string source;  // the Python module text defining ModelNew
};

// A request to compile only (no correctness, no timing): used to pre-build `cuda` candidates in
// parallel before the GPU evaluations, so the slow load_inline builds overlap.
enum class EvalMode { full, compile_only };

// Copies share one verdict cache connection and one syntax checker; evaluate() may run on several
// threads at once.
class Evaluator {
 public:
  // Fails when the options are invalid, the worker cannot be found, or the verdict cache (when
  // enabled) cannot be opened.
  static Result<Evaluator> create(EvalOptions options);

  // Always yields a verdict for the candidate (compile errors, crashes, timeouts included);
  // a non-ok Result means KernelZero itself could not run (e.g. spawning Python failed).
  // With the cache enabled, a full evaluation seen before returns the stored verdict (cached =
  // true) without a worker, and a new cacheable verdict is stored; compile_only never touches it.
  // A full evaluation that ran out of GPU memory while other evaluations held some
  // (out_of_memory_shared) runs once more with the GPU's memory to itself: that verdict is the
  // result, with retried_alone and both runs' wall_s in its profile.
  Result<Verdict> evaluate(const Task& task, const Candidate& candidate, EvalMode mode = EvalMode::full) const;

  // Whether evaluate(task, candidate) would be a cache hit (false with the cache off): no point in
  // pre-building such a candidate.
  bool has_cached_verdict(const Task& task, const Candidate& candidate) const;

  const EvalOptions& options() const { return options_; }
  // A copy that evaluates in `format` (auto | cuda | triton | cuda-rtc | torch), sharing the cache.
  Result<Evaluator> with_format(const std::string& format) const;
  // A copy that judges under policy `mode` ([policy] mode: strict | kernelbench), sharing the cache.
  Result<Evaluator> with_policy(const std::string& mode) const;
  // Starts `count` fork servers ahead of the first requests of `mode` ([tuning] fork_server; nothing
  // where it is off), so that a batch's first wave finds them prepared: evaluation servers, or build
  // servers for the `cuda` pre-builds (compile_only).
  Status start_fork_servers(int count, EvalMode mode = EvalMode::full) const;
  // A copy that evaluates on `device` (another GPU of the same model), sharing the cache.
  Result<Evaluator> with_device(const std::string& device) const;

  // The verdict cache; null when disabled.
  const VerdictCache* cache() const { return cache_.get(); }

 private:
  Evaluator(EvalOptions options, WorkerSetup setup);
  Status open_cache();
  std::string cache_key(const Task& task, const Candidate& candidate, Format format) const;
  // Names a `cuda` candidate's kept extension builds: its bytes and what its build depends on.
  std::string extension_build_key(const Candidate& candidate) const;
  // Keeps the kept builds within [worker] kept_builds_max_mb (prune_kept_builds), now and then.
  void prune_now_and_then() const;
  // One worker run. `gpu_alone`: it reserves every memory slot of its GPU (request "gpu_alone"), the
  // run again after an out_of_memory_shared.
  Result<Verdict> run_worker(const Task& task, const Candidate& candidate, Format format, uint64_t seed,
                             EvalMode mode, bool gpu_alone) const;
  WorkerSetup worker_setup(EvalMode mode) const;
  // Environment and sandbox of this evaluator's workers for `mode`: compile-only requests (the `cuda`
  // pre-builds) run on fork servers of their own kind (KZ_WORKER_ROLE=build), which skip what only
  // running a candidate needs, and never take a server prepared for an evaluation.
  void customize_worker(ProcessSpec& spec, EvalMode mode) const;
  EvalOptions options_;
  WorkerSetup setup_;  // resolved once (interpreter, worker code, caches); worker_setup() adapts it
  std::shared_ptr<VerdictCache> cache_;  // shared by copies; thread-safe
  std::shared_ptr<SyntaxChecker> syntax_checker_;  // shared by copies; null with [tuning] syntax_check off
  std::string code_version_;             // worker code, interpreter, supervisor build: for cache keys
  std::string gpu_name_;                 // GPU model(s), for cache keys on a GPU
};

// The format to evaluate a candidate in: the requested one, or the detected one for "auto".
// nullopt: auto-detection found no known format (a format_error verdict).
std::optional<Format> resolve_format(const std::string& requested, const std::string& source);

}  // namespace kz
