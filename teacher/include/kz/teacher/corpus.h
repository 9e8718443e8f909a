// The kernel teacher's corpus: sampled modules, their references and candidates, written as JSONL
// plus a suite directory `kz eval-suite` reads, and checked by the evaluation engine.
//
// Layout of the output directory (docs/teacher.md; the JSONL format in docs/formats.md):
//   corpus.jsonl                          one module per line, with every candidate and its verdict
//   suite/level<L>/<id>.py                the references (`kz eval-suite --suite DIR/suite`)
//   candidates/<id>/<format>-<fusion>-<block>.py   (`--candidates DIR/candidates`)
//   check.jsonl                           with a check: the evaluator's verdicts, one per line
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"
#include "kz/eval/evaluator.h"
#include "kz/eval/suite.h"
#include "kz/teacher/grammar.h"
#include "kz/teacher/render.h"

namespace kz::teacher {

// Bumped whenever the same options would write a different corpus.
constexpr int kTeacherVersion = 1;

struct TeachOptions {
  std::filesystem::path out_dir;                              // required
  int count = 0;                                              // modules, >= 1
  uint64_t seed = 0;                                          // the sampler's seed
  Split split = Split::train;
  std::vector<Format> formats = {Format::triton, Format::cuda_rtc};  // each once, at least one
  int variants = 3;  // block-size variants per format and fusion, 1-3 (block_sizes' first ones)
  int scale = 1;     // reference sizes times this (>= 1), for GPU runs; cpu_sizes keeps the sampled ones
  Status validate() const;
};

struct TeacherCandidate {
  CandidateSpec spec;
  std::string source;
  std::filesystem::path file;             // relative to the output directory
  std::optional<std::string> verdict;     // the status name, once checked
  std::optional<double> speedup;          // where the check timed it (a GPU)
};

struct CorpusEntry {
  std::string id;                // "train-000042"
  Split split = Split::train;
  int index = 0;                 // in the sampler's sequence
  ModuleSpec module;
  std::string reference;
  std::filesystem::path reference_file;  // relative to the output directory
  std::vector<TeacherCandidate> candidates;
};

// The first `count` modules of the split's sequence for `seed`, with their references and
// candidates (every format, both fusions, `variants` block sizes).
std::vector<CorpusEntry> make_corpus(const TeachOptions& options);
// One module's entry, the `index`-th of options.split: what make_corpus makes of each module.
CorpusEntry make_entry(const ModuleSpec& module, int index, const TeachOptions& options);

// One corpus.jsonl line.
nlohmann::json corpus_json(const CorpusEntry& entry, const TeachOptions& options);

// Writes the references, the candidates and corpus.jsonl; suite/ and candidates/ are replaced and
// an earlier check.jsonl removed, so a smaller corpus leaves no stale files for kz eval-suite.
Status write_corpus(const TeachOptions& options, const std::vector<CorpusEntry>& corpus);

struct CheckReport {
  // "triton unfused" -> status name -> count.
  std::map<std::string, std::map<std::string, int>> counts;
  // Candidates whose verdict is neither ok nor compiled_not_run: "file: status: message".
  std::vector<std::string> failures;
  int candidates = 0;
  std::string render() const;  // a table of the counts, then the failures
  bool all_passed() const { return failures.empty(); }
};

// Evaluates every written candidate through the evaluation engine, as `kz eval-suite` would (the
// suite and candidates read back from the output directory), records each verdict and speedup in
// `corpus` and rewrites corpus.jsonl. On a CPU, cuda-rtc candidates are compiled only
// (compiled_not_run), which passes. An error only when the evaluator itself failed.
Result<CheckReport> check_corpus(const Evaluator& evaluator, const SuiteRunOptions& run_options,
                                 const TeachOptions& options, std::vector<CorpusEntry>& corpus,
                                 std::ostream& progress);

}  // namespace kz::teacher
