// bench summaries: metrics JSON, the terminal table, and the HTML report with inline SVG charts.
#include "kz/suite_bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kz/core/svg_chart.h"
#include "kz/core/terminal.h"
#include "kz/core/text.h"
#include "kz/rl/metrics.h"

namespace kz {
namespace {

// Sample index from a "task/i" candidate label (bench labels its samples that way).
int sample_of(const Verdict& v) {
  auto slash = v.candidate.rfind('/');
  if (slash == std::string::npos) return 0;
  try {
    return std::stoi(v.candidate.substr(slash + 1));
  } catch (const std::exception&) {
    return 0;
  }
}

// A sample whose task needs more GPU memory than the card gives one evaluation (infra_error,
// exceeds_gpu_memory): it never ran, so it is no failure of the model's. Other infra_errors count as
// failures, as before.
bool exceeds_gpu_memory(const Verdict& v) { return v.has_check(Check::exceeds_gpu_memory); }

// Per task, its samples' outcomes, those that exceeded the GPU's memory left out: a task whose every
// sample did is in no denominator of pass@k or fast_p. A task without any verdict (its generation
// failed, the run was cut short) stays in, with no samples: it scores 0, as in KernelBench.
std::vector<TaskOutcomes> outcomes_by_task(const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts) {
  std::map<std::string, TaskOutcomes> by_task;
  std::set<std::string> too_big;  // tasks with a sample that exceeded the GPU's memory
  for (const auto& task : tasks) by_task[task.id] = TaskOutcomes{task.id, task.level, {}};
  for (const auto& v : verdicts) {
    auto it = by_task.find(v.task_id);
    if (it == by_task.end()) continue;
    if (exceeds_gpu_memory(v)) {
      too_big.insert(v.task_id);
      continue;
    }
    it->second.samples.push_back(
        SampleOutcome{v.correct, v.speedup, v.compiled, v.status == EvalStatus::cheat_detected});
  }
  std::vector<TaskOutcomes> result;
  for (auto& [id, outcomes] : by_task)
    if (!outcomes.samples.empty() || !too_big.count(id)) result.push_back(std::move(outcomes));
  return result;
}

std::string percent(const nlohmann::json& value) {
  return value.is_number() ? fmt::format("{:.1f}%", 100 * value.get<double>()) : "n/a";
}

const char* status_color(EvalStatus s) {
  switch (s) {
    case EvalStatus::ok: return "#2e9e44";
    case EvalStatus::compiled_not_run: return "#4a7fd6";
    case EvalStatus::incorrect: return "#f0a030";
    case EvalStatus::compile_error: return "#d64545";
    case EvalStatus::runtime_error: return "#9b4fc2";
    case EvalStatus::timeout: return "#5a3a1a";
    case EvalStatus::format_error: return "#9a9a9a";
    case EvalStatus::cheat_detected: return "#000000";
    default: return "#c0c0c0";
  }
}

// pass@k against k, one polyline per group (all, level 1, ...).
std::string pass_at_k_svg(const nlohmann::json& summary) {
  std::vector<std::pair<std::string, nlohmann::json>> series = {{"all", summary["overall"]["pass_at_k"]}};
  for (const auto& [level, metrics] : summary["levels"].items()) series.emplace_back("level " + level, metrics["pass_at_k"]);
  int max_k = 1;
  for (const auto& [name, curve] : series)
    for (const auto& [k, v] : curve.items()) max_k = std::max(max_k, std::stoi(k));
  const ChartFrame frame{520, 300, 50, 120, 20, 40, 1.0, double(max_k), 0.0, 1.0};
  std::vector<std::pair<double, std::string>> ticks;
  for (int k = 1; k <= max_k; ++k) ticks.emplace_back(k, std::to_string(k));
  std::string svg = chart_open_svg(frame) +
                    chart_axes_svg(frame, [](double p) { return fmt::format("{:.0f}%", 100 * p); }, ticks, "k");
  const char* colors[] = {"#222", "#2e7dd6", "#e0662b", "#2e9e44", "#9b4fc2"};
  int index = 0;
  for (const auto& [name, curve] : series) {
    std::vector<ChartPoint> points;
    for (const auto& [k, v] : curve.items())
      points.push_back({double(std::stoi(k)), v.get<double>(), fmt::format("{} pass@{} = {:.3f}", name, k, v.get<double>())});
    svg += chart_series_svg(frame, points, colors[index % 5]);
    svg += chart_legend_svg(frame, index, name, colors[index % 5]);
    ++index;
  }
  return svg + "</svg>";
}

// Histogram of log2(speedup) over correct, timed samples: bins of 0.25 from 1/8x to 8x.
std::string speedup_svg(const std::vector<Verdict>& verdicts) {
  std::vector<double> logs;
  for (const auto& v : verdicts)
    if (v.correct && v.speedup && *v.speedup > 0) logs.push_back(std::clamp(std::log2(*v.speedup), -3.0, 2.999));
  if (logs.empty()) return "<p><em>No timed samples (a CPU run, or nothing correct): no speedup distribution.</em></p>";
  const int bins = 24, w = 520, h = 240, left = 40, bottom = 36, top = 10;
  std::vector<int> counts(bins, 0);
  for (double l : logs) counts[static_cast<int>((l + 3) / 0.25)]++;
  int peak = *std::max_element(counts.begin(), counts.end());
  double bar_w = double(w - left - 10) / bins;
  std::string svg = fmt::format(R"(<svg width="{}" height="{}" xmlns="http://www.w3.org/2000/svg" font-size="12">)", w, h);
  for (int b = 0; b < bins; ++b) {
    double bh = peak ? double(counts[b]) / peak * (h - top - bottom) : 0;
    double lo = std::pow(2.0, -3 + 0.25 * b);
    svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"><title>{:.2f}x-{:.2f}x: {}</title></rect>)",
                       left + b * bar_w, h - bottom - bh, bar_w - 1, bh, lo >= 1 ? "#2e9e44" : "#f0a030", lo,
                       lo * std::pow(2.0, 0.25), counts[b]);
  }
  for (int e = -3; e <= 3; ++e)
    svg += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{}x</text>)", left + (e + 3) * 4 * bar_w,
                       h - bottom + 16, e >= 0 ? fmt::format("{}", 1 << e) : fmt::format("1/{}", 1 << -e));
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">speedup over the reference (log scale)</text>)",
                     w / 2, h - 4);
  return svg + "</svg>";
}

