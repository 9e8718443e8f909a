// A role's model in the co-evolution loop (the Proposer's or the Coder's): what generates its
// samples and, when trainable, what learns from them.
//
//   trainable  an in-process engine on a Hugging Face checkpoint dir (kz/model/engine.h), trained
//              in place by the CA-GRPO policy update (kz/rl/policy_update.h): full fine-tuning or
//              LoRA adapters. Its completions carry the token ids and the sampling log-probs the
//              update needs (llm Completion::token_ids, prompt_token_ids, logprobs).
//   frozen     the same engine without a trainer, or any OpenAI-compatible endpoint through the
//              HTTP Generator (kz/llm/http_generator.h).
//
// One Policy may serve both roles (the loop then holds one object and trains it in both phases).
//
// Checkpoints: save(dir) writes everything the policy needs to continue as it was: for a
// trainable policy the weights (full: a Hugging Face checkpoint; LoRA: a PEFT adapter dir under
// dir/adapter) and the trainer's optimiser state (Trainer::save_state); a frozen policy writes
// only policy.json. restore(dir) reads them back into a policy opened with the same options;
// every missing or mismatched file is an error naming it, and the policy is unchanged then.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/llm/generator.h"
#include "kz/model/lora.h"
#include "kz/model/train.h"
#include "kz/rl/policy_update.h"

namespace kz::dist {
class ProcessGroup;
}

namespace kz::loop {

struct PolicyOptions {
  std::string name;             // "proposer" / "coder": in messages and checkpoint paths
  // Exactly one of the two: a checkpoint dir for the in-process engine, or an endpoint URL
  // (http://host:port/v1) with endpoint_model the served model's name.
  fs::path model_dir;
  std::string endpoint;
  std::string endpoint_model;
  std::string device = "cpu";   // engine only: "cpu", "cuda", "cuda:N"
  std::string dtype;            // engine only: "" (the checkpoint's), "fp32", "bf16", "fp16"
  int max_batch = 64;           // engine only: completions decoded together
  bool trainable = false;       // engine only
  bool lora = false;            // trainable: train LoRA adapters instead of every weight
  model::LoraOptions lora_options;
  model::TrainOptions train;
  rl::PolicyUpdateOptions update;  // pad_token_id is set from the engine
  // kl_coef > 0 (update.loss.kl_coef): a frozen copy of the starting weights scores every
  // rollout (reference_logprobs) for the KL penalty.
  Status validate() const;
};

// One sampled completion as the update needs it: prompt and completion token ids and the
// log-prob of each completion token under the policy that sampled it.
struct TokenSample {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> completion_ids;
  std::vector<float> logprobs;
};

class Policy {
 public:
  // Loads the engine (or connects the endpoint lazily), attaches LoRA and creates the trainer
  // when trainable. Errors name the role and the checkpoint or URL.
  static Result<std::unique_ptr<Policy>> open(const PolicyOptions& options);
  ~Policy();

  // Chat in, completions out (llm's interface). For an engine, each completion carries
  // token_ids, prompt_token_ids and (when params.logprobs) one log-prob per token.
  Generator& generator();

  bool trainable() const;
  // The token form of a completion this policy's generator returned with logprobs: nullopt when
  // it carries none (an endpoint, or an empty completion).
  static std::optional<TokenSample> token_sample(const Completion& completion);

  // Whether an update over `rollouts` would move the weights: a trainable policy, and some
  // rollout with a nonzero advantage, or a KL penalty (kl_coef > 0), which pulls toward the
  // reference even when every advantage is zero, as verl's loss does.
  bool learns_from(const std::vector<rl::Rollout>& rollouts) const;

  // One CA-GRPO update over `rollouts` (kz/rl/policy_update.h); with kl_coef > 0 their
  // ref_logprobs are filled here first. invalid_argument for a frozen policy. It trains the very
  // model generator() decodes with, so it must not run while a generate() call does (nor may
  // save or restore).
  Result<rl::PolicyUpdateStats> update(std::vector<rl::Rollout> rollouts);

  // Optimiser steps taken so far (0 for a frozen policy): the model version in provenance.
  int64_t steps() const;
  // "engine:<dir> (cpu, float32), lora r=16" / "openai:<url>:<model>", for logs and provenance.
  std::string describe() const;

  Status save(const fs::path& dir) const;
  Status restore(const fs::path& dir);

  // Data parallel over `group`'s ranks (dist/data_parallel.h): rank 0's weights copied into every
  // rank, the gradients averaged in buckets during backward, and each update's mini-batches dealt
  // out among the ranks (rl/policy_update.h). Every rank then takes the same steps. A frozen
  // policy or a world of one: nothing.
  Status make_data_parallel(std::shared_ptr<dist::ProcessGroup> group);

  const PolicyOptions& options() const { return options_; }

  struct Impl;

 private:
  Policy(PolicyOptions options, std::unique_ptr<Impl> impl);
  PolicyOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz::loop
