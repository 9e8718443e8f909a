// Training steps on a CausalLM: token losses (SFT and policy gradient), gradient accumulation
// over micro-batches, global grad-norm clipping, AdamW with a learning-rate schedule, fp32 master
// weights for bf16/fp16 models, and activation checkpointing.
//
// One optimiser step reads top to bottom:
//   auto trainer = Trainer::create(model, options);          // the parameters that require grad
//   auto stats = trainer->step(micro_batches, loss_options);  // forward+backward each micro-batch,
//                                                             // clip, AdamW, schedule, zero grads
// step() is backward() per micro-batch, clip_gradients(), then update(); loops that interleave
// other work call those directly (data parallelism: last_backward() before the step's last
// backward, sync_gradients() before clipping). What trains is what requires grad when the
// trainer is created: everything after CausalLM::load (full fine-tuning), only the adapters after
// add_lora (lora.h).
//
// Shapes: B sequences, T tokens; token-level tensors are [B, T-1] and index *targets*: entry
// [b, t] belongs to the prediction of input_ids[b, t+1] (as token_logprobs returns them).
//
// Loss of one step over all its micro-batches (m = loss mask, lp = log-probs, A = advantages):
//   nll              l = -lp
//   policy_gradient  l = -A * lp                        (REINFORCE / GRPO on-policy)
//   clipped_policy   l = -min(r A, clip(r, 1-clip_low, 1+clip_high) A), r = exp(lp - old_lp)
// plus, when kl_coef > 0, kl_coef * (exp(ref_lp - lp) - (ref_lp - lp) - 1) per token (the k3
// estimator of KL(policy || reference) that GRPO uses; needs ref_logprobs; as in verl, the
// log-ratio is clamped to [-20, 20] and the term to at most 10),
// reduced by `reduction`:
//   token_mean     sum(m * l) / (sum of m over every micro-batch of the step)
//   sequence_mean  mean over the step's sequences of (sum_t m l / sum_t m)
//   sum            sum(m * l) / sum_denominator (e.g. a fixed max length, as Dr. GRPO)
//   seq_mean_token_sum  mean over the step's sequences of sum_t m l (verl's name: each
//                  sequence's token losses summed, then averaged over sequences)
// Accumulating micro-batches therefore gives the same gradient as one batch holding them all.
//
// Statistics (LossStats, StepStats), all over the trained tokens (weights m), computed under
// no_grad from the same forward as the loss:
//   clip_fraction  share of tokens where clipped_policy took the clipped term: clip(r) A < r A
//                  strictly (so never at r = 1 or A = 0); 0 for the other losses
//   approx_kl      mean of (r - 1) - log r, r = exp(lp - old_lp): the k3 estimator of
//                  KL(old || current) on tokens sampled from the old policy (PPO's approx_kl);
//                  0 when the micro-batch has no old_logprobs
//   entropy        mean of -sum_v p_v log p_v of the current policy's next-token distribution,
//                  computed from the logits in chunks of rows (token_entropy) so the extra
//                  memory is a chunk, not another [B, T-1, V] tensor
//
// Precision: float32 parameters are updated in place. bf16/fp16 parameters get float32 master
// copies, float32 gradient accumulators and float32 Adam moments (fp32_master_weights, default
// on: 18 bytes a bf16 parameter); the model's weights are the master rounded after every step.
// With it off, weights, gradients and moments stay in the parameter's dtype (8 bytes a
// parameter: a 7B's full fine-tuning state fits one 80 GB card); each step is computed in float32
// a chunk at a time and rounded back, stochastically for bf16 (so updates far below bf16's
// resolution still move the weights in expectation, and the moments stay unbiased), to nearest
// for fp16. The rounding's random bits come from (step, parameter, element) alone.
//
// Activation checkpointing recomputes each decoder layer in backward: the layer's parameters are
// inputs of the recompute function, so gradients flow (and autograd::grad works) even when the
// layer input does not require grad (LoRA over frozen embeddings). When a layer draws random
// numbers (LoRA dropout), the generator's state is saved and replayed so the recompute uses the
// forward's dropout masks. Parameter gradients come out of the recompute function, so
// torch::autograd::grad works as well as backward().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/model/transformer.h"

