// `kz report RUN_DIR`: the HTML page of a `kz evolve` run, self-contained (inline SVG and CSS, no
// script or network), from its metrics.jsonl (and run.json where present).
//
// metrics.jsonl has one row per phase per iteration:
//   {"iteration": 3, "phase": "proposer" | "coder" | "heldout", "reward_mean", "correct_rate",
//    "gate_on_share", "frontier_size", "kl", "entropy", "clip_fraction", "loss", "grad_norm",
//    "samples", "dropped", "zero_variance_groups", "seconds": {"generate", "evaluate", "train"},
//    ... heldout rows: "pass_at_1", "fast_1", "geomean_speedup" (null when not timed)}
// Any field may be absent or null in a row (a phase that did not train has no kl): curves skip it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::loop {

// The page: a header (run.json's config summary), curves against the iteration (Coder and
// Proposer reward_mean and correct_rate; held-out pass@1 and fast_1; gate_on_share and
// frontier_size; kl, entropy and clip_fraction), stacked seconds per iteration by stage, and the
// table of every row.
std::string render_evolve_report(const nlohmann::json& run_info, const std::vector<nlohmann::json>& metrics);

// Reads RUN_DIR/metrics.jsonl (and run.json, optional) and writes RUN_DIR/report.html; returns
// its path. not_found when the run dir has no metrics.jsonl.
Result<fs::path> write_evolve_report(const fs::path& run_dir);

}  // namespace kz::loop
