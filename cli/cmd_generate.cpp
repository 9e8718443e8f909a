// `kz generate --model DIR --prompt TEXT`: the raw-text continuation of a prompt by the in-process
// engine (no chat template). Text on stdout (timing on stderr), or one JSON object with --json.
// `--prompts FILE` (JSONL): every line's prompt in one engine call, batched as the engine batches
// (continuous batching up to engine.max_batch_rows); one JSON line per prompt, in order.
// Settings: configs/model.toml's [engine] and [sampling], through --config and flags.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
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
  fs::path prompts_file;
  bool json = false;
};

// One line of a --prompts file: {"prompt": TEXT, "seed": N, "max_new_tokens": N}, the last two
// optional (the flags' and config's values otherwise).
Result<model::EngineRequest> prompt_line(const std::string& line, const model::Engine& engine,
                                         const model::TextSampling& sampling, const std::string& where) {
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(fmt::format("{}: not a JSON object", where));
  if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
    return invalid_argument(fmt::format("{}: \"prompt\" must be a non-empty string", where));
  model::EngineRequest request;
  request.prompt_ids = engine.tokenizer().encode(j["prompt"].get<std::string>(), /*allow_special=*/true);
  request.sampling = sampling;
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) return invalid_argument(fmt::format("{}: \"seed\" must be an integer >= 0", where));
    request.sampling.seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("max_new_tokens")) {
    if (!j["max_new_tokens"].is_number_integer() || j["max_new_tokens"].get<int64_t>() < 1)
      return invalid_argument(fmt::format("{}: \"max_new_tokens\" must be an integer >= 1", where));
    request.sampling.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  }
  return request;
}

Result<std::vector<model::EngineRequest>> read_prompts(const fs::path& file, const model::Engine& engine,
                                                       const model::TextSampling& sampling) {
  std::ifstream in(file);
  if (!in) return not_found(fmt::format("--prompts {}: cannot be read", file.string()));
  std::vector<model::EngineRequest> requests;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto request = prompt_line(line, engine, sampling, fmt::format("{} line {}", file.string(), number));
    if (!request.ok()) return request.status();
    requests.push_back(std::move(*request));
  }
  if (requests.empty()) return invalid_argument(fmt::format("--prompts {}: no prompt in it", file.string()));
  return requests;
}

int run(const GenerateArgs& args) {
  auto options = args.settings.resolve();
  if (!options.ok()) return report_error(options.status());
  if (args.prompt.empty() == args.prompts_file.empty())
    return report_error(invalid_argument("give one of --prompt TEXT and --prompts FILE"));
  options->engine.model_dir = args.model_dir;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto engine = model::Engine::load(options->engine);
  if (!engine.ok()) return report_error(engine.status());
  model::TextSampling sampling = options->sampling;
  sampling.stop_at_eos = !options->ignore_eos;
  std::vector<model::EngineRequest> requests;
  if (args.prompts_file.empty()) {
    model::EngineRequest request;
    request.prompt_ids = (*engine)->tokenizer().encode(args.prompt, /*allow_special=*/true);
    request.sampling = sampling;
    requests.push_back(std::move(request));
  } else {
    auto read = read_prompts(args.prompts_file, **engine, sampling);
    if (!read.ok()) return report_error(read.status());
    requests = std::move(*read);
  }
  auto t1 = Clock::now();
  auto results = (*engine)->generate(requests);
  auto t2 = Clock::now();
  double load_s = std::chrono::duration<double>(t1 - t0).count();
  double gen_s = std::chrono::duration<double>(t2 - t1).count();
  size_t new_tokens = 0, prompt_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok())
      return report_error(results.size() == 1 ? results[i].status()
                                              : results[i].status().with_context(fmt::format("prompt {}", i + 1)));
    new_tokens += results[i]->token_ids.size();
    prompt_tokens += results[i]->prompt_tokens;
  }
  double tokens_per_s = gen_s > 0 ? static_cast<double>(new_tokens) / gen_s : 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const model::EngineCompletion& c = *results[i];
    if (args.json) {
      // generate_s and tokens_per_s are the whole call's (every prompt's tokens over its time).
      nlohmann::json out = {{"text", c.text},
                            {"token_ids", c.token_ids},
                            {"logprobs", c.logprobs},
                            {"finish_reason", c.finish_reason},
                            {"prompt_ids", requests[i].prompt_ids},
                            {"prompt_tokens", c.prompt_tokens},
                            {"completion_tokens", c.token_ids.size()},
                            {"model", args.model_dir.string()},
                            {"device", (*engine)->device()},
                            {"dtype", (*engine)->dtype()},
                            {"seed", requests[i].sampling.seed},
                            {"load_s", load_s},
                            {"generate_s", gen_s},
                            {"tokens_per_s", tokens_per_s}};
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << c.text << "\n";
    }
  }
  std::string finish = results.size() == 1 ? fmt::format(" ({})", results[0]->finish_reason)
                                           : fmt::format(" in {} completions", results.size());
  if (!args.json || results.size() > 1)
    std::cerr << fmt::format("kz: {} prompt + {} new tokens{} in {:.2f} s, {:.1f} tokens/s; load {:.2f} s ({})\n",
                             prompt_tokens, new_tokens, finish, gen_s, tokens_per_s, load_s, (*engine)->describe());
  return kExitOk;
}

}  // namespace

Action add_generate_command(CLI::App& app) {
  auto* command = app.add_subcommand("generate", "Continue a prompt with a local checkpoint (raw text, no chat template)");
  auto args = std::make_shared<GenerateArgs>(*command);
  command->add_option("--model", args->model_dir, "checkpoint directory (Hugging Face layout)")->required();
  command->add_option("--prompt", args->prompt, "the text to continue");
  command->add_option("--prompts", args->prompts_file,
                      "JSONL file, a line per prompt: {\"prompt\": TEXT, \"seed\": N, \"max_new_tokens\": N} (the "
                      "last two optional), all in one batched engine call; one output line per prompt");
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
