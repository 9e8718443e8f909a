// Training steps (see train.h): losses, accumulation, clipping, AdamW, schedules, and the
// activation-checkpointing autograd function that transformer.cpp calls per decoder layer.
//
// AdamW follows torch.optim.AdamW's single-tensor path step for step (decoupled decay first,
// lerp for the first moment, bias corrections folded into the step size and denominator) so one
// step agrees with PyTorch to float32 rounding.
#include "kz/model/train.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>

#include "kz/core/hash.h"
#include "kz/model/generate.h"
#include "kz/model/safetensors.h"
#include "tensor_hash.h"
#include "target_logprobs.h"
#include "torch_status.h"

namespace kz::model {

// ---- activation checkpointing ----
namespace {

// True when recomputing the layer draws random numbers (LoRA dropout in training mode).
bool layer_uses_rng(DecoderLayer& layer) {
  for (const auto& lin : {layer.self_attn->q_proj, layer.self_attn->k_proj, layer.self_attn->v_proj,
                          layer.self_attn->o_proj, layer.mlp->gate_proj, layer.mlp->up_proj, layer.mlp->down_proj})
    if (lin->lora_A && lin->lora_dropout > 0 && lin->is_training()) return true;
  return false;
}

// The default generator of `device` (CPU or an accelerator), whose state the recompute replays.
at::Generator generator_of(const at::Device& device) { return at::globalContext().defaultGenerator(device); }

at::Tensor rng_state(const at::Device& device) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Forward runs the layer without a graph and keeps its input and attention inputs; backward
// reruns it with grad mode on and differentiates the recomputed output. The trained parameters
// are passed as inputs so the node exists (and routes their gradients) even when x needs none.
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            DecoderLayer* layer, const AttentionInputs* in) {
    ctx->save_for_backward({x});
    // The layer outlives the graph (it belongs to the model); the pointer travels as an integer
    // because saved_data holds IValues.
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ctx->saved_data["x_requires_grad"] = x.requires_grad();
    ctx->saved_data["cos"] = in->cos;
    ctx->saved_data["sin"] = in->sin;
    ctx->saved_data["has_mask"] = in->mask.defined();
    if (in->mask.defined()) ctx->saved_data["mask"] = in->mask;
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    // Dropout masks must be the same when the layer is recomputed: keep the generator's state
    // from before this forward, as torch.utils.checkpoint's preserve_rng_state does.
    const bool rng = layer_uses_rng(*layer);
    ctx->saved_data["has_rng"] = rng;
    if (rng) ctx->saved_data["rng"] = rng_state(x.device());
    return layer->forward(x, *in);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* layer = reinterpret_cast<DecoderLayer*>(ctx->saved_data["layer"].toInt());
    AttentionInputs in;
    in.cos = ctx->saved_data["cos"].toTensor();
    in.sin = ctx->saved_data["sin"].toTensor();
    if (ctx->saved_data["has_mask"].toBool()) in.mask = ctx->saved_data["mask"].toTensor();
    const bool x_grad = ctx->saved_data["x_requires_grad"].toBool();
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(x_grad);

    std::vector<at::Tensor> wrt;  // x (when it needs a gradient) then the trained parameters
    if (x_grad) wrt.push_back(x);
    for (const auto& p : layer->parameters())
      if (p.requires_grad()) wrt.push_back(p);
    const auto num_params = static_cast<size_t>(ctx->saved_data["num_params"].toInt());
    TORCH_CHECK(wrt.size() == num_params + (x_grad ? 1 : 0),
                "checkpointed layer: its trained parameters changed between forward and backward");

    at::Tensor y;
    {
      at::AutoGradMode grad_mode(true);
      at::Tensor outer_rng;
      if (ctx->saved_data["has_rng"].toBool()) {  // replay the forward's draws, then carry on where we were
        outer_rng = rng_state(x.device());
        set_rng_state(x.device(), ctx->saved_data["rng"].toTensor());
      }
      y = layer->forward(x, in);
      if (outer_rng.defined()) set_rng_state(x.device(), outer_rng);
    }
    auto grads = torch::autograd::grad({y}, wrt, {grad_out[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    torch::autograd::variable_list out;  // x, each parameter, then the two non-tensor arguments
    out.push_back(x_grad ? grads[0] : at::Tensor());
    out.insert(out.end(), grads.begin() + (x_grad ? 1 : 0), grads.end());
    out.emplace_back();
    out.emplace_back();
    return out;
  }
};

}  // namespace

at::Tensor checkpointed_layer_forward(DecoderLayer& layer, const at::Tensor& x, const AttentionInputs& in) {
  std::vector<at::Tensor> params;
  for (const auto& p : layer.parameters())
    if (p.requires_grad()) params.push_back(p);
  return CheckpointedLayer::apply(x, at::TensorList(params), &layer, &in);
}

// ---- names and options ----

const char* token_loss_name(TokenLoss loss) {
  switch (loss) {
    case TokenLoss::nll: return "nll";
    case TokenLoss::policy_gradient: return "policy_gradient";
    case TokenLoss::clipped_policy: return "clipped_policy";
  }
  return "?";
}

Result<TokenLoss> parse_token_loss(const std::string& name) {
  for (TokenLoss k : {TokenLoss::nll, TokenLoss::policy_gradient, TokenLoss::clipped_policy})
    if (name == token_loss_name(k)) return k;
  return invalid_argument(fmt::format("unknown token loss '{}' (nll, policy_gradient, clipped_policy)", name));
}

const char* loss_reduction_name(LossReduction reduction) {
  switch (reduction) {
    case LossReduction::token_mean: return "token_mean";
    case LossReduction::sequence_mean: return "sequence_mean";
    case LossReduction::sum: return "sum";
    case LossReduction::seq_mean_token_sum: return "seq_mean_token_sum";
  }
  return "?";
}

Result<LossReduction> parse_loss_reduction(const std::string& name) {
  for (LossReduction r : {LossReduction::token_mean, LossReduction::sequence_mean, LossReduction::sum,
                          LossReduction::seq_mean_token_sum})
    if (name == loss_reduction_name(r)) return r;
  return invalid_argument(
      fmt::format("unknown loss reduction '{}' (token_mean, sequence_mean, sum, seq_mean_token_sum)", name));
}

Status LossOptions::validate() const {
  if (!(sum_denominator > 0)) return invalid_argument(fmt::format("loss sum_denominator {} must be > 0", sum_denominator));
  if (!(clip_low >= 0 && clip_low < 1)) return invalid_argument(fmt::format("loss clip_low {} must be in [0, 1)", clip_low));
  if (!(clip_high >= 0)) return invalid_argument(fmt::format("loss clip_high {} must be >= 0", clip_high));
  if (!(kl_coef >= 0)) return invalid_argument(fmt::format("loss kl_coef {} must be >= 0", kl_coef));
  if (!(temperature > 0)) return invalid_argument(fmt::format("loss temperature {} must be > 0", temperature));
  return Status::ok();
}

Status TrainOptions::validate() const {
  auto bad = [](const std::string& m) { return invalid_argument("train options: " + m); };
  if (!(lr >= 0)) return bad(fmt::format("lr {} must be >= 0", lr));
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return bad(fmt::format("betas ({}, {}) must be in [0, 1)", beta1, beta2));
  if (!(eps > 0)) return bad(fmt::format("eps {} must be > 0", eps));
  if (!(weight_decay >= 0)) return bad(fmt::format("weight_decay {} must be >= 0", weight_decay));
  if (!(max_grad_norm >= 0)) return bad(fmt::format("max_grad_norm {} must be >= 0 (0: no clipping)", max_grad_norm));
  if (warmup_steps < 0) return bad(fmt::format("warmup_steps {} must be >= 0", warmup_steps));
  if (schedule == LrSchedule::warmup_cosine && total_steps <= warmup_steps)
    return bad(fmt::format("warmup_cosine needs total_steps ({}) > warmup_steps ({})", total_steps, warmup_steps));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) return bad(fmt::format("min_lr_ratio {} must be in [0, 1]", min_lr_ratio));
  return Status::ok();
}

double learning_rate(const TrainOptions& o, int64_t step) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == LrSchedule::constant) return o.lr;
  double progress = static_cast<double>(step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
  progress = std::min(progress, 1.0);
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine);
}

