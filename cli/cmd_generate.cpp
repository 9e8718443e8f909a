// `kz generate --model DIR --prompt TEXT`: the raw-text continuation of a prompt by the in-process
// engine (no chat template). Text on stdout (timing on stderr), or one JSON object with --json.
// Settings: configs/model.toml's [engine] and [sampling], through --config and flags.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "kz/model/engine.h"
#include "model_flags.h"

namespace kz::cli {
namespace {

struct GenerateArgs {
  explicit GenerateArgs(CLI::App& command) : settings(command) {}
  ModelFlags settings;
  fs::path model_dir;
  std::string prompt;
  bool json = false;
};

int run(const GenerateArgs& args) {
  auto options = args.settings.resolve();
  if (!options.ok()) return report_error(options.status());
  options->engine.model_dir = args.model_dir;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto engine = model::Engine::load(options->engine);
  if (!engine.ok()) return report_error(engine.status());
  auto t1 = Clock::now();
  model::EngineRequest request;
  request.prompt_ids = (*engine)->tokenizer().encode(args.prompt, /*allow_special=*/true);
  request.sampling = options->sampling;
  request.sampling.stop_at_eos = !options->ignore_eos;
  auto results = (*engine)->generate({request});
  auto t2 = Clock::now();
  if (!results[0].ok()) return report_error(results[0].status());
  const model::EngineCompletion& c = *results[0];
  double load_s = std::chrono::duration<double>(t1 - t0).count();
  double gen_s = std::chrono::duration<double>(t2 - t1).count();
  double tokens_per_s = gen_s > 0 ? static_cast<double>(c.token_ids.size()) / gen_s : 0;
  if (args.json) {
    nlohmann::json out = {{"text", c.text},
                          {"token_ids", c.token_ids},
                          {"logprobs", c.logprobs},
                          {"finish_reason", c.finish_reason},
                          {"prompt_ids", request.prompt_ids},
                          {"prompt_tokens", c.prompt_tokens},
                          {"completion_tokens", c.token_ids.size()},
                          {"model", args.model_dir.string()},
                          {"device", (*engine)->device()},
                          {"dtype", (*engine)->dtype()},
                          {"seed", options->sampling.seed},
                          {"load_s", load_s},
                          {"generate_s", gen_s},
                          {"tokens_per_s", tokens_per_s}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << c.text << "\n";
    std::cerr << fmt::format("kz: {} prompt + {} new tokens ({}) in {:.2f} s, {:.1f} tokens/s; load {:.2f} s ({})\n",
                             c.prompt_tokens, c.token_ids.size(), c.finish_reason, gen_s, tokens_per_s, load_s,
                             (*engine)->describe());
  }
  return kExitOk;
}

}  // namespace

Action add_generate_command(CLI::App& app) {
  auto* command = app.add_subcommand("generate", "Continue a prompt with a local checkpoint (raw text, no chat template)");
  auto args = std::make_shared<GenerateArgs>(*command);
  command->add_option("--model", args->model_dir, "checkpoint directory (Hugging Face layout)")->required();
  command->add_option("--prompt", args->prompt, "the text to continue")->required();
  ModelFlags& settings = args->settings;
  settings.add("--max-new-tokens", "sampling.max_new_tokens", "new tokens at most (default 256)")
      ->check(CLI::PositiveNumber);
  settings.add("--temperature", "sampling.temperature", "0: greedy (default 1)")->check(CLI::NonNegativeNumber);
  settings.add("--top-p", "sampling.top_p", "nucleus sampling mass (default 1: off)")->check(CLI::Range(0.0, 1.0));
  settings.add("--top-k", "sampling.top_k", "keep the k most likely tokens (default 0: off)")
      ->check(CLI::NonNegativeNumber);
  settings.add("--seed", "sampling.seed", "sampling seed (default 0)");
  settings.add("--stop", "sampling.stop", "stop string (repeatable; not included in the text)");
  settings.add("--ignore-eos,!--no-ignore-eos", "sampling.ignore_eos",
               "do not stop at the generation config's eos tokens (--no-ignore-eos undoes a config file's true)");
  settings.add("--device", "engine.device", "cpu, cuda or cuda:N (default cpu)");
  settings.add("--dtype", "engine.dtype", "fp32, bf16 or fp16 (default: the checkpoint's)");
  settings.add("--cuda-graph,!--no-cuda-graph", "engine.cuda_graph", "decode through a CUDA graph on GPUs (default on)");
  settings.add("--max-batch-rows", "engine.max_batch_rows",
               "rows decoded at once across all requests; 0: no bound (default 64)");
  command->add_flag("--json", args->json,
                    "print {text, token_ids (new tokens), logprobs, finish_reason, prompt_ids, usage, timing}");
  return [args] { return run(*args); };
}

}  // namespace kz::cli
