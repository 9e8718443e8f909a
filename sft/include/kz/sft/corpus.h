// The teacher's corpus as supervised training reads it: JSONL, one module per line (`kz teach`
// writes it; docs/sft.md):
//
//   {"id": "train-000042", "split": "train" | "heldout", "level": 1,
//    "apis": ["torch.relu", "torch.add"], "ops": "relu(add(x, y))",
//    "reference": "<KernelBench module: class Model, get_inputs, get_init_inputs>",
//    "candidates": [{"format": "triton", "fusion": "unfused" | "fused", "block_size": 256,
//                    "source": "<ModelNew module>", "verdict": "ok" | other | null,
//                    "speedup": 1.3 | null}, ...],
//    "provenance": {...}}
//
// Required: id, split, level, apis, reference, candidates, and in each candidate format, fusion,
// source and verdict (null when the corpus was not checked). ops, block_size, speedup and
// provenance are optional here (training does not use them). Every error names file:line and
// the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::sft {

struct CorpusCandidate {
  std::string format;                  // "triton", "cuda-rtc", ...
  std::string fusion;                  // "unfused" or "fused"
  int64_t block_size = 0;              // 0 when absent
  std::string source;                  // the ModelNew module
  std::optional<std::string> verdict;  // nullopt: not checked
  std::optional<double> speedup;
};

struct CorpusModule {
  std::string id;
  std::string split;  // "train" or "heldout"
  int level = 1;
  std::vector<std::string> apis;  // the Proposer's input, in the corpus's order
  std::string ops;
  std::string reference;
  std::vector<CorpusCandidate> candidates;
};

// Every module of the JSONL file at `path` (blank lines skipped). invalid_argument
// "FILE:LINE: ..." for a line that is not a JSON object, a missing or mistyped field, an unknown
// split or fusion, or an id seen on an earlier line.
Result<std::vector<CorpusModule>> load_corpus(const fs::path& path);

// The same for several files, in order (ids unique across them).
Result<std::vector<CorpusModule>> load_corpora(const std::vector<fs::path>& paths);

}  // namespace kz::sft
