// Evaluating a suite: pairing tasks with candidate files, running them (in parallel where the
// device allows), appending each verdict to results.jsonl as it arrives, and summarising.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/eval/evaluator.h"
#include "kz/eval/verdict.h"
#include "kz/task/task.h"

namespace kz {

struct SuiteEntry {
  size_t task_index;    // into the task list
  Candidate candidate;
};

// Candidates for the tasks from DIR: `<task-id>.py`, or several files under `<task-id>/`.
// Files naming no known task are an error (a typo would silently skip a task otherwise).
Result<std::vector<SuiteEntry>> discover_candidates(const std::vector<Task>& tasks, const std::filesystem::path& dir);

struct SuiteSummary {
  int tasks = 0;                // tasks in the suite
  int tasks_with_candidates = 0;
  int candidates = 0;
  int compiled = 0;             // compiled (includes compiled_not_run)
  int correct = 0;
  int timed = 0;                // correct and timed (GPU)
  int faster = 0;               // correct with speedup > 1 (fast_1's numerator)
  double geomean_speedup = 0;   // over correct, timed candidates; 0 when none
  std::vector<std::pair<std::string, int>> status_counts;  // status name -> count, non-zero only
  int unchecked = 0;            // verdicts where a check could not run (Verdict::unchecked)
  // Verdicts whose task needs more GPU memory than the card gives one evaluation (infra_error,
  // check exceeds_gpu_memory): the candidate could not run, so the rates leave them out.
  int exceeds_gpu_memory = 0;
  int retried_alone = 0;        // run again alone on the GPU after an out_of_memory_shared (Verdict::retried_alone)

  // The candidates the rates are over: every one that could run on this card.
  int rated() const { return candidates - exceeds_gpu_memory; }
  double pass_rate() const { return rated() ? double(correct) / rated() : 0; }
  double compile_rate() const { return rated() ? double(compiled) / rated() : 0; }
  double fast_1() const { return rated() ? double(faster) / rated() : 0; }
};

SuiteSummary summarize(const std::vector<Verdict>& verdicts, int tasks);
std::string render_summary(const SuiteSummary& summary);
// One row per verdict: task, format, status, speedup, times, checks.
std::string render_verdict_table(const std::vector<Verdict>& verdicts);
nlohmann::json summary_json(const SuiteSummary& summary);

// "cuda:0,cuda:1" -> {"cuda:0", "cuda:1"}; "cuda:all" -> every GPU nvidia-smi lists.
Result<std::vector<std::string>> parse_devices(const std::string& devices);

// One Evaluator per device, and the device with the fewest evaluations in flight for the next one:
// with `jobs` threads per device in all, no device ever runs more than `jobs` at once. Used by
// run_suite and the evaluation service. Thread-safe.
class DevicePools {
 public:
  // One pool per device (base's own device where `devices` is empty), sharing base's verdict cache.
  static Result<DevicePools> create(const Evaluator& base, const std::vector<std::string>& devices);
  size_t size() const { return evaluators_.size(); }
  const Evaluator& at(size_t pool) const { return evaluators_[pool]; }

  // The pool with the fewest evaluations in flight, for one evaluation: counted in flight until the
  // lease ends.
  class Lease {
   public:
    explicit Lease(DevicePools& pools) : pools_(&pools), pool_(pools.acquire()) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { pools_->release(pool_); }
    size_t pool() const { return pool_; }

   private:
    DevicePools* pools_;
    size_t pool_;
  };

 private:
  size_t acquire();
  void release(size_t pool);

  std::vector<Evaluator> evaluators_;
  std::vector<int> in_flight_;
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
};

struct SuiteRunOptions {
  int jobs = 1;                      // evaluations at once on each device
  int compile_jobs = 1;              // compile-only `cuda` pre-builds at once on a GPU (beside the evaluations)
  std::filesystem::path results_path;  // results.jsonl, appended one verdict per line
  std::vector<std::string> devices;  // one pool of `jobs` per device; empty: the evaluator's device
};

// Runs every entry; verdicts come back in entry order, and go to results.jsonl as they arrive.
// On a GPU the `cuda` candidates are pre-built (compile-only, `compile_jobs` at once) while the
// evaluations start with the other entries; each pre-built one is evaluated once its build is done,
// in the order the builds finish, its verdict's profile carrying the build's seconds (prebuild_s). A build
// that fails (compile_error) is the entry's verdict. Infra failures (cannot start a worker, in
// either phase) abort with a Status after the verdicts already written are safely in results.jsonl.
Result<std::vector<Verdict>> run_suite(const Evaluator& evaluator, const std::vector<Task>& tasks,
                                       const std::vector<SuiteEntry>& entries, const SuiteRunOptions& options,
                                       std::ostream& progress_out);

}  // namespace kz
