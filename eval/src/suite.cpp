// Suite runs: candidate discovery, a small thread pool of worker processes (the `cuda` pre-build
// beside the evaluations, kz/eval/pipeline.h), summaries.
#include "kz/eval/suite.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include "kz/core/files.h"
#include "kz/core/parallel.h"
#include "kz/core/terminal.h"
#include "kz/eval/cache.h"
#include "kz/eval/pipeline.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

Result<Candidate> read_candidate(const fs::path& path) {
  auto source = read_file(path);
  if (!source.ok()) return source.status();
  return Candidate{path.string(), std::move(*source)};
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir)) paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The entries to pre-build on a GPU: the `cuda` candidates (load_inline), whose builds take
// seconds of nvcc each; built in parallel, their extensions land in the shared build cache, so
// their GPU evaluations load them instead of compiling one by one.
std::vector<size_t> cuda_entries(const Evaluator& evaluator, const std::vector<SuiteEntry>& entries) {
  std::vector<size_t> cuda;
  for (size_t i = 0; i < entries.size(); ++i)
    if (resolve_format(evaluator.options().format, entries[i].candidate.source) == Format::cuda) cuda.push_back(i);
  return cuda;
}

std::string verdict_note(const Verdict& verdict) {
  std::string note = fmt::format("{} {}", verdict.task_id, status_name(verdict.status));
  if (verdict.speedup) note += fmt::format(" {:.2f}x", *verdict.speedup);
  return note;
}

// Where a suite run's verdicts go as they arrive: results.jsonl and one progress bar. The
// pre-build runs beside the evaluations, so it draws no bar of its own (two bars would redraw
// over each other on a terminal): each finished build is a note on the evaluations' bar.
// Thread-safe: one writer at a time, so log lines never interleave.
class SuiteRecorder {
 public:
  SuiteRecorder(size_t entries, size_t builds, fs::path results_path, std::ostream& out)
      : verdicts_(entries), builds_(builds), results_path_(std::move(results_path)), bar_("eval", entries, out) {}

  // An evaluation's verdict.
  Status record(size_t entry, Verdict verdict) {
    std::lock_guard lock(mutex_);
    std::string note = verdict_note(verdict);
    return record_locked(entry, std::move(verdict), note);
  }

  // A finished pre-build; `final`: its verdict is the entry's (a compile_error, not built again).
  Status prebuilt(size_t entry, Verdict verdict, bool final) {
    std::lock_guard lock(mutex_);
    std::string note =
        fmt::format("pre-build {}/{}: {} {}", ++builds_done_, builds_, verdict.task_id, status_name(verdict.status));
    if (!final) {
      bar_.show(note);
      return Status::ok();
    }
    return record_locked(entry, std::move(verdict), note);
  }

  void finish() { bar_.finish(); }
  std::vector<Verdict> take() { return std::move(verdicts_); }

 private:
  Status record_locked(size_t entry, Verdict verdict, const std::string& note) {
    if (!results_path_.empty())
      KZ_RETURN_IF_ERROR(append_line(results_path_, to_json(verdict).dump(-1, ' ', false,
                                                                          nlohmann::json::error_handler_t::replace)));
    bar_.advance(note);
    verdicts_[entry] = std::move(verdict);
    return Status::ok();
  }

  std::mutex mutex_;
  std::vector<Verdict> verdicts_;
  size_t builds_, builds_done_ = 0;
  fs::path results_path_;
  ProgressBar bar_;
};

}  // namespace

Result<std::vector<SuiteEntry>> discover_candidates(const std::vector<Task>& tasks, const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(fmt::format("candidate directory {} does not exist", dir.string()));
  std::map<std::string, size_t> task_index;
  for (size_t i = 0; i < tasks.size(); ++i) task_index[tasks[i].id] = i;
  std::vector<SuiteEntry> entries;
  for (const auto& path : sorted_entries(dir)) {
    bool is_dir = fs::is_directory(path);
    if (!is_dir && path.extension() != ".py") continue;
    std::string id = is_dir ? path.filename().string() : path.stem().string();
    auto it = task_index.find(id);
    if (it == task_index.end())
      return invalid_argument(fmt::format("candidate {} names no task in the suite (task ids are file stems)",
                                          path.string()));
    std::vector<fs::path> files = is_dir ? sorted_entries(path) : std::vector<fs::path>{path};
    for (const auto& file : files) {
      if (file.extension() != ".py") continue;
      auto candidate = read_candidate(file);
      if (!candidate.ok()) return candidate.status();
      entries.push_back({it->second, std::move(*candidate)});
    }
  }
  if (entries.empty()) return not_found(fmt::format("no candidates (*.py) in {}", dir.string()));
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SuiteEntry& a, const SuiteEntry& b) { return a.task_index < b.task_index; });
  return entries;
}

