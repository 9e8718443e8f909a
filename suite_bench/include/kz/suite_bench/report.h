// The summary (metrics as JSON, a terminal table) and the self-contained HTML report of a
// `kz bench` run: pass@k curve, speedup distribution and a per-task grid, as inline SVG.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kz/eval/verdict.h"
#include "kz/task/task.h"

namespace kz {

struct RunInfo {
  std::string model, suite, format, device, date;
  int samples = 0;
};

// summary.json: run info and bench_metrics.
nlohmann::json bench_summary(const RunInfo& info, const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts);
// The metrics of one set of verdicts: "overall", "levels": {"1": metrics, ...}, "pass_at_k", "fast_p"
// and, where any sample was timed against torch.compile, "vs_compile" ("overall", "levels"). `kz
// bench --also-policy P` puts the verdicts under policy P's in summary.json under "P".
nlohmann::json bench_metrics(const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts);
// One row per level plus "all": pass@1, pass@k, fast_1, geomean speedup, compile and cheat rates; "all"
// again over torch.compile (vs_compile) and under the other policy (--also-policy) where there are.
std::string render_bench_table(const nlohmann::json& summary);
std::string render_bench_html(const RunInfo& info, const nlohmann::json& summary, const std::vector<Task>& tasks,
                              const std::vector<Verdict>& verdicts);

}  // namespace kz
