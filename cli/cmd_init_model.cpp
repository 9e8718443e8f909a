// `kz init-model --preset tiny|qwen2.5-0.5b|qwen2.5-7b --out DIR`: a random-init checkpoint with a
// tokenizer, in Hugging Face layout (kz/model/init_model.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "kz/model/init_model.h"

namespace kz::cli {
namespace {

int run(const model::InitModelOptions& options) {
  auto start = std::chrono::steady_clock::now();
  auto report = model::init_model(options);
  if (!report.ok()) return report_error(report.status());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& c = report->config;
  std::cout << fmt::format(
      "{}: preset {} ({} layers, hidden {}, {} heads / {} kv, vocab {}), {:.1f}M parameters{} in {:.1f} s\n",
      options.out_dir.string(), options.preset, c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
      c.num_key_value_heads, c.vocab_size, report->parameters / 1e6,
      options.weights ? fmt::format(" ({:.2f} GB, {})", report->weight_bytes / 1e9, weight_dtype_name(c.dtype))
                      : std::string(" (config only, no weights)"),
      seconds);
  std::cout << fmt::format("tokenizer: {} ids (the config's vocab_size is {}; rows above are never produced), "
                           "eos {} pad {}\n",
                           report->tokenizer_vocab_size, c.vocab_size, report->eos_token_id, report->pad_token_id);
  std::cout << fmt::format("files: {}\n", fmt::join(report->files, ", "));
  return kExitOk;
}

}  // namespace

Action add_init_model_command(CLI::App& app) {
  auto options = std::make_shared<model::InitModelOptions>();
  auto* command = app.add_subcommand(
      "init-model", "Write a random-init checkpoint with a tokenizer (Hugging Face layout) for tests and benchmarks");
  command->add_option("--preset", options->preset, "tiny, qwen2.5-0.5b or qwen2.5-7b")
      ->required()
      ->check(CLI::IsMember(model::model_preset_names()));
  command->add_option("--out", options->out_dir, "output directory (created; earlier weights in it are replaced)")
      ->required();
  command->add_option("--seed", options->seed, "random seed of the weights (default 0)");
  command->add_option("--dtype", options->dtype, "bf16 or fp32 (default: fp32 for tiny, bf16 otherwise)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  command->add_option("--max-shard-gb", [options](const CLI::results_t& r) {
        options->max_shard_bytes = static_cast<size_t>(std::stod(r[0]) * 1e9);
        return true;
      }, "largest safetensors shard in GB, and so the peak memory (default 2.1)");
  command->add_flag("--config-only", [options](int64_t) { options->weights = false; },
                    "write config.json, generation_config.json and the tokenizer, no weights");
  command->add_option("--jobs", options->jobs, "threads generating weights (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  return [options] { return run(*options); };
}

}  // namespace kz::cli