Result<std::vector<std::string>> parse_devices(const std::string& devices) {
  std::vector<std::string> list;
  if (devices == "cuda:all") {
    int count = gpu_count();
    if (count == 0) return not_found("--device cuda:all: nvidia-smi lists no GPU");
    for (int i = 0; i < count; ++i) list.push_back(fmt::format("cuda:{}", i));
    return list;
  }
  std::istringstream parts(devices);
  for (std::string device; std::getline(parts, device, ',');) {
    if (device.empty()) return invalid_argument(fmt::format("device list '{}' has an empty entry", devices));
    if (std::find(list.begin(), list.end(), device) != list.end())
      return invalid_argument(fmt::format("device list '{}' names {} twice", devices, device));
    list.push_back(device);
  }
  if (list.empty()) return invalid_argument("empty device list");
  return list;
}

Result<DevicePools> DevicePools::create(const Evaluator& base, const std::vector<std::string>& devices) {
  DevicePools pools;
  if (devices.empty()) pools.evaluators_.push_back(base);
  for (const auto& device : devices) {
    auto evaluator = base.with_device(device);
    if (!evaluator.ok()) return evaluator.status();
    pools.evaluators_.push_back(std::move(*evaluator));
  }
  pools.in_flight_.assign(pools.evaluators_.size(), 0);
  return pools;
}

size_t DevicePools::acquire() {
  std::lock_guard lock(*mutex_);
  size_t best = std::min_element(in_flight_.begin(), in_flight_.end()) - in_flight_.begin();
  ++in_flight_[best];
  return best;
}

void DevicePools::release(size_t k) {
  std::lock_guard lock(*mutex_);
  --in_flight_[k];
}

Result<std::vector<Verdict>> run_suite(const Evaluator& evaluator, const std::vector<Task>& tasks,
                                       const std::vector<SuiteEntry>& entries, const SuiteRunOptions& options,
                                       std::ostream& progress_out) {
  auto pools = DevicePools::create(evaluator, options.devices);
  if (!pools.ok()) return pools.status();
  for (size_t pool = 0; pool < pools->size(); ++pool)  // they import while the first requests are handed out
    if (auto started = pools->at(pool).start_fork_servers(options.jobs); !started.is_ok())
      progress_out << "kz: " << started.to_string() << " (evaluations start their own workers)\n";
  // On the CPU a `cuda` evaluation is a build and no more (compiled_not_run): nothing to pre-build.
  std::vector<size_t> to_build;
  if (evaluator.options().device != "cpu") to_build = cuda_entries(evaluator, entries);
  // Build servers come from their own zygote, where there is one: it imports beside the other's.
  if (!to_build.empty()) (void)pools->at(0).start_fork_servers(0, EvalMode::compile_only);
  SuiteRecorder recorder(entries.size(), to_build.size(), options.results_path, progress_out);
  // A pre-build that the evaluation follows. Written by the build, read after it.
  std::vector<std::optional<PreBuild>> prebuilds(entries.size());
  auto batch_start = std::chrono::steady_clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - batch_start).count(); };
  auto build = [&](size_t i) -> Result<Built> {
    const auto& entry = entries[i];
    double started_s = since_start();
    auto verdict = pools->at(0).evaluate(tasks[entry.task_index], entry.candidate, EvalMode::compile_only);
    if (!verdict.ok()) return verdict.status().with_context(fmt::format("pre-building {}", entry.candidate.label));
    // A failed build is final: the GPU phase would only fail it again, one build at a time.
    bool final = verdict->status == EvalStatus::compile_error;
    if (final) verdict->profile.started_s = started_s;
    else prebuilds[i] = prebuild_of(*verdict, started_s);
    KZ_RETURN_IF_ERROR(recorder.prebuilt(i, std::move(*verdict), final));
    return final ? Built::settled : Built::evaluate;
  };
  auto evaluate = [&](size_t i) -> Status {
    const auto& entry = entries[i];
    double started_s = since_start();
    auto verdict = [&] {
      DevicePools::Lease lease(*pools);
      return pools->at(lease.pool()).evaluate(tasks[entry.task_index], entry.candidate);
    }();
    if (!verdict.ok()) return verdict.status();
    verdict->profile.started_s = started_s;
    if (const auto& prebuild = prebuilds[i]) attach_prebuild(*verdict, *prebuild);
    return recorder.record(i, std::move(*verdict));
  };
  PipelineJobs jobs{.build = options.compile_jobs, .evaluate = options.jobs * static_cast<int>(pools->size())};
  Status status = run_pipeline(entries.size(), to_build, jobs, build, evaluate);
  recorder.finish();
  if (!status.is_ok()) return status;
  return recorder.take();
}