// ---- losses ----
namespace {

std::string shape_of(const at::Tensor& t) {
  return t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined";
}

Status expect_shape(const char* name, const at::Tensor& t, std::vector<int64_t> shape) {
  if (t.sizes().vec() == shape) return Status::ok();
  return invalid_argument(fmt::format("micro-batch {} has shape {}, expected [{}]", name, shape_of(t), fmt::join(shape, ", ")));
}

// The policy part of the per-token loss [B, T-1] from log-probs with a graph.
at::Tensor policy_losses(const at::Tensor& lp, const MicroBatch& batch, const LossOptions& loss) {
  if (loss.kind == TokenLoss::nll) return -lp;
  at::Tensor adv = batch.advantages.to(lp.device(), at::kFloat);
  if (adv.dim() == 1) adv = adv.unsqueeze(1);  // per sequence: the same for every token
  if (loss.kind == TokenLoss::policy_gradient) return -adv * lp;
  at::Tensor ratio = at::exp(lp - batch.old_logprobs.to(lp.device(), at::kFloat));
  at::Tensor clipped = ratio.clamp(1.0 - loss.clip_low, 1.0 + loss.clip_high);
  return -at::minimum(ratio * adv, clipped * adv);
}

// Per-token loss [B, T-1] before masking and reduction: the policy part plus the KL penalty, its
// log-ratio and value bounded as verl bounds them, so that a token the policy has moved far from
// the reference gives a large but finite penalty rather than an overflowing one.
at::Tensor token_losses(const at::Tensor& lp, const MicroBatch& batch, const LossOptions& loss) {
  at::Tensor l = policy_losses(lp, batch, loss);
  if (loss.kl_coef <= 0) return l;
  at::Tensor log_ratio = (batch.ref_logprobs.to(lp.device(), at::kFloat) - lp).clamp(-20.0, 20.0);  // log(p_ref / p)
  return l + loss.kl_coef * (at::exp(log_ratio) - log_ratio - 1.0).clamp_max(10.0);
}

}  // namespace

