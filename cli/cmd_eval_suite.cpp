// `kz eval-suite`: every candidate in a directory against the suite; results.jsonl, a progress
// bar, a per-candidate table and the summary (pass rate, compile rate, geomean speedup, fast_1).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "kz/core/files.h"
#include "kz/core/parallel.h"
#include "kz/eval/suite.h"
#include "kz/eval/worker_client.h"

namespace kz::cli {
namespace {

struct SuiteArgs {
  std::string suite, candidates, out;
  bool quiet = false;
  EvalFlags flags;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Where kz's own time went around the evaluations: set-up (the suite, the candidates, the
// evaluator: nvidia-smi on a GPU), the batch, and the shut-down of the fork servers and zygotes.
struct Phases {
  double setup_s = 0, batch_s = 0, shutdown_s = 0;
  int servers_ended = 0;
};

nlohmann::json phases_json(const Phases& p) {
  return {{"setup", p.setup_s}, {"batch", p.batch_s}, {"shutdown", p.shutdown_s}, {"servers_ended", p.servers_ended}};
}

int run(const SuiteArgs& args) {
  auto started = Clock::now();
  Phases phases;
  // Several GPUs (--device cuda:0,cuda:1 or cuda:all): one pool of workers per device.
  EvalFlags flags = args.flags;
  auto device_list = take_device_list(flags);
  if (!device_list.ok()) return report_error(device_list.status());
  const std::vector<std::string>& devices = *device_list;
  auto options = resolve_eval_options(flags);
  if (!options.ok()) return report_error(options.status());
  auto tasks = load_tasks(args.suite);
  if (!tasks.ok()) return report_error(tasks.status());
  auto entries = discover_candidates(*tasks, args.candidates);
  if (!entries.ok()) return report_error(entries.status());
  set_gpu_memory_processes(*options, default_jobs(*options));  // per device, as run_options.jobs
  auto evaluator = Evaluator::create(*options);
  if (!evaluator.ok()) return report_error(evaluator.status());

  SuiteRunOptions run_options;
  run_options.jobs = default_jobs(*options);
  run_options.devices = devices;
  run_options.compile_jobs = cpu_cores();
  run_options.results_path = args.out;
  if (!args.out.empty()) {
    auto parent = std::filesystem::path(args.out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    std::filesystem::remove(args.out);
  }
  std::string device_text = devices.size() > 1 ? fmt::format("devices {}", fmt::join(devices, ",")) : "device " + options->device;
  std::cerr << fmt::format("kz: {} candidates for {} tasks from {}, {}, {} at once{}\n", entries->size(),
                           tasks->size(), args.candidates, device_text, run_options.jobs,
                           devices.size() > 1 ? " per device" : "");
  phases.setup_s = seconds_since(started);
  auto batch_started = Clock::now();
  auto verdicts = run_suite(*evaluator, *tasks, *entries, run_options, std::cerr);
  phases.batch_s = seconds_since(batch_started);
  // Now rather than at exit, so that the summary can say what it took.
  auto shutdown_started = Clock::now();
  phases.servers_ended = stop_fork_servers();
  phases.shutdown_s = seconds_since(shutdown_started);
  if (!verdicts.ok()) return report_error(verdicts.status());
  std::cerr << fmt::format("kz: set-up {:.2f} s, batch {:.2f} s, shut-down {:.2f} s ({} fork servers ended)\n",
                           phases.setup_s, phases.batch_s, phases.shutdown_s, phases.servers_ended);

  SuiteSummary summary = summarize(*verdicts, static_cast<int>(tasks->size()));
  if (!args.quiet) std::cout << render_verdict_table(*verdicts) << "\n";
  std::cout << render_summary(summary);
  if (!args.out.empty()) {
    auto summary_path = std::filesystem::path(args.out).replace_extension(".summary.json");
    nlohmann::json json = summary_json(summary);
    json["phases_s"] = phases_json(phases);
    auto written = write_file_atomic(summary_path, json.dump(2) + "\n");
    if (!written.is_ok()) return report_error(written);
    std::cout << fmt::format("results: {}  summary: {}\n", args.out, summary_path.string());
  }
  return kExitOk;
}

}  // namespace

Action add_eval_suite_command(CLI::App& app) {
  auto args = std::make_shared<SuiteArgs>();
  auto* command = app.add_subcommand("eval-suite", "Evaluate a directory of candidates against a suite");
  command->add_option("--suite", args->suite, "reference modules: a directory, a .py or a .jsonl")->required();
  command->add_option("--candidates", args->candidates, "directory of <task-id>.py or <task-id>/*.py")->required();
  command->add_option("--out", args->out, "results.jsonl to write (one verdict per line)");
  command->add_flag("--quiet", args->quiet, "print only the summary, not the per-candidate table");
  add_eval_flags(*command, args->flags);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
