// `kz teach`: the kernel teacher's corpus (kz/teacher/corpus.h, docs/teacher.md). Samples modules
// of one split from a seed, writes their references and triton / cuda-rtc candidates (unfused and
// fused, several block sizes) as corpus.jsonl plus a suite directory `kz eval-suite` reads, and
// with --check evaluates every candidate through the evaluation engine, prints the verdict counts
// and fails when a teacher candidate is not correct (on a CPU, cuda-rtc compiled is enough).
#include <fmt/format.h>

#include <iostream>
#include <sstream>

#include "commands.h"
#include "kz/core/parallel.h"
#include "kz/eval/suite.h"
#include "kz/eval/worker_client.h"
#include "kz/teacher/corpus.h"

namespace kz::cli {
namespace {

struct TeachArgs {
  std::string out;
  int count = 0;
  uint64_t seed = 0;
  std::string split = "train";
  std::string formats = "triton,cuda-rtc";
  int variants = 3;
  int scale = 1;
  bool check = false;
  EvalFlags eval;  // --check only: --device, --config, --trials, --jobs, --no-cache
};

Result<teacher::TeachOptions> teach_options(const TeachArgs& args) {
  teacher::TeachOptions options;
  options.out_dir = args.out;
  options.count = args.count;
  options.seed = args.seed;
  options.variants = args.variants;
  options.scale = args.scale;
  auto split = teacher::parse_split(args.split);
  if (!split.ok()) return split.status().with_context("--split");
  options.split = *split;
  options.formats.clear();
  std::istringstream names(args.formats);
  for (std::string name; std::getline(names, name, ',');) {
    auto format = teacher::parse_format(name);
    if (!format.ok()) return format.status().with_context("--formats");
    options.formats.push_back(*format);
  }
  KZ_RETURN_IF_ERROR(options.validate());
  return options;
}

// Every candidate through the evaluator, as kz eval-suite runs them; the exit code.
int check(const TeachArgs& args, const teacher::TeachOptions& options, std::vector<teacher::CorpusEntry>& corpus) {
  EvalFlags flags = args.eval;
  auto devices = take_device_list(flags);
  if (!devices.ok()) return report_error(devices.status());
  auto eval_options = resolve_eval_options(flags);
  if (!eval_options.ok()) return report_error(eval_options.status());
  set_gpu_memory_processes(*eval_options, default_jobs(*eval_options));
  auto evaluator = Evaluator::create(*eval_options);
  if (!evaluator.ok()) return report_error(evaluator.status());
  SuiteRunOptions run;
  run.jobs = default_jobs(*eval_options);
  run.devices = *devices;
  run.compile_jobs = cpu_cores();
  auto report = teacher::check_corpus(*evaluator, run, options, corpus, std::cerr);
  stop_fork_servers();
  if (!report.ok()) return report_error(report.status());
  std::cout << report->render();
  std::cout << fmt::format("verdicts: {}\n", (options.out_dir / "check.jsonl").string());
  if (!report->all_passed()) {
    std::cerr << fmt::format("kz: teach: {} of {} teacher candidates failed the check (FAILED lines above); "
                             "the teacher wrote a wrong kernel\n",
                             report->failures.size(), report->candidates);
    return kExitInfra;
  }
  return kExitOk;
}

int run(const TeachArgs& args) {
  auto options = teach_options(args);
  if (!options.ok()) return report_error(options.status());
  std::vector<teacher::CorpusEntry> corpus = teacher::make_corpus(*options);
  if (auto written = teacher::write_corpus(*options, corpus); !written.is_ok()) return report_error(written);
  size_t candidates = 0;
  for (const auto& entry : corpus) candidates += entry.candidates.size();
  std::cout << fmt::format("wrote {} {} modules, {} candidates: {}, suite/, candidates/\n", corpus.size(), args.split,
                           candidates, (options->out_dir / "corpus.jsonl").string());
  return args.check ? check(args, *options, corpus) : kExitOk;
}

}  // namespace

Action add_teach_command(CLI::App& app) {
  auto args = std::make_shared<TeachArgs>();
  auto* command = app.add_subcommand("teach", "Write the kernel teacher's corpus: modules with correct triton / cuda-rtc kernels");
  command->add_option("--out", args->out, "output directory: corpus.jsonl, suite/, candidates/")->required();
  command->add_option("--count", args->count, "modules to write")->required();
  command->add_option("--seed", args->seed, "the sampler's seed (default 0): the same seed writes the same corpus");
  command->add_option("--split", args->split, "train or heldout (default train; docs/teacher.md gives the rule)");
  command->add_option("--formats", args->formats, "candidate formats, comma-separated (default triton,cuda-rtc)");
  command->add_option("--variants", args->variants, "block-size variants per format and fusion, 1-3: the usual block size, a smaller, a larger (default 3)");
  command->add_option("--scale", args->scale, "reference sizes times this, for GPU runs (default 1; cpu_sizes keep the CPU's)");
  command->add_flag("--check", args->check, "evaluate every candidate; fail unless all are correct");
  command->add_option("--device", args->eval.device, "--check on cpu or cuda:N, cuda:0,cuda:1, cuda:all (default cpu)");
  command->add_option("--config", args->eval.config_path, "--check: evaluation TOML (see configs/eval.toml)");
  command->add_option("--trials", args->eval.trials, "--check: correctness trials per candidate (default 5)");
  command->add_option("--jobs", args->eval.jobs, "--check: evaluations at once, per device");
  command->add_flag("--no-cache", args->eval.no_cache, "--check: neither reuse nor store verdicts");
  return [args] { return run(*args); };
}

}  // namespace kz::cli