Status validate_micro_batch(const MicroBatch& b, const LossOptions& loss) {
  if (!b.input_ids.defined() || b.input_ids.dim() != 2 || b.input_ids.size(1) < 2)
    return invalid_argument(fmt::format("micro-batch input_ids must be [B, T] with T >= 2, got {}", shape_of(b.input_ids)));
  if (b.input_ids.scalar_type() != at::kLong)
    return invalid_argument(fmt::format("micro-batch input_ids must be int64, got {}", c10::toString(b.input_ids.scalar_type())));
  const int64_t n = b.input_ids.size(0), t = b.input_ids.size(1);
  if (b.attention_mask.defined()) KZ_RETURN_IF_ERROR(expect_shape("attention_mask", b.attention_mask, {n, t}));
  if (b.loss_mask.defined()) KZ_RETURN_IF_ERROR(expect_shape("loss_mask", b.loss_mask, {n, t - 1}));
  if (loss.kind != TokenLoss::nll) {
    if (!b.advantages.defined()) return invalid_argument(fmt::format("loss {} needs micro-batch advantages", token_loss_name(loss.kind)));
    if (b.advantages.sizes().vec() != std::vector<int64_t>{n})
      KZ_RETURN_IF_ERROR(expect_shape("advantages", b.advantages, {n, t - 1}));
  }
  if (loss.kind == TokenLoss::clipped_policy) {
    if (!b.old_logprobs.defined()) return invalid_argument("loss clipped_policy needs micro-batch old_logprobs");
    KZ_RETURN_IF_ERROR(expect_shape("old_logprobs", b.old_logprobs, {n, t - 1}));
  }
  if (loss.kl_coef > 0) {
    if (!b.ref_logprobs.defined()) return invalid_argument("loss kl_coef > 0 needs micro-batch ref_logprobs");
    KZ_RETURN_IF_ERROR(expect_shape("ref_logprobs", b.ref_logprobs, {n, t - 1}));
  }
  return Status::ok();
}

at::Tensor target_mask(const MicroBatch& b) {
  const int64_t t = b.input_ids.size(1);
  at::Tensor real = b.attention_mask.defined() ? b.attention_mask.narrow(1, 1, t - 1).ne(0).to(at::kFloat)
                                               : at::ones({b.input_ids.size(0), t - 1}, at::kFloat);
  real = real.to(b.input_ids.device());
  return b.loss_mask.defined() ? real * b.loss_mask.to(real.device(), at::kFloat) : real;
}

double step_denominator(const std::vector<MicroBatch>& batches, const LossOptions& loss) {
  double total = 0;
  for (const auto& b : batches) {
    if (loss.reduction == LossReduction::token_mean) total += target_mask(b).sum().item<double>();
    if (loss.reduction == LossReduction::sequence_mean || loss.reduction == LossReduction::seq_mean_token_sum)
      total += static_cast<double>(b.input_ids.size(0));
  }
  if (loss.reduction == LossReduction::sum) return loss.sum_denominator;
  return std::max(total, 1.0);  // an all-masked step has loss 0, not NaN
}