namespace kz::model {

enum class TokenLoss { nll, policy_gradient, clipped_policy };
enum class LossReduction { token_mean, sequence_mean, sum, seq_mean_token_sum };
const char* token_loss_name(TokenLoss loss);             // "nll", "policy_gradient", "clipped_policy"
Result<TokenLoss> parse_token_loss(const std::string& name);
// "token_mean", "sequence_mean", "sum", "seq_mean_token_sum"
const char* loss_reduction_name(LossReduction reduction);
Result<LossReduction> parse_loss_reduction(const std::string& name);

struct LossOptions {
  TokenLoss kind = TokenLoss::nll;
  LossReduction reduction = LossReduction::token_mean;
  double sum_denominator = 1.0;  // reduction sum: the constant divisor
  double clip_low = 0.2;         // clipped_policy: ratio floor 1 - clip_low
  double clip_high = 0.28;       // clipped_policy: ratio ceiling 1 + clip_high (asymmetric, DAPO's default)
  double kl_coef = 0.0;          // weight of the per-token KL penalty to ref_logprobs; 0: none
  // The policy's sampling temperature: log-probs (and the entropy) are of softmax(logits /
  // temperature), the distribution the samples came from (verl's and TRL's convention); old and
  // reference log-probs must be of it too (token_logprobs' temperature). > 0.
  double temperature = 1.0;
  Status validate() const;
};

// One micro-batch; tensors may live on any device (moved to the model's).
struct MicroBatch {
  at::Tensor input_ids;       // [B, T] int64, T >= 2
  at::Tensor attention_mask;  // [B, T] 1 token / 0 pad, any padding pattern; undefined: all tokens
  at::Tensor loss_mask;       // [B, T-1] 1 where the target is trained (e.g. completion tokens only),
                              // float or int; undefined: every real target. Pad targets never count.
  at::Tensor advantages;      // policy losses: [B] per sequence or [B, T-1] per token
  at::Tensor old_logprobs;    // clipped_policy: [B, T-1] log-probs of the sampling policy
  at::Tensor ref_logprobs;    // kl_coef > 0: [B, T-1] log-probs of the reference model
};

// Checks shapes and dtypes against `loss`; the error names the tensor and both shapes.
Status validate_micro_batch(const MicroBatch& batch, const LossOptions& loss);

// The trained-token weights of a micro-batch: loss_mask (or attention_mask[:, 1:]) times the
// target-is-real mask, float32 [B, T-1] on the batch's device.
at::Tensor target_mask(const MicroBatch& batch);

// The reduction's divisor for a step made of `batches` (token count, sequence count or the constant).
double step_denominator(const std::vector<MicroBatch>& batches, const LossOptions& loss);

// Mask-weighted sums over trained tokens, added up over micro-batches and steps; the means are
// the statistics of the header comment (0 when there are no tokens).
struct LossStats {
  double tokens = 0;       // sum of the target mask
  double clipped = 0;      // sum of m where the clipped term was taken
  double kl = 0;           // sum of m * ((r - 1) - log r) against old_logprobs
  double kl_tokens = 0;    // sum of m over micro-batches that had old_logprobs
  double entropy = 0;      // sum of m * entropy
  void add(const LossStats& other);
  double clip_fraction() const;
  double approx_kl() const;
  double mean_entropy() const;
};

// Entropy of softmax(logits) along the last dimension, float32 [...] (logits [..., V], any
// float dtype), computed without a graph over chunks of about chunk_elements logits at a time.
at::Tensor token_entropy(const at::Tensor& logits, int64_t chunk_elements = int64_t(1) << 24);

// The loss share and statistics of a micro-batch from its log-probs lp [B, T-1] (with a graph,
// or not) and, optionally, its per-target entropies [B, T-1] (undefined: entropy not counted):
// what micro_batch_loss does after the forward. Pure tensor arithmetic (tests give it made-up
// log-probs).
at::Tensor reduce_token_losses(const at::Tensor& lp, const at::Tensor& entropy, const MicroBatch& batch,
                               const LossOptions& loss, double denominator, LossStats* stats = nullptr);

// This micro-batch's share of the step loss (a scalar with the autograd graph): summing it over
// the step's micro-batches gives the loss of the header comment. With `stats`, adds the
// micro-batch's statistics to it.
Result<at::Tensor> micro_batch_loss(CausalLM& model, const MicroBatch& batch, const LossOptions& loss,
                                    double denominator, LossStats* stats = nullptr);

// Data parallelism (dist/data_parallel.h implements it over c10d): the mean of every trained
// parameter's step gradient over the ranks. The trainer hands each gradient to ready() during the
// step's last backward, as soon as autograd has accumulated it (a post-accumulate-grad hook), so
// the reduction overlaps the rest of the backward pass; finish() waits, leaving the gradients
// averaged in place before clipping. Calls come from autograd's thread for the device.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Trained parameter `index` (Trainer::parameter_names order) has its final gradient of the step
  // (float32 for mixed-precision parameters); the sync may reduce it in place until finish().
  virtual void ready(size_t index, const at::Tensor& grad) = 0;
  // Called once every gradient was handed over: waits for the reductions.
  virtual Status finish() = 0;
};

enum class LrSchedule { constant, warmup_cosine };

struct TrainOptions {
  // AdamW, as torch.optim.AdamW: p -= lr * (wd * p + m_hat / (sqrt(v_hat) + eps)).
  double lr = 1e-5;            // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decay_norms_and_biases = false;  // false: norm weights and biases get no weight decay
  // Learning rate of optimiser step s (0-based): lr * (s+1)/warmup_steps for s < warmup_steps,
  // then constant lr, or (warmup_cosine) a cosine from lr down to lr * min_lr_ratio at
  // s = total_steps, held there afterwards.
  LrSchedule schedule = LrSchedule::constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;     // warmup_cosine: required, > warmup_steps
  double min_lr_ratio = 0.0;
  double max_grad_norm = 1.0;  // global L2 norm clipping as torch.nn.utils.clip_grad_norm_; 0: off
  bool fp32_master_weights = true;   // for bf16/fp16 parameters, see the header comment
  bool activation_checkpointing = false;  // sets CausalLM::activation_checkpointing
  Status validate() const;
};

