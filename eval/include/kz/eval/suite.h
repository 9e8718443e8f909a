// Evaluating a suite: pairing tasks with candidate files, running them (in parallel where the
// device allows), appending each verdict to results.jsonl as it arrives, and summarising.
#pragma once

#include <filesystem>
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

  double pass_rate() const { return candidates ? double(correct) / candidates : 0; }
  double compile_rate() const { return candidates ? double(compiled) / candidates : 0; }
  double fast_1() const { return candidates ? double(faster) / candidates : 0; }
};

SuiteSummary summarize(const std::vector<Verdict>& verdicts, int tasks);
std::string render_summary(const SuiteSummary& summary);
// One row per verdict: task, format, status, speedup, times, checks.
std::string render_verdict_table(const std::vector<Verdict>& verdicts);
nlohmann::json summary_json(const SuiteSummary& summary);

// Evaluations at once (per device) when the options say 0: every core on the CPU; on a GPU,
// [timing] gpu_jobs when timings hold the GPU exclusively (gpu_lock.py), else 1.
int default_jobs(const EvalOptions& options);

// "cuda:0,cuda:1" -> {"cuda:0", "cuda:1"}; "cuda:all" -> every GPU nvidia-smi lists.
Result<std::vector<std::string>> parse_devices(const std::string& devices);

struct SuiteRunOptions {
  int jobs = 1;                      // evaluations at once on each device
  int compile_jobs = 1;              // compile-only `cuda` pre-builds at once on a GPU (beside the evaluations)
  std::filesystem::path results_path;  // results.jsonl, appended one verdict per line
  std::vector<std::string> devices;  // one pool of `jobs` per device; empty: the evaluator's device
};

// Runs every entry; verdicts come back in entry order, and go to results.jsonl as they arrive.
// On a GPU the `cuda` candidates are pre-built (compile-only, `compile_jobs` at once) while the
// evaluations start with the other entries; each pre-built one is evaluated once its build is done,
// in the order the builds finish, its verdict carrying the build's seconds (prebuild_s). A build
// that fails (compile_error) is the entry's verdict. Infra failures (cannot start a worker, in
// either phase) abort with a Status after the verdicts already written are safely in results.jsonl.
Result<std::vector<Verdict>> run_suite(const Evaluator& evaluator, const std::vector<Task>& tasks,
                                       const std::vector<SuiteEntry>& entries, const SuiteRunOptions& options,
                                       std::ostream& progress_out);

}  // namespace kz