// ---- statistics ----

void LossStats::add(const LossStats& o) {
  tokens += o.tokens;
  clipped += o.clipped;
  kl += o.kl;
  kl_tokens += o.kl_tokens;
  entropy += o.entropy;
}
double LossStats::clip_fraction() const { return tokens > 0 ? clipped / tokens : 0.0; }
double LossStats::approx_kl() const { return kl_tokens > 0 ? kl / kl_tokens : 0.0; }
double LossStats::mean_entropy() const { return tokens > 0 ? entropy / tokens : 0.0; }

at::Tensor token_entropy(const at::Tensor& logits, int64_t chunk_elements) {
  c10::NoGradGuard no_grad;
  const int64_t v = logits.size(-1);
  at::Tensor rows = logits.detach().reshape({-1, v});
  at::Tensor out = at::empty({rows.size(0)}, rows.options().dtype(at::kFloat));
  const int64_t chunk = std::max<int64_t>(1, chunk_elements / std::max<int64_t>(v, 1));
  for (int64_t begin = 0; begin < rows.size(0); begin += chunk) {
    const int64_t n = std::min(chunk, rows.size(0) - begin);
    // -sum p log p with 0 log 0 = 0 (entr), from a float32 softmax: two chunk-sized temporaries.
    at::Tensor p = at::softmax(rows.narrow(0, begin, n), -1, at::kFloat);
    out.narrow(0, begin, n).copy_(at::special_entr(p).sum(-1));
  }
  std::vector<int64_t> shape = logits.sizes().vec();
  shape.pop_back();
  return out.view(shape);
}

at::Tensor reduce_token_losses(const at::Tensor& lp, const at::Tensor& entropy, const MicroBatch& batch,
                               const LossOptions& loss, double denominator, LossStats* stats) {
  at::Tensor m = target_mask(batch).to(lp.device());
  at::Tensor weighted = token_losses(lp, batch, loss) * m;
  if (loss.reduction == LossReduction::sequence_mean) weighted = weighted / m.sum(1, /*keepdim=*/true).clamp_min(1.0);
  at::Tensor value = weighted.sum() / denominator;
  if (stats) {  // one device-to-host copy for the four sums
    c10::NoGradGuard no_grad;
    at::Tensor zero = at::zeros({}, m.options());
    at::Tensor clipped = zero, kl = zero, ent = zero;
    const bool has_old = batch.old_logprobs.defined();
    if (has_old) {
      at::Tensor log_r = lp.detach() - batch.old_logprobs.to(lp.device(), at::kFloat);
      at::Tensor r = at::exp(log_r);
      kl = ((r - 1.0 - log_r) * m).sum();
      if (loss.kind == TokenLoss::clipped_policy) {
        at::Tensor adv = batch.advantages.to(lp.device(), at::kFloat);
        if (adv.dim() == 1) adv = adv.unsqueeze(1);
        at::Tensor taken = (r.clamp(1.0 - loss.clip_low, 1.0 + loss.clip_high) * adv).lt(r * adv);
        clipped = (taken.to(at::kFloat) * m).sum();
      }
    }
    if (entropy.defined()) ent = (entropy.to(m.device(), at::kFloat) * m).sum();
    at::Tensor host = at::stack({m.sum(), clipped, kl, ent}).to(at::kCPU, at::kDouble);
    const double* v = host.data_ptr<double>();
    LossStats s;
    s.tokens = v[0];
    s.clipped = v[1];
    s.kl = v[2];
    s.kl_tokens = has_old ? v[0] : 0.0;
    s.entropy = v[3];
    stats->add(s);
  }
  return value;
}

Result<at::Tensor> micro_batch_loss(CausalLM& model, const MicroBatch& batch, const LossOptions& loss,
                                    double denominator, LossStats* stats) {
  KZ_RETURN_IF_ERROR(loss.validate());
  KZ_RETURN_IF_ERROR(validate_micro_batch(batch, loss));
  return guarded("loss", [&]() -> Result<at::Tensor> {
    // token_logprobs' arithmetic (target_logprobs), keeping the logits for the entropy.
    auto logits = model.logits(batch.input_ids, batch.attention_mask);
    if (!logits.ok()) return logits.status().with_context("loss");
    TargetLogprobs scored = target_logprobs(*logits, batch.input_ids, batch.attention_mask, loss.temperature);
    at::Tensor entropy = stats ? token_entropy(scored.logits) : at::Tensor();
    return reduce_token_losses(scored.logprobs, entropy, batch, loss, denominator, stats);
  });
}

