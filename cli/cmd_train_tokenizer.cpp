// `kz train-tokenizer --corpus FILE... --out DIR`: a byte-level BPE tokenizer trained on the
// teacher's corpus and the prompt templates (kz/sft/corpus_tokenizer.h), for `kz sft` to create
// models with. Torch-free.
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "kz/sft/corpus_tokenizer.h"

#ifndef KZ_DEFAULT_PROMPTS_DIR
#define KZ_DEFAULT_PROMPTS_DIR "prompts"
#endif

namespace kz::cli {

Action add_train_tokenizer_command(CLI::App& app) {
  auto options = std::make_shared<sft::CorpusTokenizerOptions>();
  options->prompts_dir = KZ_DEFAULT_PROMPTS_DIR;
  auto* command = app.add_subcommand(
      "train-tokenizer", "Train a byte-level BPE tokenizer (Hugging Face tokenizer.json) on a kz teach corpus");
  command->add_option("--corpus", options->corpora, "corpus JSONL file(s) written by kz teach")->required();
  command->add_option("--out", options->out_dir, "output dir: tokenizer.json, tokenizer_config.json")->required();
  command->add_option("--vocab-size", options->vocab_size, "ids in all: 256 bytes + merges + 3 special tokens (4096)")
      ->check(CLI::Range(259, 1 << 20));
  command->add_option("--min-pair-count", options->min_pair_count, "stop merging below this count (2)")
      ->check(CLI::PositiveNumber);
  command->add_option("--prompts-dir", options->prompts_dir,
                      "prompt templates (every *.toml below it) learned too; \"\" for none (default: prompts/)");
  return [options] {
    auto start = std::chrono::steady_clock::now();
    auto report = sft::train_corpus_tokenizer(*options);
    if (!report.ok()) return report_error(report.status());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("{}: {} ids from {} modules and {} templates ({:.1f} MB of weighted text) in {:.1f} s; "
                             "{:.2f} bytes per token on the corpus's code\n",
                             options->out_dir.string(), report->vocab_size, report->modules, report->templates,
                             report->text_bytes / 1e6, seconds, report->bytes_per_token);
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