SuiteSummary summarize(const std::vector<Verdict>& verdicts, int tasks) {
  SuiteSummary s;
  s.tasks = tasks;
  s.candidates = static_cast<int>(verdicts.size());
  std::map<std::string, int> tasks_seen;
  std::map<EvalStatus, int> counts;
  double log_sum = 0;
  for (const auto& v : verdicts) {
    tasks_seen[v.task_id]++;
    counts[v.status]++;
    s.unchecked += !v.unchecked.empty();
    s.retried_alone += v.retried_alone;
    if (v.has_check(Check::exceeds_gpu_memory)) {  // the card's limit, not the candidate's failure: out of the rates
      s.exceeds_gpu_memory++;
      continue;
    }
    s.compiled += v.compiled;
    s.correct += v.correct;
    if (v.correct && v.speedup && *v.speedup > 0) {
      s.timed++;
      s.faster += *v.speedup > 1.0;
      log_sum += std::log(*v.speedup);
    }
  }
  s.tasks_with_candidates = static_cast<int>(tasks_seen.size());
  s.geomean_speedup = s.timed ? std::exp(log_sum / s.timed) : 0;
  for (const auto& [status, count] : counts) s.status_counts.emplace_back(status_name(status), count);
  return s;
}

nlohmann::json summary_json(const SuiteSummary& s) {
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [name, count] : s.status_counts) counts[name] = count;
  return {{"tasks", s.tasks},
          {"tasks_with_candidates", s.tasks_with_candidates},
          {"candidates", s.candidates},
          {"compiled", s.compiled},
          {"correct", s.correct},
          {"timed", s.timed},
          {"pass_rate", s.pass_rate()},
          {"compile_rate", s.compile_rate()},
          {"fast_1", s.fast_1()},
          {"geomean_speedup", s.timed ? nlohmann::json(s.geomean_speedup) : nlohmann::json(nullptr)},
          {"status_counts", counts},
          {"unchecked", s.unchecked},
          {"exceeds_gpu_memory", s.exceeds_gpu_memory},
          {"retried_alone", s.retried_alone}};
}

std::string render_summary(const SuiteSummary& s) {
  Table table({"candidates", "compiled", "correct", "pass rate", "compile rate", "geomean speedup", "fast_1"});
  table.add_row({std::to_string(s.candidates), std::to_string(s.compiled), std::to_string(s.correct),
                 fmt::format("{:.1f}%", 100 * s.pass_rate()), fmt::format("{:.1f}%", 100 * s.compile_rate()),
                 s.timed ? fmt::format("{:.3f}x", s.geomean_speedup) : "n/a (not timed)",
                 // Untimed correct candidates leave fast_1 unknown; with none correct it is 0 regardless.
                 s.timed || !s.correct ? fmt::format("{:.1f}%", 100 * s.fast_1()) : "n/a"});
  std::string statuses;
  for (const auto& [name, count] : s.status_counts) statuses += fmt::format("  {}: {}", name, count);
  std::string notes;
  if (s.unchecked) notes += fmt::format("\n{} verdict(s) with a check that could not run (their `unchecked`)", s.unchecked);
  if (s.exceeds_gpu_memory)
    notes += fmt::format("\n{} candidate(s) of tasks that need more GPU memory than the card has: not counted as failures",
                         s.exceeds_gpu_memory);
  if (s.retried_alone)
    notes += fmt::format("\n{} evaluation(s) ran out of GPU memory beside others and were run again alone",
                         s.retried_alone);
  return table.render() + "statuses:" + statuses + notes + "\n";
}

std::string render_verdict_table(const std::vector<Verdict>& verdicts) {
  Table table({"task", "format", "status", "speedup", "cand ms", "ref ms", "spread", "checks"});
  for (const auto& v : verdicts) {
    std::string checks;
    for (Check c : v.checks) {
      if (!checks.empty()) checks += ',';
      checks += check_name(c);
    }
    for (const auto& [check, why] : v.unchecked) checks += std::string(checks.empty() ? "" : ",") + "unchecked:" + check_name(check);
    std::string spread = v.candidate_timing && v.candidate_timing->median_ms > 0
                             ? fmt::format("{:.1f}%", 100 * (v.candidate_timing->p90_ms - v.candidate_timing->p10_ms) /
                                                          v.candidate_timing->median_ms)
                             : "";
    table.add_row({v.task_id, v.format, status_name(v.status), v.speedup ? fmt::format("{:.3f}x", *v.speedup) : "",
                   v.candidate_timing ? fmt::format("{:.4f}", v.candidate_timing->median_ms) : "",
                   v.reference_timing ? fmt::format("{:.4f}", v.reference_timing->median_ms) : "", spread, checks});
  }
  return table.render();
}

}  // namespace kz