// ---- the trainer ----

struct Trainer::Param {
  std::string name;
  at::Tensor param;   // the model's tensor
  at::Tensor master;  // float32 copy AdamW updates (== param when param is float32 or masters are off)
  at::Tensor grad;    // float32 accumulator for mixed-precision parameters (undefined otherwise)
  at::Tensor exp_avg, exp_avg_sq;
  bool decay = true;
  bool mixed() const { return !master.is_same(param); }
};

namespace {

bool is_norm_or_bias(const std::string& name) { return name.ends_with(".bias") || name.ends_with("norm.weight"); }

}  // namespace

Trainer::Trainer(std::shared_ptr<CausalLM> model, TrainOptions options, std::vector<Param> params)
    : model_(std::move(model)), options_(std::move(options)), params_(std::move(params)) {}
Trainer::~Trainer() { remove_hooks(); }

Result<std::unique_ptr<Trainer>> Trainer::create(std::shared_ptr<CausalLM> model, const TrainOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  if (!model) return invalid_argument("trainer: no model");
  return guarded("trainer", [&]() -> Result<std::unique_ptr<Trainer>> {
    c10::NoGradGuard no_grad;
    std::vector<Param> params;
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      Param e;
      e.name = item.key();
      e.param = p;
      const bool low = p.scalar_type() != at::kFloat;
      e.master = low && options.fp32_master_weights ? p.detach().to(at::kFloat).clone() : p;
      e.exp_avg = at::zeros_like(e.master);
      e.exp_avg_sq = at::zeros_like(e.master);
      e.decay = options.decay_norms_and_biases || !is_norm_or_bias(e.name);
      params.push_back(std::move(e));
    }
    if (params.empty()) return invalid_argument("trainer: the model has no parameter that requires grad");
    model->activation_checkpointing = options.activation_checkpointing;
    return std::make_unique<Trainer>(std::move(model), options, std::move(params));
  });
}

std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& p : params_) names.push_back(p.name);
  return names;
}

at::Tensor Trainer::master(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p.master;
  return {};
}

at::Tensor Trainer::gradient(const Param& p) const {
  if (p.mixed()) return p.grad;
  return p.param.grad();
}

namespace {

// Training mode (LoRA dropout on) for one forward/backward, then the mode the caller had.
class TrainingMode {
 public:
  explicit TrainingMode(torch::nn::Module& m) : module_(m), was_(m.is_training()) { module_.train(true); }
  ~TrainingMode() { module_.train(was_); }
  TrainingMode(const TrainingMode&) = delete;
  TrainingMode& operator=(const TrainingMode&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_;
};

}  // namespace

// Mixed precision: each half-precision gradient moves into its float32 accumulator so
// micro-batches add in float32, not bf16.
void Trainer::accumulate_mixed(Param& p) {
  if (!p.mixed() || !p.param.grad().defined()) return;
  c10::NoGradGuard no_grad;
  at::Tensor g = p.param.grad().to(at::kFloat);
  p.grad = p.grad.defined() ? p.grad.add_(g) : g;
  p.param.mutable_grad() = at::Tensor();
}

Result<double> Trainer::backward(const MicroBatch& batch, const LossOptions& loss, double denominator,
                                 LossStats* stats) {
  TrainingMode mode(*model_);
  auto value = micro_batch_loss(*model_, batch, loss, denominator, stats);
  if (!value.ok()) {
    last_backward_ = false;
    return value.status();
  }
  auto result = guarded("backward", [&]() -> Result<double> {
    value->backward();
    for (auto& p : params_) accumulate_mixed(p);  // those the hooks did not move already
    return value->item<double>();
  });
  last_backward_ = false;
  return result;
}

// ---- data parallelism ----
namespace {

// Autograd's post-accumulate-grad hook: runs once a parameter's .grad holds this backward's sum.
class AccumulatedHook : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit AccumulatedHook(std::function<void()> on_accumulated) : on_accumulated_(std::move(on_accumulated)) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { on_accumulated_(); }

 private:
  std::function<void()> on_accumulated_;
};

}  // namespace

