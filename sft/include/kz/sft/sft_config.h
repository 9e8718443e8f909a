// `kz sft`'s configuration: one struct per TOML section, defaults in code, every key listed in
// sft_config_table (configs/sft-*.toml write each one). Unknown keys, wrong types and values out
// of range are errors naming the file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/core/config_fields.h"
#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/sft/batches.h"
#include "kz/sft/examples.h"

namespace kz::sft {

// [model]: what trains.
struct ModelSection {
  // A preset of `kz init-model` ("tiny", "qwen2.5-0.5b", "qwen2.5-7b") created fresh with
  // `tokenizer`, or a Hugging Face checkpoint dir (config.json, safetensors, tokenizer.json),
  // which keeps its own tokenizer: real weights start here.
  std::string init = "tiny";
  fs::path tokenizer;  // preset: a dir with tokenizer.json + tokenizer_config.json (kz train-tokenizer)
  // Preset shape changes (0: the preset's). vocab_size 0: the tokenizer's ids rounded up to a
  // multiple of 64. A checkpoint's shape is its own: these must stay 0 then.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double initializer_range = 0;  // std of the random weights; 0: the preset's (tiny's 0.5 is for tests: use 0.02)
  uint64_t seed = 0;             // the random weights
  std::string device = "cpu";    // "cpu", "cuda", "cuda:N"
  std::string dtype;             // "": the preset's or checkpoint's; "fp32", "bf16", "fp16"
};

// [data]: the corpus and the pairs made of it (ExampleOptions, split_modules).
struct DataSection {
  std::vector<std::string> corpus;  // JSONL files written by kz teach
  std::string role = "coder";       // "coder" or "proposer"
  fs::path prompts_dir;             // "": the source tree's prompts/ (kz evolve's run.prompts_dir)
  std::vector<std::string> formats = {"triton"};
  double unfused_share = 0.9;
  int candidates_per_module = 1;
  bool accept_unchecked = false;
  std::string eval_split = "heldout";  // "heldout", "fraction" or "none"
  double eval_fraction = 0.05;
  int64_t eval_max_examples = 256;     // the evaluation loss uses at most this many pairs (the first)
  int64_t max_seq_len = 2048;
};

// [train]: the optimiser and the schedule (warm-up then cosine to min_lr_ratio * lr).
struct TrainSection {
  int64_t epochs = 1;           // used when steps = 0
  int64_t steps = 0;            // optimiser steps in all; 0: every step of `epochs` epochs
  double lr = 3e-4;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 10;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;
  int64_t batch_tokens = 16384;
  int64_t micro_batch_tokens = 8192;
  bool packing = false;
  bool activation_checkpointing = false;
  bool fp32_master_weights = true;  // model/train.h: false keeps bf16 state only, rounded stochastically
  uint64_t seed = 0;            // the example order
  int64_t log_every = 10;       // steps between metrics rows (and progress lines off a terminal)
  int64_t eval_every = 100;     // steps between evaluations (also before the first and after the last); 0: only those
  int64_t checkpoint_every = 100;  // steps between checkpoints (and after the last); 0: only the last
  int64_t checkpoint_keep = 2;
};

struct SftConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  fs::path output_dir;  // [output] dir

  // Checks what one key cannot: exactly one of init's kinds, formats known, steps vs warm-up.
  Status validate() const;
  ExampleOptions example_options(const fs::path& default_prompts_dir) const;
  BatchOptions batch_options() const;
};

// "section.key" -> field, in the order configs/sft-*.toml list them.
ConfigTable sft_config_table(SftConfig& config);
// Defaults <- the file; validated.
Result<SftConfig> load_sft_config(const fs::path& path);
// Every key with its value (the run dir's config.toml).
std::string sft_config_to_toml(SftConfig config);

}  // namespace kz::sft
