// The policy update of GRPO / CA-GRPO over one batch of sampled completions: the completions'
// advantages are given (group normalisation and CA-GRPO's gate belong to the caller), the
// sampling policy's log-probs were recorded at sampling time, and the model trains on the
// clipped token loss of kz/model/train.h through a Trainer (full fine-tuning or LoRA).
//
//   auto trainer = *model::Trainer::create(model, train_options);
//   PolicyUpdate update(*trainer, options);
//   auto stats = update.run(rollouts);   // epochs x mini-batches optimiser steps
//
// run(): for each epoch the rollouts are shuffled (seeded: shuffle_seed, the trainer's step count
// when run() starts and the epoch, so a resumed run shuffles as the uninterrupted one would) and
// cut into mini-batches of mini_batch_size sequences (the last may be smaller). A group
// (Rollout::group: the completions of one prompt) is shuffled as one unit and never split: a
// mini-batch takes whole groups while they fit, a group larger than mini_batch_size is a
// mini-batch of its own. Why: the group's mean is its baseline, and it only works inside one
// gradient: the completions share most of their tokens and their advantages sum to zero, so in
// one step the shared tokens' terms cancel and the step follows what tells the completions apart;
// split across steps, each part pushes the shared tokens up or down and Adam carries that on
// (rl/tests/policy_update_test.cpp measures it; verl keeps groups whole too). Each mini-batch is
// one optimiser step, its forward/backward done micro_batch_size sequences at a time with the
// gradients accumulated. The ratio is always against the recorded old_logprobs: the first step of
// the first epoch sees ratio 1 (up to the numerics of sampling versus teacher forcing), later
// steps the policy's drift, which the clip bounds.
//
// A micro-batch is prompt + completion per row, right-padded; the loss mask is the completion's
// targets only (the prompt is never trained), and each row's advantage applies to all its tokens.
//
// Zero advantages: with kl_coef = 0 a sequence whose advantage is 0 has zero loss and zero
// gradient. With skip_zero_advantage (default on) such sequences get no forward/backward, but
// they stay in the step's normaliser (token_mean: their completion tokens; seq_mean_token_sum:
// the sequence), so the gradient, and so the update, is exactly the one with them in. A
// mini-batch where every sequence has advantage 0 runs in full (the optimiser then sees defined
// zero gradients, as without skipping). Statistics (clip_fraction, approx_kl, entropy) cover the
// sequences that ran; `tokens` counts every trained token, skipped ones included.
//
// Data parallel (set_process_group, over a trainer made data parallel by dist/data_parallel.h):
// every rank runs with the same rollouts in the same order, so the shuffle and the mini-batches
// are the ones a single process takes. Each mini-batch's rows that run are dealt out among the
// ranks in turn (a rank may get none and still takes part in the gradient sync), and the loss is
// normalised by the whole mini-batch's denominator divided by the world size: the averaged
// gradient is the whole mini-batch's, so W ranks take the single process's steps up to float
// summation order (rl/tests/policy_update_dp_test.cpp). The statistics are summed over the ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/model/train.h"

namespace kz::dist {
class ProcessGroup;
}

namespace kz::rl {

// One sampled completion of a prompt.
struct Rollout {
  std::vector<int64_t> prompt_ids;      // not empty
  std::vector<int64_t> completion_ids;  // not empty
  std::vector<float> old_logprobs;      // per completion token, recorded at sampling time
  double advantage = 0;                 // the same for every completion token
  // Only when loss.kl_coef > 0: the reference model's log-probs, one per completion token.
  std::vector<float> ref_logprobs;
  int64_t group = -1;  // rollouts with the same id >= 0 share a mini-batch (see above); -1: alone
};

// The update's defaults: clipped_policy with DAPO's asymmetric clip (0.2, 0.28), no KL.
model::LossOptions default_policy_loss();

struct PolicyUpdateOptions {
  int mini_batch_size = 8;     // sequences per optimiser step (whole groups: see above)
  int epochs = 1;              // passes over the rollouts
  int micro_batch_size = 4;    // sequences per forward/backward (gradient accumulation)
  model::LossOptions loss = default_policy_loss();  // kind clipped_policy or policy_gradient
  // The loss reduction by name (model::parse_loss_reduction): "token_mean" (every completion
  // token of the step weighs the same) or "seq_mean_token_sum" (each sequence's token-loss sum,
  // averaged over the step's sequences; verl's name); "sequence_mean" and "sum" work too. It
  // replaces loss.reduction.
  std::string reduction = "token_mean";
  uint64_t shuffle_seed = 0;
  bool skip_zero_advantage = true;  // see the header comment; only acts when loss.kl_coef == 0
  int64_t pad_token_id = 0;         // fills the right padding (never attended to)
  Status validate() const;
};

// One optimiser step of the update.
struct PolicyStepStats {
  int epoch = 0;           // 0-based
  int sequences = 0;       // in the mini-batch (skipped ones included)
  int skipped = 0;         // zero-advantage sequences that ran no forward/backward
  model::StepStats step;   // loss, grad_norm, lr, tokens (every trained token), statistics
};

struct PolicyUpdateStats {
  double loss = 0;           // mean over optimiser steps of the step loss
  double clip_fraction = 0;  // over the scored tokens of every step (token-weighted)
  double approx_kl = 0;      // idem: k3 against old_logprobs (model/train.h)
  double entropy = 0;        // idem: mean token entropy of the policy
  double grad_norm = 0;      // mean over steps of the norm before clipping
  double max_grad_norm = 0;  // the largest of them
  int64_t steps = 0;         // optimiser steps taken
  double tokens = 0;         // trained completion tokens summed over the steps (each epoch counts)
  double scored_tokens = 0;  // the tokens the statistics cover (tokens less skipped sequences')
  int64_t skipped_sequences = 0;
  std::vector<PolicyStepStats> per_step;
};

class PolicyUpdate {
 public:
  // The trainer (and its model) must outlive this object.
  PolicyUpdate(model::Trainer& trainer, PolicyUpdateOptions options);

  // Errors: invalid options or rollouts (naming the rollout index: empty prompt or completion,
  // old_logprobs or ref_logprobs of the wrong length, a non-finite advantage or log-prob, an
  // id outside the vocabulary), or a failed step (a non-finite gradient norm skips that update
  // and ends the run; earlier steps stay applied).
  Result<PolicyUpdateStats> run(const std::vector<Rollout>& rollouts);

  const PolicyUpdateOptions& options() const { return options_; }

  // Data parallel over `group`'s ranks (the header comment); nullptr or a world of one: alone.
  void set_process_group(std::shared_ptr<dist::ProcessGroup> group) { group_ = std::move(group); }

 private:
  model::Trainer& trainer_;
  PolicyUpdateOptions options_;
  std::shared_ptr<dist::ProcessGroup> group_;
};

// Right-padded micro-batch of `rollouts` (prompt + completion per row): input_ids and
// attention_mask [B, T], loss_mask [B, T-1] on the completion's targets, advantages [B],
// old_logprobs and ref_logprobs [B, T-1], zero off the completion (each only when every rollout
// has one per completion token; undefined otherwise). CPU tensors. Exposed for tests and for callers that build their own steps.
model::MicroBatch make_micro_batch(const std::vector<const Rollout*>& rollouts, int64_t pad_token_id);

}  // namespace kz::rl
