// SftConfig <-> TOML: one table of keys with their ranges (sft_config.h).
#include "kz/sft/sft_config.h"

#include <fmt/format.h>

#include <set>

namespace kz::sft {

ConfigTable sft_config_table(SftConfig& c) {
  ModelSection& m = c.model;
  DataSection& d = c.data;
  TrainSection& t = c.train;
  return {
      {"model.init", m.init},
      {"model.tokenizer", m.tokenizer},
      {"model.hidden_size", ConfigField(m.hidden_size).at_least(0)},
      {"model.intermediate_size", ConfigField(m.intermediate_size).at_least(0)},
      {"model.num_hidden_layers", ConfigField(m.num_hidden_layers).at_least(0)},
      {"model.num_attention_heads", ConfigField(m.num_attention_heads).at_least(0)},
      {"model.num_key_value_heads", ConfigField(m.num_key_value_heads).at_least(0)},
      {"model.vocab_size", ConfigField(m.vocab_size).at_least(0)},
      {"model.max_position_embeddings", ConfigField(m.max_position_embeddings).at_least(0)},
      {"model.initializer_range", ConfigField(m.initializer_range).at_least(0)},
      {"model.seed", m.seed},
      {"model.device", ConfigField(m.device).matching("cpu|cuda(:[0-9]+)?", "cpu, cuda or cuda:N")},
      {"model.dtype", ConfigField(m.dtype).matching("|fp32|bf16|fp16", "fp32, bf16, fp16 or \"\" (the model's)")},
      {"data.corpus", d.corpus},
      {"data.role", ConfigField(d.role).matching("coder|proposer", "coder or proposer")},
      {"data.prompts_dir", d.prompts_dir},
      {"data.formats", d.formats},
      {"data.unfused_share", ConfigField(d.unfused_share).at_least(0).at_most(1)},
      {"data.candidates_per_module", ConfigField(d.candidates_per_module).at_least(1)},
      {"data.accept_unchecked", d.accept_unchecked},
      {"data.eval_split", ConfigField(d.eval_split).matching("heldout|fraction|none", "heldout, fraction or none")},
      {"data.eval_fraction", ConfigField(d.eval_fraction).at_least(0).at_most(1)},
      {"data.eval_max_examples", ConfigField(d.eval_max_examples).at_least(1)},
      {"data.max_seq_len", ConfigField(d.max_seq_len).at_least(2)},
      {"train.epochs", ConfigField(t.epochs).at_least(0)},
      {"train.steps", ConfigField(t.steps).at_least(0)},
      {"train.lr", ConfigField(t.lr).above(0)},
      {"train.min_lr_ratio", ConfigField(t.min_lr_ratio).at_least(0).at_most(1)},
      {"train.warmup_steps", ConfigField(t.warmup_steps).at_least(0)},
      {"train.beta1", ConfigField(t.beta1).at_least(0).at_most(1)},
      {"train.beta2", ConfigField(t.beta2).at_least(0).at_most(1)},
      {"train.weight_decay", ConfigField(t.weight_decay).at_least(0)},
      {"train.max_grad_norm", ConfigField(t.max_grad_norm).at_least(0)},
      {"train.batch_tokens", ConfigField(t.batch_tokens).at_least(1)},
      {"train.micro_batch_tokens", ConfigField(t.micro_batch_tokens).at_least(1)},
      {"train.packing", t.packing},
      {"train.activation_checkpointing", t.activation_checkpointing},
      {"train.fp32_master_weights", t.fp32_master_weights},
      {"train.seed", t.seed},
      {"train.log_every", ConfigField(t.log_every).at_least(1)},
      {"train.eval_every", ConfigField(t.eval_every).at_least(0)},
      {"train.checkpoint_every", ConfigField(t.checkpoint_every).at_least(0)},
      {"train.checkpoint_keep", ConfigField(t.checkpoint_keep).at_least(1)},
      {"output.dir", c.output_dir},
  };
}

Status SftConfig::validate() const {
  if (data.corpus.empty()) return invalid_argument("[data] corpus: give at least one JSONL file");
  std::set<std::string> known = {"triton", "cuda-rtc", "cuda"};
  for (const std::string& f : data.formats)
    if (!known.count(f))
      return invalid_argument(fmt::format("[data] formats: \"{}\" is not triton, cuda-rtc or cuda", f));
  if (train.steps == 0 && train.epochs == 0) return invalid_argument("[train]: give steps > 0 or epochs > 0");
  if (train.steps > 0 && train.warmup_steps >= train.steps)
    return invalid_argument(
        fmt::format("[train] warmup_steps {} must be below steps {}", train.warmup_steps, train.steps));
  return Status::ok();
}

ExampleOptions SftConfig::example_options(const fs::path& default_prompts_dir) const {
  ExampleOptions o;
  o.role = data.role == "proposer" ? Role::proposer : Role::coder;
  o.prompts_dir = data.prompts_dir.empty() ? default_prompts_dir : data.prompts_dir;
  o.formats = data.formats;
  o.unfused_share = data.unfused_share;
  o.candidates_per_module = data.candidates_per_module;
  o.accept_unchecked = data.accept_unchecked;
  o.max_seq_len = static_cast<size_t>(data.max_seq_len);
  o.seed = train.seed;
  return o;
}

BatchOptions SftConfig::batch_options() const {
  BatchOptions b;
  b.batch_tokens = static_cast<size_t>(train.batch_tokens);
  b.micro_batch_tokens = static_cast<size_t>(train.micro_batch_tokens);
  b.packing = train.packing;
  b.row_tokens = static_cast<size_t>(data.max_seq_len);
  return b;
}

Result<SftConfig> load_sft_config(const fs::path& path) {
  SftConfig config;
  KZ_RETURN_IF_ERROR(apply_config_file(path, sft_config_table(config)));
  KZ_RETURN_IF_ERROR(config.validate().with_context(path.string()));
  return config;
}

std::string sft_config_to_toml(SftConfig config) { return config_to_toml(sft_config_table(config)); }

}  // namespace kz::sft
