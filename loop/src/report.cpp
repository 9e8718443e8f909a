// The `kz report` page of a `kz evolve` run: curves against the iteration as inline SVG, in the
// look of the `kz bench` report, then every metrics row as a table.
#include "kz/loop/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "kz/core/jsonl.h"
#include "kz/core/svg_chart.h"
#include "kz/core/text.h"

namespace kz::loop {
namespace {

using nlohmann::json;

// ---- reading rows ----

// The member `key` of `object`, or nullptr when it is absent or null (or `object` is no object).
const json* member(const json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// row[key] as a finite number; nullopt when absent, null or not a number: a curve skips the point.
std::optional<double> number_at(const json& row, const std::string& key) {
  const json* value = member(row, key);
  if (!value || !value->is_number()) return std::nullopt;
  double number = value->get<double>();
  return std::isfinite(number) ? std::optional<double>(number) : std::nullopt;
}

std::string phase_of(const json& row) {
  const json* phase = member(row, "phase");
  return phase && phase->is_string() ? phase->get<std::string>() : "";
}

// A value as the page shows it. Strings a caller built may hold bytes that are not UTF-8: replaced
// rather than thrown on.
std::string text_of(const json& value) {
  if (value.is_string()) return to_valid_utf8(value.get_ref<const std::string&>());
  if (value.is_number_float()) return fmt::format("{:.4g}", value.get<double>());
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Leaves of `value` by their path ("seconds/generate"), so nested objects fit one table row.
std::map<std::string, json> leaves_of(const json& value) {
  std::map<std::string, json> leaves;
  if (!value.is_object()) return leaves;
  json flat = value.flatten();
  for (const auto& [pointer, leaf] : flat.items()) leaves[pointer.substr(1)] = leaf;
  return leaves;
}

// ---- curves ----

struct Range {
  double lo = 0, hi = 1;
};

struct Point {
  double iteration, value;
};

struct Series {
  std::string label;  // "coder reward_mean"
  std::vector<Point> points;
};

// One series per phase that logged `key` as a number, in the order the phases first show it.
std::vector<Series> series_of(const std::vector<json>& rows, const std::string& key) {
  std::vector<Series> series;
  for (const auto& row : rows) {
    auto iteration = number_at(row, "iteration");
    auto value = number_at(row, key);
    if (!iteration || !value) continue;
    std::string phase = phase_of(row);
    std::string label = phase.empty() ? key : phase + " " + key;
    auto it = std::find_if(series.begin(), series.end(), [&](const Series& s) { return s.label == label; });
    if (it == series.end()) it = series.insert(series.end(), Series{label, {}});
    it->points.push_back({*iteration, *value});
  }
  for (auto& s : series)
    std::stable_sort(s.points.begin(), s.points.end(),
                     [](const Point& a, const Point& b) { return a.iteration < b.iteration; });
  return series;
}

// Every chart spans the same iterations, so they line up one above the other.
Range iteration_range(const std::vector<json>& rows) {
  std::optional<Range> range;
  for (const auto& row : rows) {
    auto iteration = number_at(row, "iteration");
    if (!iteration) continue;
    if (!range) range = Range{*iteration, *iteration};
    range->lo = std::min(range->lo, *iteration);
    range->hi = std::max(range->hi, *iteration);
  }
  return range.value_or(Range{0, 0});
}

// Rates on 0..100%; anything else from its smallest to its largest value, widened when flat so a
// constant curve sits inside the chart rather than on its edge.
Range value_range(const std::vector<Series>& series, bool rate) {
  if (rate) return {0, 1};
  std::optional<Range> range;
  for (const auto& s : series)
    for (const auto& p : s.points) {
      if (!range) range = Range{p.value, p.value};
      range->lo = std::min(range->lo, p.value);
      range->hi = std::max(range->hi, p.value);
    }
  Range r = range.value_or(Range{0, 1});
  if (r.hi > r.lo) return r;
  double pad = r.lo == 0 ? 1 : std::abs(r.lo) / 2;
  return {r.lo - pad, r.hi + pad};
}

// One chart's plot area, (iteration, value) mapped onto pixels; the right margin holds the legend.
ChartFrame frame(Range iterations, Range values) {
  return ChartFrame{560, 250, 56, 180, 14, 40, iterations.lo, iterations.hi, values.lo, values.hi};
}

// Horizontal grid lines with their values, and the iterations under the plot (at most ~8 labels).
std::string axes_svg(const ChartFrame& f, bool rate) {
  std::vector<std::pair<double, std::string>> ticks;
  double step = std::max(1.0, std::ceil((f.x_hi - f.x_lo) / 8));
  for (double i = std::ceil(f.x_lo); i <= f.x_hi; i += step) ticks.emplace_back(i, fmt::format("{:g}", i));
  auto label = [rate](double value) {
    return rate ? fmt::format("{:.0f}%", 100 * value) : fmt::format("{:.4g}", value);
  };
  return chart_axes_svg(f, label, ticks, "iteration");
}

const char* series_color(size_t index) {
  static const char* colors[] = {"#2e7dd6", "#e0662b", "#2e9e44", "#9b4fc2", "#222", "#c2417a"};
  return colors[index % (sizeof(colors) / sizeof(colors[0]))];
}

// A polyline with a dot (its value on hover) per point.
std::string series_svg(const ChartFrame& f, const Series& s, const char* color, bool rate) {
  std::vector<ChartPoint> points;
  for (const auto& p : s.points) {
    std::string value = rate ? fmt::format("{:.1f}%", 100 * p.value) : fmt::format("{:.4g}", p.value);
    points.push_back({p.iteration, p.value, fmt::format("{}, iteration {:g}: {}", s.label, p.iteration, value)});
  }
  return chart_series_svg(f, points, color);
}

// "a, b, c": the fields a chart with nothing to draw names.
std::string join(const std::vector<std::string>& keys) {
  std::string text;
  for (const auto& key : keys) text += (text.empty() ? "" : ", ") + key;
  return text;
}

// The curves of `keys` (one per phase that logged each) against the iteration.
std::string line_chart(const std::vector<json>& rows, const std::vector<std::string>& keys, bool rate) {
  std::vector<Series> series;
  for (const auto& key : keys)
    for (auto& s : series_of(rows, key)) series.push_back(std::move(s));
  if (series.empty()) return "<p><em>No " + join(keys) + " logged yet.</em></p>";
  ChartFrame f = frame(iteration_range(rows), value_range(series, rate));
  std::string svg = chart_open_svg(f) + axes_svg(f, rate);
  for (size_t i = 0; i < series.size(); ++i) {
    svg += series_svg(f, series[i], series_color(i), rate);
    svg += chart_legend_svg(f, static_cast<int>(i), series[i].label, series_color(i));
  }
  return svg + "</svg>";
}

// ---- seconds per stage ----

constexpr std::array<const char*, 3> kStages = {"generate", "evaluate", "train"};
constexpr std::array<const char*, 3> kStageColors = {"#2e7dd6", "#f0a030", "#2e9e44"};

using StageSeconds = std::array<double, kStages.size()>;

// Per iteration, each stage's seconds summed over the iteration's phases.
std::map<double, StageSeconds> seconds_by_iteration(const std::vector<json>& rows) {
  std::map<double, StageSeconds> totals;
  for (const auto& row : rows) {
    auto iteration = number_at(row, "iteration");
    const json* seconds = member(row, "seconds");
    if (!iteration || !seconds) continue;
    for (size_t s = 0; s < kStages.size(); ++s)
      if (auto value = number_at(*seconds, kStages[s])) totals[*iteration][s] += *value;
  }
  return totals;
}

std::string stage_bar_svg(const ChartFrame& f, double iteration, const StageSeconds& seconds, double bar_w) {
  std::string svg;
  double base = 0;
  for (size_t s = 0; s < kStages.size(); ++s) {
    if (seconds[s] <= 0) continue;
    svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}">)"
                       "<title>iteration {:g} {}: {:.1f} s</title></rect>",
                       f.x(iteration) - bar_w / 2, f.y(base + seconds[s]), bar_w, f.y(base) - f.y(base + seconds[s]),
                       kStageColors[s], iteration, kStages[s], seconds[s]);
    base += seconds[s];
  }
  return svg;
}

// Stacked bars: where each iteration's time went.
std::string seconds_chart(const std::vector<json>& rows) {
  auto totals = seconds_by_iteration(rows);
  double peak = 0;
  for (const auto& [iteration, seconds] : totals) peak = std::max(peak, seconds[0] + seconds[1] + seconds[2]);
  if (peak <= 0) return "<p><em>No seconds logged yet.</em></p>";
  // Half an iteration of room either side, so the first and last bars stay inside the plot.
  Range iterations = iteration_range(rows);
  ChartFrame f = frame({iterations.lo - 0.5, iterations.hi + 0.5}, {0, peak});
  double bar_w = std::min(40.0, 0.7 * (f.x(1) - f.x(0)));
  std::string svg = chart_open_svg(f) + axes_svg(f, false);
  for (const auto& [iteration, seconds] : totals) svg += stage_bar_svg(f, iteration, seconds, bar_w);
  for (size_t s = 0; s < kStages.size(); ++s) svg += chart_legend_svg(f, static_cast<int>(s), kStages[s], kStageColors[s]);
  return svg + "</svg>";
}

// ---- header and table ----

// "iterations done": run.json's count when it has one, else the distinct iterations logged.
int64_t iterations_done(const json& run_info, const std::vector<json>& rows) {
  const json* logged = member(run_info, "iterations");
  if (logged && logged->is_number_integer() && logged->get<int64_t>() >= 0) return logged->get<int64_t>();
  std::set<double> iterations;
  for (const auto& row : rows)
    if (auto iteration = number_at(row, "iteration")) iterations.insert(*iteration);
  return static_cast<int64_t>(iterations.size());
}

std::string config_html(const json& run_info) {
  const json* config = member(run_info, "config");
  if (!config) return "";
  std::string html = "<details><summary>config</summary><table>";
  for (const auto& [key, value] : leaves_of(*config))
    html += fmt::format(R"(<tr><th style="text-align:left">{}</th><td>{}</td></tr>)", html_escape(key),
                        html_escape(text_of(value)));
  return html + "</table></details>";
}

std::string header_html(const json& run_info, const std::vector<json>& rows) {
  std::string facts;
  for (const char* key : {"proposer", "coder", "started"})
    if (const json* value = member(run_info, key))
      facts += fmt::format("{} <b>{}</b>, ", key, html_escape(text_of(*value)));
  facts += fmt::format("<b>{}</b> iterations done", iterations_done(run_info, rows));
  return "<h1>KernelZero evolve run</h1><p>" + facts + "</p>" + config_html(run_info);
}

// iteration and phase first, then every other field (nested ones by path) in name order.
std::vector<std::string> columns_of(const std::vector<json>& rows) {
  std::set<std::string> rest;
  for (const auto& row : rows)
    for (const auto& [key, value] : leaves_of(row)) rest.insert(key);
  std::vector<std::string> columns = {"iteration", "phase"};
  for (const auto& key : rest)
    if (key != "iteration" && key != "phase") columns.push_back(key);
  return columns;
}

std::string rows_table_html(const std::vector<json>& rows) {
  auto columns = columns_of(rows);
  std::string html = R"(<div style="overflow-x:auto"><table class="rows"><tr>)";
  for (const auto& column : columns) html += "<th>" + html_escape(column) + "</th>";
  html += "</tr>";
  for (const auto& row : rows) {
    auto leaves = leaves_of(row);
    html += "<tr>";
    for (const auto& column : columns) {
      auto it = leaves.find(column);
      html += "<td>" + (it == leaves.end() ? "" : html_escape(text_of(it->second))) + "</td>";
    }
    html += "</tr>";
  }
  return html + "</table></div>";
}

std::string charts_html(const std::vector<json>& rows) {
  std::string html;
  html += "<h2>Reward</h2>" + line_chart(rows, {"reward_mean"}, false);
  html += "<h2>Correctness</h2>" + line_chart(rows, {"correct_rate", "pass_at_1", "fast_1"}, true);
  html += "<h2>Gate and frontier</h2>" + line_chart(rows, {"gate_on_share"}, true) +
          line_chart(rows, {"frontier_size"}, false);
  html += "<h2>Training</h2>" + line_chart(rows, {"kl"}, false) + line_chart(rows, {"entropy"}, false) +
          line_chart(rows, {"clip_fraction"}, false);
  html += "<h2>Seconds per iteration</h2>" + seconds_chart(rows);
  return html;
}

// run.json, when the run wrote one: an object, or an error naming the file.
Result<json> read_run_info(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return json::object();
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  json info;
  try {
    info = json::parse(*text);
  } catch (const json::parse_error& error) {  // its message says where the text broke off
    return parse_error(fmt::format("{}: not valid JSON: {}", path.string(), error.what()));
  }
  if (!info.is_object()) return parse_error(fmt::format("{}: not a JSON object", path.string()));
  return info;
}

}  // namespace

std::string render_evolve_report(const nlohmann::json& run_info, const std::vector<nlohmann::json>& metrics) {
  std::string html = R"(<!doctype html><html><head><meta charset="utf-8"><title>KernelZero evolve</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}h2{margin-top:1.6em}
svg{margin-right:1em}</style></head><body>)";
  html += header_html(run_info, metrics);
  if (metrics.empty()) return html + "<p><em>No iterations yet: metrics.jsonl has no rows.</em></p></body></html>\n";
  html += charts_html(metrics);
  html += "<h2>Rows (metrics.jsonl)</h2>" + rows_table_html(metrics);
  return html + "</body></html>\n";
}

Result<fs::path> write_evolve_report(const fs::path& run_dir) {
  auto metrics_path = run_dir / "metrics.jsonl";
  std::error_code ec;
  if (!fs::exists(metrics_path, ec))
    return not_found(fmt::format("{}: no such file (not a kz evolve run dir, or its first iteration has not "
                                 "started)", metrics_path.string()));
  auto rows = read_jsonl_log(metrics_path);
  if (!rows.ok()) return rows.status();
  auto info = read_run_info(run_dir / "run.json");
  if (!info.ok()) return info.status();
  auto path = run_dir / "report.html";
  KZ_RETURN_IF_ERROR(write_file_atomic(path, render_evolve_report(*info, *rows)));
  return path;
}

}  // namespace kz::loop