// Learning rate of 0-based optimiser step `step` under `options`.
double learning_rate(const TrainOptions& options, int64_t step);

struct StepStats {
  int64_t step = 0;        // optimiser steps done, this one included
  double loss = 0;         // the step's loss (sum of its micro-batch shares)
  double grad_norm = 0;    // global L2 norm before clipping
  double lr = 0;           // the learning rate this step used
  double tokens = 0;       // trained tokens (sum of target masks)
  double clip_fraction = 0;  // the step's statistics (header comment), over its trained tokens
  double approx_kl = 0;
  double entropy = 0;
};

class Trainer {
 public:
  // Collects the model's parameters that require grad (error if none).
  static Result<std::unique_ptr<Trainer>> create(std::shared_ptr<CausalLM> model, const TrainOptions& options);

  // One optimiser step over `batches`: backward on each, clip, AdamW, zero gradients. A
  // non-finite gradient norm is an error and skips the update (weights and moments untouched).
  Result<StepStats> step(const std::vector<MicroBatch>& batches, const LossOptions& loss);
  // The same with the reduction's divisor given instead of step_denominator(batches): for callers
  // that leave out sequences adding no gradient (zero advantages, no KL) but count them in the
  // normaliser, so the gradient is the one with them in. tokens and the statistics then cover
  // the batches given.
  // With a gradient sync, `denominator` is the global batch's divided by the world size
  // (dist/data_parallel.h), and `batches` may be empty (a rank without a share of this step).
  Result<StepStats> step(const std::vector<MicroBatch>& batches, const LossOptions& loss, double denominator);

  // Forward + backward of one micro-batch, adding into the accumulated gradients; returns its
  // loss share (denominator: step_denominator of the whole step) and adds to `stats` if given.
  Result<double> backward(const MicroBatch& batch, const LossOptions& loss, double denominator,
                          LossStats* stats = nullptr);
  // Data parallelism: gradients averaged over ranks by `sync` (nullptr: none). The trainer
  // hooks every trained parameter; the hooks are removed with the trainer or the sync.
  void set_gradient_sync(std::shared_ptr<GradientSync> sync);
  // With a sync: the next backward() is the step's last, so its gradients go to the sync (step()
  // marks it itself; callers of backward() mark their own step's last micro-batch).
  void last_backward();
  // With a sync: hands over the gradients the last backward did not (parameters it did not
  // reach, as zeros) and waits, so every rank holds the same averaged gradients. step() calls it
  // before clipping; without a sync, nothing.
  Status sync_gradients();

  // Global L2 norm of the accumulated gradients.
  double grad_norm() const;
  // Scales the gradients to max_grad_norm when above it; returns the norm before clipping.
  double clip_gradients();
  // AdamW at learning_rate(options, steps_done()), then zeroes the gradients.
  Status update();
  void zero_grad();

  // Optimiser state, for resuming a run: DIR/optimizer.safetensors ("<name>.exp_avg",
  // "<name>.exp_avg_sq" per trained parameter, and "<name>.master" for the float32 masters of
  // bf16/fp16 parameters) and DIR/trainer_state.json ({"step": n}). The weights themselves are
  // saved apart (CausalLM::save, or save_lora for adapters).
  Status save_state(const fs::path& dir) const;
  // Restores save_state's files into a trainer over the same parameters (masters are copied into
  // the model too); every missing or mis-shaped tensor is named in one error, nothing changes then.
  Status load_state(const fs::path& dir);

  int64_t steps_done() const { return step_; }
  const TrainOptions& options() const { return options_; }
  CausalLM& model() { return *model_; }
  // Trained parameters by HF name, and the float32 tensor AdamW updates for each (the parameter
  // itself, or its master copy).
  std::vector<std::string> parameter_names() const;
  at::Tensor master(const std::string& name) const;

  struct Param;  // one trained tensor with its optimiser state (train.cpp)
  Trainer(std::shared_ptr<CausalLM> model, TrainOptions options, std::vector<Param> params);
  ~Trainer();

 private:
  at::Tensor gradient(const Param& p) const;  // accumulated float32 gradient (undefined: none yet)
  void accumulate_mixed(Param& p);            // a half-precision grad added into p.grad (float32)
  void gradient_accumulated(size_t index);    // the post-accumulate-grad hook of parameter `index`
  void remove_hooks();
  std::shared_ptr<CausalLM> model_;
  TrainOptions options_;
  std::vector<Param> params_;
  int64_t step_ = 0;
  std::shared_ptr<GradientSync> sync_;
  bool last_backward_ = false;         // the running backward is the step's last (hooks hand over)
  std::vector<bool> handed_over_;      // per parameter, this step
};

}  // namespace kz::model
