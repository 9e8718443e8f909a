// `kz bench`: measuring a model on a suite. For every task, k samples are generated with the
// coder prompt of the chosen format, the code is extracted and each sample is evaluated; the
// result is pass@k, fast_p, speedups, compile and cheat rates, overall and per level, with a
// JSONL log, a summary.json and an HTML report.
//
// A run directory is resumable: generations and verdicts are appended as they arrive, and a
// rerun of the same command redoes neither a finished generation nor a finished evaluation.
//
// Run directory layout:
//   generations.jsonl      one line per sample: task, sample index, completion text, tokens
//   candidates/<task>/<i>.py   the code extracted from sample i (absent when none was found)
//   results.jsonl          one verdict per sample (eval's verdict JSON plus "sample", "level")
//   results.<policy>.jsonl the same under the other policy (--also-policy), where asked for
//   summary.json           metrics: pass_at_k (keyed by k), fast_p (keyed by p), per level; "policy"
//                          (the evaluator's), and the other policy's metrics under its name
//   report.html            self-contained report with SVG charts
//   requests/requests.jsonl  every HTTP request and response (the generator's log)
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/eval/evaluator.h"
#include "kz/llm/extract.h"
#include "kz/llm/generator.h"
#include "kz/task/task.h"

namespace kz {

struct BenchOptions {
  std::filesystem::path out_dir;       // the run directory (created; reused on resume)
  std::string suite_label;             // shown in the summary and report (the --suite argument)
  std::filesystem::path prompts_dir;   // holds coder_<format>.toml
  std::string format = "cuda-rtc";     // the kernel format asked for (cuda, triton, cuda-rtc)
  int samples = 1;                     // k: samples per task
  double temperature = 0.8;
  double top_p = 0.95;
  int max_tokens = 8192;
  uint64_t seed = 1234;                // generation seed base (per task: seed + task index)
  int generation_batch = 16;           // requests handed to the generator at once (then saved)
  // Every sample evaluated a second time under this policy (strict | kernelbench; empty: none), its
  // verdicts in results.<policy>.jsonl and its metrics in summary.json under its name.
  std::string also_policy;
  ExtractOptions extract;
  Status validate() const;
};

struct BenchResult {
  int tasks = 0;
  int samples_generated = 0;   // generated in this invocation (0 when everything was resumed)
  int samples_evaluated = 0;   // evaluated in this invocation
  std::vector<Verdict> verdicts;  // every sample's verdict, old and new
};

// The format_error verdict of a sample whose reply holds no code block (never evaluated):
// `label` names the sample, finish_reason "length" says the reply was cut at max_tokens.
Verdict no_code_verdict(const Task& task, const std::string& label, const std::string& finish_reason,
                        const std::string& format, const std::string& device);

// Generates, extracts, evaluates; then writes summary.json and report.html.
Result<BenchResult> run_bench(const std::vector<Task>& tasks, Generator& generator, const Evaluator& evaluator,
                              const BenchOptions& options, std::ostream& progress_out);

}  // namespace kz
