// `kz sft`: supervised training of a Coder or a Proposer on the teacher's corpus
// (kz/sft/sft.h), run by kz-engine. A new run: --config FILE [--out DIR]; going on with one:
// --resume DIR. --stop-at-step N ends this call after step N (checkpointed), so a long run fits
// time-boxed calls. Data parallel as a rank of a torchrun-style launch (kz launch, or kz sft
// --nproc N, which main.cpp turns into one; docs/scale.md).
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "kz/sft/sft.h"

#ifndef KZ_DEFAULT_PROMPTS_DIR
#define KZ_DEFAULT_PROMPTS_DIR "prompts"
#endif

namespace kz::cli {

Action add_sft_command(CLI::App& app) {
  struct Args {
    std::string config, out, resume;
    int64_t stop_at_step = 0;
    int nproc = 1;
  };
  auto args = std::make_shared<Args>();
  auto* command = app.add_subcommand("sft", "Supervised training on a kz teach corpus: prompt -> completion pairs "
                                            "in the role's template, loss on the completion (resumable)");
  auto* config = command->add_option("--config", args->config, "the run's TOML (configs/sft-coder-tiny-cpu.toml ...)");
  auto* out = command->add_option("--out", args->out, "a new run dir (default: the config's [output] dir)");
  auto* resume = command->add_option("--resume", args->resume, "go on with the run in this dir from its newest checkpoint");
  command->add_option("--stop-at-step", args->stop_at_step, "stop after this optimiser step (checkpointed)")
      ->check(CLI::PositiveNumber);
  // Listed for --help: kz takes --nproc off and runs `kz launch --nproc N -- sft ...` (main.cpp).
  command->add_option("--nproc", args->nproc, "data-parallel ranks on this host, one per GPU (docs/scale.md)")
      ->check(CLI::PositiveNumber);
  config->excludes(resume);
  out->excludes(resume);
  return [args] {
    if (args->nproc > 1)
      return report_error(invalid_argument("--nproc is kz's (kz sft --nproc N, or kz launch --nproc N -- sft ...), "
                                           "not kz-engine's"));
    if (args->resume.empty() && args->config.empty())
      return report_error(invalid_argument("give --config FILE for a new run, or --resume RUN_DIR"));
    sft::SftOptions options;
    options.config_path = args->config;
    options.resume = !args->resume.empty();
    options.out_dir = options.resume ? args->resume : args->out;
    options.default_prompts_dir = KZ_DEFAULT_PROMPTS_DIR;
    options.stop_at_step = args->stop_at_step;
    auto report = sft::run_sft(options, std::cerr);
    if (!report.ok()) return report_error(report.status());
    const auto& r = *report;
    if (r.rank != 0) return static_cast<int>(kExitOk);  // rank 0 speaks for the run
    auto eval = [](const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : std::string("-"); };
    std::cout << fmt::format("{} of {} steps; train loss {:.4f} -> {:.4f}, eval loss {} -> {}; {:.0f} tokens/s\n",
                             r.steps_done, r.total_steps, r.first_loss, r.last_loss, eval(r.first_eval_loss),
                             eval(r.last_eval_loss), r.tokens_per_s);
    std::cout << (r.final_dir.empty() ? fmt::format("stopped: kz sft --resume {}\n", r.out_dir.string())
                                      : fmt::format("model: {}\n", r.final_dir.string()));
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
