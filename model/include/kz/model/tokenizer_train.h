// Creating a small byte-level BPE tokenizer: learns merges from a corpus and writes them as a
// Hugging Face tokenizer.json + tokenizer_config.json (Qwen2 layout: 256 byte tokens, the merges,
// then the ChatML special tokens), loadable by Tokenizer::load, by `tokenizers` and by
// transformers' AutoTokenizer. For tests and for `kz init-model --preset tiny`; not meant for
// training production vocabularies (it is single-threaded and keeps every word in memory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz {

struct BpeTrainOptions {
  // Ids in all: 256 byte tokens + learned merges + special_tokens. At least 256 + specials.
  size_t vocab_size = 4096;
  // Merging stops early when the most frequent pair occurs fewer times than this.
  size_t min_pair_count = 2;
  // The pre-tokenizer's split regex: "qwen2" (Qwen2/2.5/3), "llama3" or "gpt2".
  std::string split_pattern = "qwen2";
  // Normalise to NFC before splitting (Qwen's tokenizer.json does; Llama 3's does not).
  bool nfc = true;
  // Added as special tokens after the merges, in this order; never split in the corpus.
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  // tokenizer_config.json roles; each must be one of special_tokens, or "" for none.
  std::string bos_token;
  std::string eos_token = "<|im_end|>";
  std::string pad_token = "<|endoftext|>";
  // The chat template's default system message ("" = none, as Qwen3).
  std::string default_system;
  size_t model_max_length = 32768;  // tokenizer_config.json's model_max_length

  // invalid_argument naming the offending field.
  Status validate() const;
};

// The two files' contents.
struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  // Writes dir/tokenizer.json and dir/tokenizer_config.json (dir is created).
  Status write(const std::filesystem::path& dir) const;
};

// Learns merges from `corpus` (each string one document) by repeatedly merging the most frequent
// adjacent pair (ties: the pair of smaller ids), deterministically.
Result<TokenizerFiles> train_byte_level_bpe(const std::vector<std::string>& corpus, const BpeTrainOptions& options);
// The same with document i counted weights[i] times, as if repeated: text that every training
// sequence carries (a prompt template) weighs as often as it occurs without being copied.
// invalid_argument unless there is one weight per document.
Result<TokenizerFiles> train_byte_level_bpe(const std::vector<std::string>& corpus, const std::vector<uint64_t>& weights,
                                            const BpeTrainOptions& options);

}  // namespace kz