// Tasks down, samples across; each cell coloured by status.
std::string task_grid_svg(const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts, int samples) {
  std::map<std::string, std::map<int, const Verdict*>> cells;
  for (const auto& v : verdicts) cells[v.task_id][sample_of(v)] = &v;
  const int cell = 16, label_w = 200, row_h = 18;
  int w = label_w + std::max(samples, 1) * cell + 20, h = static_cast<int>(tasks.size()) * row_h + 10;
  std::string svg = fmt::format(R"(<svg width="{}" height="{}" xmlns="http://www.w3.org/2000/svg" font-size="12">)", w, h);
  for (size_t t = 0; t < tasks.size(); ++t) {
    int y = static_cast<int>(t) * row_h + 4;
    svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="end">{}</text>)", label_w - 6, y + 12,
                       html_escape(tasks[t].id));
    for (int s = 0; s < samples; ++s) {
      const Verdict* v = cells[tasks[t].id].count(s) ? cells[tasks[t].id][s] : nullptr;
      std::string tip = v ? fmt::format("{} #{}: {}{}", tasks[t].id, s, status_name(v->status),
                                        v->speedup ? fmt::format(" {:.2f}x", *v->speedup) : "")
                          : "not evaluated";
      svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>)",
                         label_w + s * cell, y, cell - 2, row_h - 4, v ? status_color(v->status) : "#eee",
                         html_escape(tip));
    }
  }
  return svg + "</svg>";
}

std::string legend() {
  std::string html = "<p>";
  for (auto s : {EvalStatus::ok, EvalStatus::compiled_not_run, EvalStatus::incorrect, EvalStatus::compile_error,
                 EvalStatus::runtime_error, EvalStatus::timeout, EvalStatus::format_error, EvalStatus::cheat_detected})
    html += fmt::format(R"(<span style="display:inline-block;width:12px;height:12px;background:{}"></span> {} &nbsp; )",
                        status_color(s), status_name(s));
  return html + "</p>";
}

// The metrics over every level and per level, keyed as summary.json keeps them.
nlohmann::json metrics_json(const std::vector<TaskOutcomes>& outcomes) {
  nlohmann::json levels = nlohmann::json::object();
  for (const auto& [level, metrics] : metrics_by_level(outcomes)) levels[std::to_string(level)] = to_json(metrics);
  return {{"overall", to_json(compute_metrics(outcomes))}, {"levels", levels}};
}

// [timing] baseline = "compile": the same metrics with each sample's speedup over torch.compile of the
// reference as its speedup (fast_p, geomean_speedup); null where no sample has one.
nlohmann::json metrics_over_compile(const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts) {
  if (std::none_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) { return v.compile_speedup.has_value(); }))
    return nullptr;
  std::vector<Verdict> over_compile = verdicts;
  for (auto& v : over_compile) v.speedup = v.compile_speedup;
  return metrics_json(outcomes_by_task(tasks, over_compile));
}

}  // namespace

