// A byte-level BPE tokenizer trained on the teacher's corpus (`kz train-tokenizer`), with the
// conventions of every tokenizer KernelZero makes (model::chatml_bpe_options: the Qwen2 split
// pattern, ChatML special tokens, eos <|im_end|>, pad <|endoftext|>), written as Hugging Face
// tokenizer.json + tokenizer_config.json.
//
// What it learns from: every module's reference and every candidate's source, and the text of
// the prompt templates (every *.toml under prompts_dir, its subfolders too) with the ChatML
// scaffolding around the turns. A template's text is counted once per module, as often as a
// prompt carries it in training, so prompts tokenise compactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::sft {

struct CorpusTokenizerOptions {
  std::vector<fs::path> corpora;  // JSONL files (corpus.h)
  fs::path prompts_dir;           // templates whose text is learned too; "": none
  size_t vocab_size = 4096;       // ids in all (256 bytes + merges + 3 special tokens)
  size_t min_pair_count = 2;      // merging stops below this count
  fs::path out_dir;               // tokenizer.json, tokenizer_config.json
  Status validate() const;
};

struct CorpusTokenizerReport {
  size_t modules = 0, templates = 0;
  size_t text_bytes = 0;         // bytes learned from (template text counted as often as it is weighted)
  size_t vocab_size = 0;         // ids of the tokenizer written (merging may stop below the target)
  double bytes_per_token = 0;    // on the corpus's references and sources
};

Result<CorpusTokenizerReport> train_corpus_tokenizer(const CorpusTokenizerOptions& options);

}  // namespace kz::sft