void Trainer::set_gradient_sync(std::shared_ptr<GradientSync> sync) {
  remove_hooks();
  sync_ = std::move(sync);
  handed_over_.assign(params_.size(), false);
  if (!sync_) return;
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i].param, std::make_unique<AccumulatedHook>([this, i] { gradient_accumulated(i); }));
}

void Trainer::remove_hooks() {
  if (!sync_) return;
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.param, nullptr);
}

void Trainer::last_backward() { last_backward_ = sync_ != nullptr; }

void Trainer::gradient_accumulated(size_t index) {
  if (!last_backward_ || handed_over_[index]) return;
  Param& p = params_[index];
  accumulate_mixed(p);
  at::Tensor g = gradient(p);
  if (!g.defined()) return;
  handed_over_[index] = true;
  sync_->ready(index, g);
}

Status Trainer::sync_gradients() {
  if (!sync_) return Status::ok();
  last_backward_ = false;
  auto status = guarded("gradient sync", [&]() -> Status {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (handed_over_[i]) continue;
      Param& p = params_[i];
      accumulate_mixed(p);
      // A parameter this rank's backward never reached still takes part: the others may have one.
      if (!gradient(p).defined()) {
        if (p.mixed()) p.grad = at::zeros_like(p.master);
        else p.param.mutable_grad() = at::zeros_like(p.param);
      }
      sync_->ready(i, gradient(p));
    }
    return sync_->finish();
  });
  handed_over_.assign(params_.size(), false);
  return status;
}

double Trainer::grad_norm() const {
  c10::NoGradGuard no_grad;
  at::Tensor sq;
  for (const auto& p : params_) {
    at::Tensor g = gradient(p);
    if (!g.defined()) continue;
    at::Tensor s = g.to(at::kFloat).pow(2).sum();
    sq = sq.defined() ? sq + s : s;
  }
  return sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
}

double Trainer::clip_gradients() {
  const double norm = grad_norm();
  if (options_.max_grad_norm <= 0) return norm;
  // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), never above 1.
  const double coef = std::min(options_.max_grad_norm / (norm + 1e-6), 1.0);
  if (coef >= 1.0) return norm;
  c10::NoGradGuard no_grad;
  for (auto& p : params_) {
    at::Tensor g = gradient(p);
    if (g.defined()) g.mul_(coef);
  }
  return norm;
}

void Trainer::zero_grad() {
  for (auto& p : params_) {
    p.grad = at::Tensor();
    if (p.param.grad().defined()) p.param.mutable_grad() = at::Tensor();
  }
}

namespace {

// One AdamW step's constants.
struct AdamWStep {
  double lr, beta1, beta2, eps, decay_factor, bias1, bias2_sqrt;
};

// AdamW on float32 tensors, in place: p -= lr * (wd * p + m_hat / (sqrt(v_hat) + eps)).
void adamw_float(at::Tensor& w, at::Tensor& m, at::Tensor& v, const at::Tensor& g, const AdamWStep& s) {
  if (s.decay_factor != 1.0) w.mul_(s.decay_factor);
  m.lerp_(g, 1.0 - s.beta1);
  v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
  at::Tensor denom = (v.sqrt() / s.bias2_sqrt).add_(s.eps);
  w.addcdiv_(m, denom, -s.lr / s.bias1);
}

// float32 -> bf16, rounded up (in magnitude) with probability equal to the cut bits' fraction of
// the gap: the random 16 bits are added to the float's bits (sign-magnitude, so this works for
// either sign), the carry reaches the kept bits exactly that often, and the low half is cut.
at::Tensor round_stochastic_bf16(const at::Tensor& x, const at::Tensor& random16) {
  at::Tensor bits = x.contiguous().view(at::kInt).add(random16).bitwise_and(static_cast<int32_t>(0xffff0000u));
  return bits.view(at::kFloat).to(at::kBFloat16);
}

// Elements per chunk of the low-precision update: its float32 and int64 temporaries stay in the
// hundreds of megabytes even for a 7B's embedding table.
constexpr int64_t kUpdateChunk = int64_t{1} << 24;

// AdamW for a bf16/fp16 parameter without a float32 master: weight, moments and gradient in the
// parameter's dtype, the step computed in float32 a chunk at a time and rounded back, for bf16
// stochastically (an update far below bf16's resolution still moves the weight in expectation,
// and the moments' running averages stay unbiased; rounded to nearest, v's (1 - beta2) g^2 share
// vanishes), for fp16 to nearest. `key` names this parameter's and step's random stream.
void adamw_low_precision(at::Tensor& param, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
                         const AdamWStep& s, uint64_t key) {
  at::Tensor w = param.view(-1), m = exp_avg.view(-1), v = exp_avg_sq.view(-1), g = grad.reshape(-1);
  const bool stochastic = param.scalar_type() == at::kBFloat16;
  const int64_t n = w.numel();
  for (int64_t begin = 0; begin < n; begin += kUpdateChunk) {
    const int64_t len = std::min(kUpdateChunk, n - begin);
    at::Tensor w32 = w.narrow(0, begin, len).to(at::kFloat), m32 = m.narrow(0, begin, len).to(at::kFloat),
               v32 = v.narrow(0, begin, len).to(at::kFloat);
    adamw_float(w32, m32, v32, g.narrow(0, begin, len).to(at::kFloat), s);
    if (!stochastic) {
      w.narrow(0, begin, len).copy_(w32), m.narrow(0, begin, len).copy_(m32), v.narrow(0, begin, len).copy_(v32);
      continue;
    }
    // 32 random bits per element (the weight's half and the first moment's), 16 more for the second.
    uint64_t state = key ^ static_cast<uint64_t>(begin);
    const auto chunk_key = static_cast<int64_t>(splitmix64(state) & 0xffffffffULL);
    at::Tensor bits = mix32(at::arange(len, w32.options().dtype(at::kLong)).bitwise_xor(chunk_key));
    at::Tensor bits2 = mix32(bits.bitwise_xor(0x5bd1e995LL));
    w.narrow(0, begin, len).copy_(round_stochastic_bf16(w32, bits.bitwise_and(0xffff).to(at::kInt)));
    m.narrow(0, begin, len).copy_(round_stochastic_bf16(m32, bits.bitwise_right_shift(16).to(at::kInt)));
    v.narrow(0, begin, len).copy_(round_stochastic_bf16(v32, bits2.bitwise_and(0xffff).to(at::kInt)));
  }
}

}  // namespace

