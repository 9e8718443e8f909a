// Random-init checkpoints for tests and benchmarks (`kz init-model`): no weights can be
// downloaded here, so KernelZero writes its own, in Hugging Face layout.
//
// A checkpoint directory gets
//   config.json              the preset's architecture (Qwen2.5-0.5B / -7B: the real shapes)
//   generation_config.json   bos / eos / pad ids (eos: <|im_end|> and <|endoftext|>, as Qwen2.5-Instruct)
//   model.safetensors        or model-0000i-of-0000n.safetensors + model.safetensors.index.json
//   tokenizer.json, tokenizer_config.json
//                            a small byte-level BPE trained on a corpus built into the program
//                            (English, Python/PyTorch and CUDA), Qwen2 split pattern, ChatML specials;
//                            or a given one (tokenizer_dir: `kz train-tokenizer`'s, for kz sft)
//
// The preset's shape may be changed (ShapeOverrides): models trained from scratch (kz sft) sit
// between the presets, with the vocabulary of their own tokenizer.
//
// The tokenizer's vocabulary (about 1,000 ids: merging stops when the corpus runs out of repeated
// pairs; 512 for `tiny`) is smaller than the config's
// vocab_size (151,936 for Qwen2.5-0.5B): the embedding rows above it are never produced by the
// tokenizer, as with Qwen's own padded tables. Token text therefore differs from real Qwen
// tokenizers; shapes, speed and memory are those of the real models.
//
// Weights: normal(0, initializer_range: 0.02, 0.5 for tiny) for matrices and embeddings, 1 for norm scales,
// 0 for biases, from a counter-based generator keyed by (seed, tensor name, block), so the result
// does not depend on the thread count. Torch-free and streaming: one shard is generated, written
// and freed before the next, so memory stays about one shard (max_shard_bytes), never the model:
// the 7B preset (15.2 GB in bf16) needs about 2 GB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/model/config.h"
#include "kz/model/tokenizer_train.h"

namespace kz::model {

// "tiny", "qwen2.5-0.5b", "qwen2.5-7b".
const std::vector<std::string>& model_preset_names();

// Changes to a preset's architecture; 0 keeps the preset's value.
struct ShapeOverrides {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t vocab_size = 0;               // at least the tokenizer's ids
  int64_t max_position_embeddings = 0;
  double initializer_range = 0;         // the weights' std
};

struct InitModelOptions {
  std::string preset = "tiny";
  fs::path out_dir;                       // created; existing checkpoint files in it are replaced
  uint64_t seed = 0;
  std::string dtype;                      // "bf16", "fp32" or "fp16"; "": the preset's (tiny fp32, others bf16)
  size_t max_shard_bytes = size_t(2) << 30;  // shard size, and so the peak memory; 0: one file
  bool weights = true;                    // false: config, generation config and tokenizer only
  int jobs = 0;                           // generator threads; 0: the machine's cores
  // "": a tokenizer trained on the built-in corpus (the preset's size); else a dir holding
  // tokenizer.json and tokenizer_config.json (kz train-tokenizer's), copied into the checkpoint.
  fs::path tokenizer_dir;
  ShapeOverrides shape;

  Status validate() const;
};

struct InitModelReport {
  ModelConfig config;
  int64_t parameters = 0;          // weights written (or that would be written)
  size_t weight_bytes = 0;
  size_t tokenizer_vocab_size = 0; // ids the tokenizer can produce (<= config.vocab_size)
  int64_t eos_token_id = -1, pad_token_id = -1, bos_token_id = -1;
  std::vector<std::string> files;  // written, relative to out_dir
};

// config.json text of a preset (with the given dtype and special-token ids filled in by
// init_model; here: the preset's defaults and Qwen's ids). invalid_argument for an unknown preset.
Result<std::string> preset_config_json(const std::string& preset);

// Writes the checkpoint; see the header comment.
Result<InitModelReport> init_model(const InitModelOptions& options);

// The corpus the init tokenizer is trained on (deterministic; a few hundred KB).
std::vector<std::string> init_tokenizer_corpus();

// The conventions of every tokenizer KernelZero makes (init-model's, kz train-tokenizer's):
// byte-level BPE with `vocab_size` ids, the Qwen2 split pattern and NFC, the ChatML special tokens,
// eos <|im_end|>, pad <|endoftext|>, and Qwen2's default system turn in the chat template.
BpeTrainOptions chatml_bpe_options(size_t vocab_size);

}  // namespace kz::model
