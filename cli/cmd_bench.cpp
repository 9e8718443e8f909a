// `kz bench`: a model measured on a suite — k samples per task, each evaluated; pass@k, fast_p,
// speedups, compile and cheat rates; results.jsonl, summary.json and report.html in --out.
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "commands.h"
#include "kz/eval/suite.h"
#include "kz/llm/http_generator.h"
#include "kz/suite_bench/bench.h"
#include "kz/suite_bench/report.h"

#ifndef KZ_DEFAULT_PROMPTS_DIR
#define KZ_DEFAULT_PROMPTS_DIR "prompts"
#endif

namespace kz::cli {
namespace {

struct BenchArgs {
  std::string model, suite;
  std::string prompts = KZ_DEFAULT_PROMPTS_DIR;
  std::string api_key_env;
  int max_in_flight = 16;
  bool first_block = false;
  BenchOptions bench;
  EvalFlags flags;
};

int run(BenchArgs args) {
  if (args.flags.format.empty()) args.flags.format = "cuda-rtc";
  auto options = resolve_eval_options(args.flags);
  if (!options.ok()) return report_error(options.status());
  args.bench.format = options->format;
  args.bench.prompts_dir = args.prompts;
  args.bench.suite_label = args.suite;
  args.bench.extract.choice = args.first_block ? BlockChoice::first : BlockChoice::last;
  if (auto status = args.bench.validate(); !status.is_ok()) return report_error(status);

  auto tasks = load_tasks(args.suite);
  if (!tasks.ok()) return report_error(tasks.status());
  auto http = parse_model_spec(args.model);
  if (!http.ok()) return report_error(http.status());
  http->api_key_env = args.api_key_env;
  http->max_in_flight = args.max_in_flight;
  http->log_dir = args.bench.out_dir / "requests";
  auto generator = make_http_generator(*http);
  if (!generator.ok()) return report_error(generator.status());
  set_gpu_memory_processes(*options, default_jobs(*options));  // run_bench evaluates default_jobs at once
  auto evaluator = Evaluator::create(*options);
  if (!evaluator.ok()) return report_error(evaluator.status());

  std::cerr << fmt::format("kz: bench {} on {} tasks, {} samples each, format {}, device {}\n", args.model,
                           tasks->size(), args.bench.samples, args.bench.format, options->device);
  auto result = run_bench(*tasks, **generator, *evaluator, args.bench, std::cerr);
  if (!result.ok()) return report_error(result.status());
  auto summary = nlohmann::json::parse(std::ifstream(args.bench.out_dir / "summary.json"), nullptr, false);
  std::cout << render_bench_table(summary);
  std::cout << fmt::format("generated {} and evaluated {} samples in this run ({} verdicts in total)\n",
                           result->samples_generated, result->samples_evaluated, result->verdicts.size());
  std::cout << fmt::format("results: {}  summary: {}  report: {}\n", (args.bench.out_dir / "results.jsonl").string(),
                           (args.bench.out_dir / "summary.json").string(), (args.bench.out_dir / "report.html").string());
  return kExitOk;
}

}  // namespace

Action add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* command = app.add_subcommand("bench", "Measure a model on a suite: pass@k, fast_p, speedups (resumable)");
  command->add_option("--model", args->model, "openai:<base-url>:<model>, e.g. openai:http://127.0.0.1:8000/v1:coder")
      ->required();
  command->add_option("--suite", args->suite, "reference modules: a directory, a .py or a .jsonl")->required();
  command->add_option("--samples", args->bench.samples, "samples per task (k)")->required();
  command->add_option("--out", args->bench.out_dir, "run directory (rerun the same command to resume)")->required();
  command->add_option("--temperature", args->bench.temperature, "sampling temperature (default 0.8)");
  command->add_option("--top-p", args->bench.top_p, "nucleus sampling (default 0.95)");
  command->add_option("--max-tokens", args->bench.max_tokens, "new tokens per sample (default 8192)");
  command->add_option("--gen-seed", args->bench.seed, "generation seed base (default 1234)");
  command->add_option("--prompts", args->prompts, "folder of prompt templates (default: the source tree's prompts/)");
  command->add_option("--api-key-env", args->api_key_env, "environment variable holding the API key");
  command->add_option("--max-in-flight", args->max_in_flight, "concurrent HTTP requests (default 16)");
  command->add_flag("--first-block", args->first_block, "take the first code block of a reply, not the last");
  command->add_option("--also-policy", args->bench.also_policy,
                      "evaluate every sample again under this policy too (strict or kernelbench): its verdicts in "
                      "results.<policy>.jsonl, its metrics in summary.json under its name")
      ->check(CLI::IsMember({"strict", "kernelbench"}));
  add_eval_flags(*command, args->flags);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