Status Trainer::update() {
  return guarded("AdamW update", [&]() -> Status {
    c10::NoGradGuard no_grad;
    const double lr = learning_rate(options_, step_);
    const auto t = static_cast<double>(step_ + 1);
    const AdamWStep s{lr, options_.beta1, options_.beta2, options_.eps, 1.0,
                      1.0 - std::pow(options_.beta1, t), std::sqrt(1.0 - std::pow(options_.beta2, t))};
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      at::Tensor g = gradient(p);
      if (!g.defined()) continue;  // unused this step (torch skips parameters without grad too)
      AdamWStep ps = s;
      if (p.decay && options_.weight_decay > 0) ps.decay_factor = 1.0 - lr * options_.weight_decay;
      if (p.master.scalar_type() != at::kFloat) {
        uint64_t state = static_cast<uint64_t>(step_) << 32 ^ i;  // this step's and parameter's stream
        adamw_low_precision(p.param, p.exp_avg, p.exp_avg_sq, g, ps, splitmix64(state));
        continue;
      }
      adamw_float(p.master, p.exp_avg, p.exp_avg_sq, g.to(at::kFloat), ps);
      if (p.mixed()) p.param.copy_(p.master);
    }
    ++step_;
    zero_grad();
    return Status::ok();
  });
}

// ---- resumable state ----
namespace {

constexpr const char* kStateTensors = "optimizer.safetensors";
constexpr const char* kStateJson = "trainer_state.json";

// (file name, tensor) pairs save_state writes for one parameter.
std::vector<std::pair<std::string, at::Tensor>> state_tensors(const Trainer::Param& p) {
  std::vector<std::pair<std::string, at::Tensor>> out = {{p.name + ".exp_avg", p.exp_avg}, {p.name + ".exp_avg_sq", p.exp_avg_sq}};
  if (p.mixed()) out.emplace_back(p.name + ".master", p.master);
  return out;
}

}  // namespace

Status Trainer::save_state(const fs::path& dir) const {
  return guarded("saving trainer state to " + dir.string(), [&]() -> Status {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return io_error(fmt::format("creating {}: {}", dir.string(), ec.message()));
    std::vector<at::Tensor> host;  // CPU copies alive while writing
    std::vector<StTensorView> views;
    for (const auto& p : params_)
      for (const auto& [name, t] : state_tensors(p)) {
        host.push_back(t.detach().to(at::kCPU, at::kFloat).contiguous());
        views.push_back({name, StDType::f32, host.back().sizes().vec(), host.back().data_ptr(), host.back().nbytes()});
      }
    KZ_RETURN_IF_ERROR(write_safetensors(dir / kStateTensors, views));
    return write_file_atomic(dir / kStateJson, nlohmann::json{{"step", step_}}.dump() + "\n");
  });
}

