// EvolveConfig <-> TOML: one table of keys with their ranges (evolve_config.h).
#include "kz/loop/evolve_config.h"

#include <fmt/format.h>

namespace kz::loop {
namespace {

// A role's keys: its own, then `extra` (the phase's keys under the same [section]), then its
// sub-tables ([s.lora], [s.train], [s.update]): TOML cannot reopen [s] after them.
void add_role(ConfigTable& t, const std::string& s, RoleConfig& role, const ConfigTable& extra) {
  PolicyOptions& p = role.policy;
  auto key = [&](const char* name) { return s + "." + name; };
  t.push_back({key("model_dir"), p.model_dir});
  t.push_back({key("endpoint"), p.endpoint});
  t.push_back({key("endpoint_model"), p.endpoint_model});
  t.push_back({key("device"), ConfigField(p.device).matching("cpu|cuda(:[0-9]+)?", "cpu, cuda or cuda:N")});
  t.push_back({key("dtype"), ConfigField(p.dtype).matching("|fp32|bf16|fp16", "fp32, bf16, fp16 or \"\" (the checkpoint's)")});
  t.push_back({key("max_batch"), ConfigField(p.max_batch).at_least(1)});
  t.push_back({key("trainable"), p.trainable});
  t.push_back({key("temperature"), ConfigField(role.temperature).at_least(0)});
  t.push_back({key("top_p"), ConfigField(role.top_p).above(0).at_most(1)});
  t.push_back({key("max_tokens"), ConfigField(role.max_tokens).at_least(1)});
  t.insert(t.end(), extra.begin(), extra.end());
  t.push_back({key("lora.enabled"), p.lora});
  t.push_back({key("lora.r"), ConfigField(p.lora_options.r).at_least(1)});
  t.push_back({key("lora.alpha"), ConfigField(p.lora_options.alpha).above(0)});
  t.push_back({key("lora.dropout"), ConfigField(p.lora_options.dropout).at_least(0).at_most(1)});
  t.push_back({key("lora.target_modules"), p.lora_options.target_modules});
  t.push_back({key("train.lr"), ConfigField(p.train.lr).above(0)});
  t.push_back({key("train.beta1"), ConfigField(p.train.beta1).at_least(0).at_most(1)});
  t.push_back({key("train.beta2"), ConfigField(p.train.beta2).at_least(0).at_most(1)});
  t.push_back({key("train.weight_decay"), ConfigField(p.train.weight_decay).at_least(0)});
  t.push_back({key("train.schedule"), ConfigField(role.lr_schedule).matching("constant|warmup_cosine",
                                                                           "constant or warmup_cosine")});
  t.push_back({key("train.warmup_steps"), ConfigField(p.train.warmup_steps).at_least(0)});
  t.push_back({key("train.total_steps"), ConfigField(p.train.total_steps).at_least(0)});
  t.push_back({key("train.min_lr_ratio"), ConfigField(p.train.min_lr_ratio).at_least(0).at_most(1)});
  t.push_back({key("train.max_grad_norm"), ConfigField(p.train.max_grad_norm).at_least(0)});
  t.push_back({key("train.activation_checkpointing"), p.train.activation_checkpointing});
  t.push_back({key("train.fp32_master_weights"), p.train.fp32_master_weights});
  t.push_back({key("update.mini_batch_size"), ConfigField(p.update.mini_batch_size).at_least(1)});
  t.push_back({key("update.micro_batch_size"), ConfigField(p.update.micro_batch_size).at_least(1)});
  t.push_back({key("update.epochs"), ConfigField(p.update.epochs).at_least(1)});
  t.push_back({key("update.reduction"), ConfigField(p.update.reduction).matching(
                                            "token_mean|seq_mean_token_sum|sequence_mean",
                                            "token_mean, seq_mean_token_sum or sequence_mean")});
  t.push_back({key("update.clip_low"), ConfigField(p.update.loss.clip_low).at_least(0).at_most(1)});
  t.push_back({key("update.clip_high"), ConfigField(p.update.loss.clip_high).at_least(0)});
  t.push_back({key("update.kl_coef"), ConfigField(p.update.loss.kl_coef).at_least(0)});
}

}  // namespace

ConfigTable evolve_config_table(EvolveConfig& c) {
  ConfigTable t = {
      {"run.seed", c.seed},
      {"run.iterations", ConfigField(c.iterations).at_least(1)},
      {"run.max_evaluations", ConfigField(c.max_evaluations).at_least(0)},
      {"run.heldout_every", ConfigField(c.heldout_every).at_least(1)},
      {"run.checkpoint_keep", ConfigField(c.checkpoint_keep).at_least(1)},
      {"run.format", ConfigField(c.format).matching("triton|cuda-rtc|cuda", "triton, cuda-rtc or cuda")},
      {"run.prompts_dir", c.prompts_dir},
      {"run.catalogue", c.catalogue},
      {"run.apis", c.apis},
      {"run.shared_policy", c.shared_policy},
      {"heldout.suite", c.heldout_suite},
      {"heldout.tasks", ConfigField(c.heldout_tasks).at_least(0)},
      {"heldout.samples", ConfigField(c.heldout_samples).at_least(1)},
      {"heldout.temperature", ConfigField(c.heldout_temperature).at_least(0)},
      {"heldout.at_start", c.heldout_at_start},
  };
  add_role(t, "proposer", c.proposer,
           {{"proposer.api_sets", ConfigField(c.api_sets).at_least(1)},
            {"proposer.modules_per_set", ConfigField(c.modules_per_set).at_least(1)},
            {"proposer.level", ConfigField(c.level).at_least(1).at_most(3)},
            {"proposer.judge_attempts", ConfigField(c.judge_attempts).at_least(1)},
            {"proposer.dedup_threshold", ConfigField(c.dedup_threshold).above(0).at_most(1)}});
  ConfigTable curriculum = {
      {"proposer_reward.similarity_threshold", ConfigField(c.proposer_reward.similarity_threshold).above(0).at_most(1)},
      {"proposer_reward.repetition_weight", ConfigField(c.proposer_reward.repetition_weight).at_least(0)},
      {"api_sampler.min_set_size", ConfigField(c.api_sampler.min_set_size).at_least(1)},
      {"api_sampler.max_set_size", ConfigField(c.api_sampler.max_set_size).at_least(1)},
      {"api_sampler.weakness_weight", ConfigField(c.api_sampler.weakness_weight).at_least(0)},
      {"api_sampler.exploration_share", ConfigField(c.api_sampler.exploration_share).at_least(0).at_most(1)},
      {"api_stats.prior_alpha", ConfigField(c.api_stats.prior_alpha).above(0)},
      {"api_stats.prior_beta", ConfigField(c.api_stats.prior_beta).above(0)},
      {"frontier.band_low", ConfigField(c.frontier.band_low).at_least(0).at_most(1)},
      {"frontier.band_high", ConfigField(c.frontier.band_high).at_least(0).at_most(1)},
      {"frontier.capacity", ConfigField(c.frontier.capacity).at_least(1)},
      {"frontier.max_age", ConfigField(c.frontier.max_age).at_least(0)},
      {"frontier.replay_share", ConfigField(c.frontier.replay_share).at_least(0).at_most(1)},
      {"frontier.leak_threshold", ConfigField(c.frontier.leak_threshold).above(0).at_most(1)},
  };
  t.insert(t.end(), curriculum.begin(), curriculum.end());
  add_role(t, "coder", c.coder,
           {{"coder.tasks_per_iteration", ConfigField(c.tasks_per_iteration).at_least(1)},
            {"coder.curriculum", ConfigField(c.curriculum).matching("frontier|static", "frontier or static")},
            {"coder.static_suite", c.static_suite},
            {"coder.group_size", ConfigField(c.group_size).at_least(1)},
            {"coder.generation_batch", ConfigField(c.generation_batch).at_least(0)}});
  ConfigTable coder = {
      {"reward.mode", ConfigField(c.reward_mode).matching("ca_grpo|ungated|correctness_only",
                                                          "ca_grpo, ungated or correctness_only")},
      {"reward.lambda_perf", ConfigField(c.reward.lambda_perf).at_least(0)},
      {"reward.perf_clip", ConfigField(c.reward.perf_clip).above(0)},
      {"reward.gate_tau", ConfigField(c.reward.gate_tau).at_least(0).at_most(1)},
      {"reward.gate_ema", ConfigField(c.reward.gate_ema).at_least(0).at_most(1)},
      {"reward.penalty_cheat", ConfigField(c.reward.penalty_cheat).at_most(0)},
      {"reward.penalty_format", ConfigField(c.reward.penalty_format).at_most(0)},
      {"reward.epsilon", ConfigField(c.reward.epsilon).above(0)},
      {"reward.scale_by_std", c.reward.scale_by_std},
      {"eval.config", c.eval_config},
      {"eval.device", ConfigField(c.eval_device).matching("cpu|cuda(:[0-9]+)?", "cpu, cuda or cuda:N")},
      {"eval.jobs", ConfigField(c.eval_jobs).at_least(0)},
      {"eval.url", c.eval_url},
  };
  t.insert(t.end(), coder.begin(), coder.end());
  return t;
}

Status EvolveConfig::validate() const {
  auto role = [](const RoleConfig& r) -> Status {
    if (r.policy.model_dir.empty() == r.policy.endpoint.empty())
      return invalid_argument(fmt::format("[{}]: give exactly one of model_dir (an in-process engine) and endpoint "
                                          "(an OpenAI-compatible URL)", r.policy.name));
    return r.policy.validate();
  };
  // The update trains softmax(logits / temperature), the distribution a role samples from; top-p's
  // truncation it cannot follow, nor greedy decoding. With shared_policy the Coder's samples train
  // the [proposer] model too, at one temperature.
  auto on_policy = [](const RoleConfig& r, bool trainable) -> Status {
    if (!trainable || (r.temperature > 0 && r.top_p == 1.0)) return Status::ok();
    return invalid_argument(fmt::format(
        "[{}]: a trainable role samples with top_p 1 and a temperature above 0 (here top_p {:g}, temperature "
        "{:g}): the update trains softmax(logits / temperature), and samples cut by top-p or drawn greedily "
        "would be off-policy; set top_p = 1 and temperature > 0, or trainable = false",
        r.policy.name, r.top_p, r.temperature));
  };
  KZ_RETURN_IF_ERROR(role(proposer));
  if (!shared_policy) KZ_RETURN_IF_ERROR(role(coder));
  KZ_RETURN_IF_ERROR(on_policy(proposer, proposer.policy.trainable));
  KZ_RETURN_IF_ERROR(on_policy(coder, shared_policy ? proposer.policy.trainable : coder.policy.trainable));
  if (shared_policy && proposer.policy.trainable && proposer.temperature != coder.temperature)
    return invalid_argument(fmt::format("[run] shared_policy trains one model on both roles' samples: [proposer] "
                                        "and [coder] temperature must be equal (here {:g} and {:g})",
                                        proposer.temperature, coder.temperature));
  if (api_sampler.min_set_size > api_sampler.max_set_size)
    return invalid_argument("[api_sampler]: min_set_size is above max_set_size");
  if (frontier.band_low > frontier.band_high) return invalid_argument("[frontier]: band_low is above band_high");
  if ((curriculum == "static") == static_suite.empty())
    return invalid_argument("[coder]: static_suite is the fixed task set of curriculum = \"static\", and only of it");
  KZ_RETURN_IF_ERROR(reward.validate());
  KZ_RETURN_IF_ERROR(proposer_reward.validate());
  KZ_RETURN_IF_ERROR(api_sampler.validate());
  KZ_RETURN_IF_ERROR(api_stats.validate());
  return frontier.validate();
}

Result<EvolveConfig> load_evolve_config(const fs::path& path, const std::vector<std::string>& overrides) {
  EvolveConfig config;
  ConfigTable table = evolve_config_table(config);
  KZ_RETURN_IF_ERROR(apply_config_file(path, table));
  for (const auto& assignment : overrides) KZ_RETURN_IF_ERROR(apply_config_override(assignment, table));
  config.proposer.policy.name = "proposer";
  config.coder.policy.name = "coder";
  for (RoleConfig* role : {&config.proposer, &config.coder})
    role->policy.train.schedule =
        role->lr_schedule == "warmup_cosine" ? model::LrSchedule::warmup_cosine : model::LrSchedule::constant;
  auto mode = rl::parse_reward_mode(config.reward_mode);
  if (!mode.ok()) return mode.status().with_context(path.string());
  config.reward.mode = *mode;
  config.frontier.seed = config.seed + 101;
  config.api_sampler.seed = config.seed + 202;
  if (auto status = config.validate(); !status.is_ok()) return status.with_context(path.string());
  return config;
}

std::string evolve_config_to_toml(const EvolveConfig& config) {
  EvolveConfig copy = config;  // the table holds non-const references
  return config_to_toml(evolve_config_table(copy));
}

}  // namespace kz::loop
