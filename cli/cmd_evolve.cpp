// `kz evolve`: the co-evolution loop (kz/loop/evolve.h) as a command, run by kz-engine (it trains
// models in process). A new run: --config FILE --out RUN_DIR; going on with one: --resume RUN_DIR.
// --iterations N is the total the run reaches (a run stopped after 1 and resumed with
// --iterations 2 does one more). --set section.key=VALUE changes one key of a new run's config
// (the ablations of one experiment: --set reward.mode=ungated --set run.seed=2); the resolved
// config, overrides included, is the run dir's config.toml. Ends by writing the run's report.
// Data parallel as a rank of WORLD_SIZE > 1 (`kz evolve --nproc N`, which main.cpp turns into
// `kz launch --nproc N -- evolve ...`, torchrun, Slurm; docs/scale.md): rank 0 alone prints,
// writes the run dir and the report.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "kz/dist/world.h"
#include "kz/loop/evolve.h"
#include "kz/loop/report.h"

#ifndef KZ_DEFAULT_PROMPTS_DIR
#define KZ_DEFAULT_PROMPTS_DIR "prompts"
#endif

namespace kz::cli {

Action add_evolve_command(CLI::App& app) {
  struct Args {
    std::string config, out, resume;
    std::vector<std::string> overrides;
    int64_t iterations = 0;
    int nproc = 1;
  };
  auto args = std::make_shared<Args>();
  auto* evolve = app.add_subcommand("evolve", "Co-evolve a Proposer and a Coder: modules on the Coder's frontier, "
                                              "kernels trained with CA-GRPO (a run dir, resumable)");
  auto* config = evolve->add_option("--config", args->config, "The run's TOML (configs/evolve-tiny-cpu.toml ...)");
  auto* out = evolve->add_option("--out", args->out, "A new run dir");
  auto* resume = evolve->add_option("--resume", args->resume, "Go on with the run in this dir, from its newest "
                                                             "checkpoint");
  evolve->add_option("--iterations", args->iterations, "The total iterations the run reaches (default: the "
                                                       "config's run.iterations)")
      ->check(CLI::PositiveNumber);
  auto* set = evolve->add_option("--set", args->overrides, "section.key=VALUE over the config's key, for a new run "
                                                          "(repeatable): --set reward.mode=ungated");
  // Listed for --help: kz takes --nproc off and runs `kz launch --nproc N -- evolve ...` (main.cpp).
  evolve->add_option("--nproc", args->nproc, "data-parallel ranks on this host, one per GPU (docs/scale.md)")
      ->check(CLI::PositiveNumber);
  set->excludes(resume);
  config->excludes(resume);
  out->excludes(resume);
  return [args] {
    if (args->nproc > 1)
      return report_error(invalid_argument(
          "--nproc is kz's (kz evolve --nproc N, or kz launch --nproc N -- evolve ...), not kz-engine's"));
    auto world = dist::current_world();
    if (!world.ok()) return report_error(world.status());
    if (args->resume.empty() && (args->config.empty() || args->out.empty()))
      return report_error(invalid_argument("give --config FILE --out RUN_DIR for a new run, or --resume RUN_DIR"));
    loop::EvolveOptions options;
    options.resume = !args->resume.empty();
    options.run_dir = options.resume ? args->resume : args->out;
    options.config_path = args->config;
    options.overrides = args->overrides;
    if (args->iterations > 0) options.iterations = args->iterations;
    options.default_prompts_dir = KZ_DEFAULT_PROMPTS_DIR;
    auto result = loop::run_evolve(options, std::cerr);
    if (!result.ok()) return report_error(result.status());
    if (!world->is_main()) return static_cast<int>(kExitOk);  // rank 0 writes the report
    auto report = loop::write_evolve_report(options.run_dir);
    if (!report.ok()) return report_error(report.status());
    std::cout << fmt::format("{} iterations done ({} in this run)\nrun: {}\nreport: {}\n", result->iterations_done,
                             result->iterations_run, options.run_dir.string(), report->string());
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