nlohmann::json bench_metrics(const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts) {
  nlohmann::json metrics = metrics_json(outcomes_by_task(tasks, verdicts));
  metrics["pass_at_k"] = metrics["overall"]["pass_at_k"];
  metrics["fast_p"] = metrics["overall"]["fast_p"];
  if (auto over_compile = metrics_over_compile(tasks, verdicts); !over_compile.is_null())
    metrics["vs_compile"] = over_compile;
  return metrics;
}

nlohmann::json bench_summary(const RunInfo& info, const std::vector<Task>& tasks, const std::vector<Verdict>& verdicts) {
  nlohmann::json summary = {{"model", info.model},   {"suite", info.suite},   {"format", info.format},
                            {"device", info.device}, {"date", info.date},     {"samples_per_task", info.samples},
                            {"tasks", tasks.size()}, {"evaluated_samples", verdicts.size()}};
  summary.update(bench_metrics(tasks, verdicts));
  summary["exceeds_gpu_memory"] = std::count_if(verdicts.begin(), verdicts.end(), exceeds_gpu_memory);
  std::set<std::string> judged;
  for (const auto& v : verdicts) judged.insert(v.task_id);
  summary["tasks_without_samples"] = std::count_if(tasks.begin(), tasks.end(),
                                                   [&](const Task& t) { return !judged.count(t.id); });
  return summary;
}

bool known_fast_1(const nlohmann::json& metrics) {
  return metrics["geomean_speedup"].is_number() || metrics["pass_at_k"].value("1", nlohmann::json(1.0)) == 0.0;
}

std::string render_bench_table(const nlohmann::json& summary) {
  Table table({"level", "tasks", "samples", "pass@1", "pass@k", "fast_1", "geomean speedup", "compile", "cheat"});
  auto row = [&](const std::string& name, const nlohmann::json& m) {
    const auto& pass = m["pass_at_k"];
    std::string last_k = pass.empty() ? "" : std::prev(pass.end()).key();
    table.add_row({name, m.value("tasks", nlohmann::json(0)).dump(), m.value("samples", nlohmann::json(0)).dump(),
                   percent(pass.value("1", nlohmann::json())),
                   last_k.empty() ? "n/a" : fmt::format("{} (k={})", percent(pass[last_k]), last_k),
                   // fast_1 needs timings (on a CPU run every correct sample is untimed), unless nothing
                   // was correct: then it is 0 however the run was timed.
                   known_fast_1(m) ? percent(m["fast_p"].value("1", nlohmann::json())) : "n/a",
                   m["geomean_speedup"].is_number() ? fmt::format("{:.3f}x", m["geomean_speedup"].get<double>()) : "n/a",
                   percent(m["compile_rate"]), percent(m["cheat_rate"])});
  };
  for (const auto& [level, metrics] : summary["levels"].items()) row(level, metrics);
  row("all", summary["overall"]);
  if (summary.contains("vs_compile")) row("all, over torch.compile", summary["vs_compile"]["overall"]);
  for (const char* policy : {"strict", "kernelbench"})
    if (summary.contains(policy)) row(fmt::format("all, policy {}", policy), summary[policy]["overall"]);
  std::string notes;
  // Both absent from summaries written before them.
  if (int too_big = summary.value("exceeds_gpu_memory", 0))
    notes += fmt::format("{} sample(s) of tasks that need more GPU memory than the card has: left out of pass@k "
                         "and fast_p\n", too_big);
  if (int unsampled = summary.value("tasks_without_samples", 0))
    notes += fmt::format("{} task(s) without any sample (generation failed or the run was cut short): scored 0; "
                         "run kz bench again to fill them\n", unsampled);
  return table.render() + notes;
}

std::string render_bench_html(const RunInfo& info, const nlohmann::json& summary, const std::vector<Task>& tasks,
                              const std::vector<Verdict>& verdicts) {
  std::string html = R"(<!doctype html><html><head><meta charset="utf-8"><title>KernelZero bench</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}h2{margin-top:1.6em}
pre{background:#f7f7f7;padding:8px}</style></head><body>)";
  html += fmt::format("<h1>KernelZero bench: {}</h1>", html_escape(info.model));
  html += fmt::format("<p>suite <b>{}</b>, format <b>{}</b>, device <b>{}</b>, {} samples per task, {}</p>",
                      html_escape(info.suite), html_escape(info.format), html_escape(info.device), info.samples,
                      html_escape(info.date));
  html += "<h2>Summary</h2><pre>" + html_escape(render_bench_table(summary)) + "</pre>";
  html += "<h2>pass@k</h2>" + pass_at_k_svg(summary);
  html += "<h2>Speedup distribution (correct samples)</h2>" + speedup_svg(verdicts);
  html += "<h2>Per task</h2>" + legend() + task_grid_svg(tasks, verdicts, info.samples);
  html += "<h2>summary.json</h2><pre>" + html_escape(summary.dump(2)) + "</pre>";
  return html + "</body></html>\n";
}

}  // namespace kz