Status Trainer::load_state(const fs::path& dir) {
  auto text = read_file(dir / kStateJson);
  if (!text.ok()) return text.status().with_context("loading trainer state");
  auto file = SafetensorsFile::open(dir / kStateTensors);
  if (!file.ok()) return file.status().with_context("loading trainer state");
  return guarded("loading trainer state from " + dir.string(), [&]() -> Status {
    const int64_t step = nlohmann::json::parse(*text).at("step").get<int64_t>();
    std::vector<std::string> problems;
    std::vector<std::pair<at::Tensor, const StTensorInfo*>> copies;
    for (const auto& p : params_)
      for (const auto& [name, t] : state_tensors(p)) {
        const StTensorInfo* info = file->find(name);
        if (!info) problems.push_back(name + " missing");
        else if (info->dtype != StDType::f32 || info->shape != t.sizes().vec())
          problems.push_back(fmt::format("{} is {} [{}], expected F32 [{}]", name, st_dtype_name(info->dtype),
                                         fmt::join(info->shape, ", "), fmt::join(t.sizes(), ", ")));
        else copies.emplace_back(t, info);
      }
    if (!problems.empty())
      return invalid_argument(fmt::format("{} does not fit this trainer's parameters: {}", (dir / kStateTensors).string(),
                                          fmt::join(problems, "; ")));
    c10::NoGradGuard no_grad;
    for (auto& [t, info] : copies) t.copy_(at::from_blob(const_cast<void*>(file->data(*info)), info->shape, at::kFloat));
    for (auto& p : params_)
      if (p.mixed()) p.param.copy_(p.master);
    step_ = step;
    return Status::ok();
  });
}

Result<StepStats> Trainer::step(const std::vector<MicroBatch>& batches, const LossOptions& loss) {
  if (batches.empty()) return invalid_argument("train step: no micro-batches");
  KZ_RETURN_IF_ERROR(loss.validate());
  for (size_t i = 0; i < batches.size(); ++i)
    KZ_RETURN_IF_ERROR(validate_micro_batch(batches[i], loss).with_context(fmt::format("micro-batch {}", i)));
  return step(batches, loss, step_denominator(batches, loss));
}

Result<StepStats> Trainer::step(const std::vector<MicroBatch>& batches, const LossOptions& loss, double denominator) {
  // A data-parallel rank may have no share of a small step; it still takes part in the sync.
  if (batches.empty() && !sync_) return invalid_argument("train step: no micro-batches");
  if (!(denominator > 0) || !std::isfinite(denominator))
    return invalid_argument(fmt::format("train step: loss denominator {} must be finite and > 0", denominator));
  KZ_RETURN_IF_ERROR(loss.validate());
  for (size_t i = 0; i < batches.size(); ++i)
    KZ_RETURN_IF_ERROR(validate_micro_batch(batches[i], loss).with_context(fmt::format("micro-batch {}", i)));
  StepStats stats;
  stats.lr = learning_rate(options_, step_);
  LossStats sums;
  zero_grad();
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i + 1 == batches.size()) last_backward();
    auto share = backward(batches[i], loss, denominator, &sums);
    if (!share.ok()) {
      zero_grad();
      return share.status().with_context(fmt::format("train step {}, micro-batch {}", step_, i));
    }
    stats.loss += *share;
  }
  if (auto synced = sync_gradients(); !synced.is_ok()) {
    zero_grad();
    return synced.with_context(fmt::format("train step {}", step_));
  }
  stats.tokens = sums.tokens;
  stats.clip_fraction = sums.clip_fraction();
  stats.approx_kl = sums.approx_kl();
  stats.entropy = sums.mean_entropy();
  stats.grad_norm = clip_gradients();
  if (!std::isfinite(stats.grad_norm)) {  // one bad batch must not poison the weights and moments
    zero_grad();
    return invalid_argument(fmt::format("train step {}: gradient norm is {} (loss {}); update skipped", step_,
                                        stats.grad_norm, stats.loss));
  }
  KZ_RETURN_IF_ERROR(update());
  stats.step = step_;
  return stats;
}

}  // namespace kz::model
