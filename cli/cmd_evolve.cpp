// `kz evolve`: the co-evolution loop (kz/loop/evolve.h) as a command, run by kz-engine (it trains
// models in process). A new run: --config FILE --out RUN_DIR; going on with one: --resume RUN_DIR.
// --iterations N is the total the run reaches (a run stopped after 1 and resumed with
// --iterations 2 does one more). --set section.key=VALUE changes one key of a new run's config
// (the ablations of one experiment: --set reward.mode=ungated --set run.seed=2); the resolved
// config, overrides included, is the run dir's config.toml. Ends by writing the run's report.
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
  set->excludes(resume);
  config->excludes(resume);
  out->excludes(resume);
  return [args] {
    // N copies of one loop would write one run dir N times over.
    auto world = dist::current_world();
    if (!world.ok()) return report_error(world.status());
    if (world->distributed())
      return report_error(invalid_argument(fmt::format(
          "kz evolve runs in one process: it is not data parallel yet (WORLD_SIZE={}; docs/scale.md)", world->size)));
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
    auto report = loop::write_evolve_report(options.run_dir);
    if (!report.ok()) return report_error(report.status());
    std::cout << fmt::format("{} iterations done ({} in this run)\nrun: {}\nreport: {}\n", result->iterations_done,
                             result->iterations_run, options.run_dir.string(), report->string());
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
