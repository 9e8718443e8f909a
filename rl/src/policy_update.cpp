// The GRPO / CA-GRPO policy update (policy_update.h): shuffling, mini-batches as optimiser
// steps, micro-batches as gradient accumulation, zero-advantage skipping with the normaliser kept.
#include "kz/rl/policy_update.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "kz/core/hash.h"
#include "kz/dist/process_group.h"

namespace kz::rl {

model::LossOptions default_policy_loss() {
  model::LossOptions loss;
  loss.kind = model::TokenLoss::clipped_policy;
  loss.clip_low = 0.2;
  loss.clip_high = 0.28;
  loss.kl_coef = 0.0;
  return loss;
}

Status PolicyUpdateOptions::validate() const {
  auto bad = [](const std::string& m) { return invalid_argument("policy update options: " + m); };
  if (mini_batch_size < 1) return bad(fmt::format("mini_batch_size {} must be >= 1", mini_batch_size));
  if (micro_batch_size < 1) return bad(fmt::format("micro_batch_size {} must be >= 1", micro_batch_size));
  if (epochs < 1) return bad(fmt::format("epochs {} must be >= 1", epochs));
  if (pad_token_id < 0) return bad(fmt::format("pad_token_id {} must be >= 0", pad_token_id));
  if (loss.kind == model::TokenLoss::nll)
    return bad("loss kind nll takes no advantages: use clipped_policy or policy_gradient");
  auto r = model::parse_loss_reduction(reduction);
  if (!r.ok()) return bad(r.status().message());
  return loss.validate().with_context("policy update options");
}

namespace {

// Fisher-Yates with our own generator, so the order is the same on every standard library.
void shuffle(std::vector<size_t>& order, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = order.size(); i > 1; --i) {
    // Lemire's bounded draw would be faster; the modulo bias of 64-bit draws over a few thousand
    // sequences is ~1e-16.
    const size_t j = static_cast<size_t>(splitmix64(state) % i);
    std::swap(order[i - 1], order[j]);
  }
}

uint64_t epoch_seed(uint64_t shuffle_seed, int64_t steps_done, int epoch) {
  uint64_t state = shuffle_seed;
  uint64_t a = splitmix64(state);
  state = a ^ static_cast<uint64_t>(steps_done);
  uint64_t b = splitmix64(state);
  state = b ^ static_cast<uint64_t>(epoch);
  return splitmix64(state);
}

// One epoch's mini-batches as lists of rollout indices: the units (each group of Rollout::group
// whole, each ungrouped rollout alone) in shuffled order, packed in turn into mini-batches of at
// most mini_batch_size sequences; a unit larger than that is a mini-batch of its own.
std::vector<std::vector<size_t>> epoch_mini_batches(const std::vector<Rollout>& rollouts, size_t mini_batch_size,
                                                    uint64_t seed) {
  std::vector<std::vector<size_t>> units;
  std::map<int64_t, size_t> unit_of_group;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const int64_t group = rollouts[i].group;
    if (group < 0) {
      units.push_back({i});
      continue;
    }
    auto [it, added] = unit_of_group.try_emplace(group, units.size());
    if (added) units.emplace_back();
    units[it->second].push_back(i);
  }
  std::vector<size_t> order(units.size());
  std::iota(order.begin(), order.end(), size_t{0});
  shuffle(order, seed);
  std::vector<std::vector<size_t>> batches;
  for (size_t u : order) {
    if (batches.empty() || batches.back().size() + units[u].size() > mini_batch_size) batches.emplace_back();
    batches.back().insert(batches.back().end(), units[u].begin(), units[u].end());
  }
  return batches;
}

Status check_rollout(const Rollout& r, size_t index, int64_t vocab, bool need_ref) {
  auto bad = [&](const std::string& m) { return invalid_argument(fmt::format("rollout {}: {}", index, m)); };
  if (r.prompt_ids.empty()) return bad("empty prompt_ids");
  if (r.completion_ids.empty()) return bad("empty completion_ids");
  if (r.old_logprobs.size() != r.completion_ids.size())
    return bad(fmt::format("{} old_logprobs for {} completion tokens", r.old_logprobs.size(), r.completion_ids.size()));
  if (need_ref && r.ref_logprobs.size() != r.completion_ids.size())
    return bad(fmt::format("{} ref_logprobs for {} completion tokens (loss kl_coef > 0 needs one per token)",
                           r.ref_logprobs.size(), r.completion_ids.size()));
  if (!std::isfinite(r.advantage)) return bad(fmt::format("advantage is {}", r.advantage));
  for (const auto* ids : {&r.prompt_ids, &r.completion_ids})
    for (int64_t id : *ids)
      if (id < 0 || id >= vocab) return bad(fmt::format("token id {} outside the vocabulary [0, {})", id, vocab));
  for (const auto* lps : {&r.old_logprobs, &r.ref_logprobs})
    for (float lp : *lps)
      if (!std::isfinite(lp) || lp > 1e-3f) return bad(fmt::format("log-prob {} is not a finite value <= 0", lp));
  return Status::ok();
}

// Micro-batches of at most `size` rollouts, in order.
std::vector<model::MicroBatch> micro_batches(const std::vector<const Rollout*>& rows, int size, int64_t pad) {
  std::vector<model::MicroBatch> out;
  for (size_t begin = 0; begin < rows.size(); begin += static_cast<size_t>(size)) {
    const size_t end = std::min(rows.size(), begin + static_cast<size_t>(size));
    out.push_back(make_micro_batch(std::vector<const Rollout*>(rows.begin() + begin, rows.begin() + end), pad));
  }
  return out;
}

}  // namespace

model::MicroBatch make_micro_batch(const std::vector<const Rollout*>& rollouts, int64_t pad_token_id) {
  const auto n = static_cast<int64_t>(rollouts.size());
  int64_t t = 2;
  bool old = !rollouts.empty(), ref = !rollouts.empty();
  for (const Rollout* r : rollouts) {
    t = std::max<int64_t>(t, static_cast<int64_t>(r->prompt_ids.size() + r->completion_ids.size()));
    old = old && r->old_logprobs.size() == r->completion_ids.size();
    ref = ref && r->ref_logprobs.size() == r->completion_ids.size();
  }
  const auto rows = static_cast<size_t>(n), cols = static_cast<size_t>(t);
  std::vector<int64_t> ids(rows * cols, pad_token_id), attention(rows * cols, 0);
  std::vector<float> loss_mask(rows * (cols - 1), 0.0f), old_lp(old ? loss_mask.size() : 0, 0.0f),
      ref_lp(ref ? loss_mask.size() : 0, 0.0f), adv(rows, 0.0f);
  for (size_t b = 0; b < rows; ++b) {
    const Rollout& r = *rollouts[b];
    const size_t p = r.prompt_ids.size(), c = r.completion_ids.size();
    std::copy(r.prompt_ids.begin(), r.prompt_ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(b * cols));
    std::copy(r.completion_ids.begin(), r.completion_ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(b * cols + p));
    std::fill_n(attention.begin() + static_cast<std::ptrdiff_t>(b * cols), p + c, 1);
    // Completion token i sits at position p + i: it is the target of index p + i - 1.
    const size_t first = b * (cols - 1) + p - 1;
    for (size_t i = 0; i < c; ++i) {
      loss_mask[first + i] = 1.0f;
      if (old) old_lp[first + i] = r.old_logprobs[i];
      if (ref) ref_lp[first + i] = r.ref_logprobs[i];
    }
    adv[b] = static_cast<float>(r.advantage);
  }
  auto matrix = [&](auto& values, int64_t width) {
    return at::tensor(values).view({n, width});
  };
  model::MicroBatch mb;
  mb.input_ids = matrix(ids, t);
  mb.attention_mask = matrix(attention, t);
  mb.loss_mask = matrix(loss_mask, t - 1);
  mb.advantages = at::tensor(adv);
  if (old) mb.old_logprobs = matrix(old_lp, t - 1);
  if (ref) mb.ref_logprobs = matrix(ref_lp, t - 1);
  return mb;
}

PolicyUpdate::PolicyUpdate(model::Trainer& trainer, PolicyUpdateOptions options)
    : trainer_(trainer), options_(std::move(options)) {}

Result<PolicyUpdateStats> PolicyUpdate::run(const std::vector<Rollout>& rollouts) {
  KZ_RETURN_IF_ERROR(options_.validate());
  if (rollouts.empty()) return invalid_argument("policy update: no rollouts");
  model::LossOptions loss = options_.loss;
  loss.reduction = *model::parse_loss_reduction(options_.reduction);
  const bool need_ref = loss.kl_coef > 0;
  const int64_t vocab = trainer_.model().config().vocab_size;
  for (size_t i = 0; i < rollouts.size(); ++i) KZ_RETURN_IF_ERROR(check_rollout(rollouts[i], i, vocab, need_ref));
  const bool skip = options_.skip_zero_advantage && !need_ref;

  const int world = group_ ? group_->size() : 1, rank = group_ ? group_->rank() : 0;
  PolicyUpdateStats out;
  model::LossStats sums;  // token-weighted statistics over every step
  const int64_t start_step = trainer_.steps_done();
  for (int epoch = 0; epoch < options_.epochs; ++epoch) {
    const auto batches = epoch_mini_batches(rollouts, static_cast<size_t>(options_.mini_batch_size),
                                            epoch_seed(options_.shuffle_seed, start_step, epoch));
    for (size_t b = 0; b < batches.size(); ++b) {
      std::vector<const Rollout*> all, active;
      for (size_t index : batches[b]) {
        const Rollout* r = &rollouts[index];
        all.push_back(r);
        if (!skip || r->advantage != 0.0) active.push_back(r);
      }
      if (active.empty()) active = all;  // all zero: run in full (see the header comment)
      // The normaliser counts every sequence of the mini-batch, skipped or not.
      const double denominator =
          model::step_denominator(micro_batches(all, options_.mini_batch_size, options_.pad_token_id), loss);
      // This rank's share of the rows that run: every world-th (all of them alone).
      std::vector<const Rollout*> mine;
      for (size_t k = static_cast<size_t>(rank); k < active.size(); k += static_cast<size_t>(world))
        mine.push_back(active[k]);
      const std::string where = fmt::format("policy update epoch {}, mini-batch {}{}", epoch, b,
                                            world > 1 ? fmt::format(", rank {} of {}", rank, world) : "");
      auto step = trainer_.step(micro_batches(mine, options_.micro_batch_size, options_.pad_token_id), loss,
                                denominator / world);
      if (!step.ok()) return step.status().with_context(where);
      if (world > 1) {
        // The ranks' shares summed: the loss is their mean (each normalised by denominator / world),
        // the statistics weighted by each share's scored tokens.
        const double t = step->tokens;
        auto summed = group_->all_reduce_sum(
            {step->loss, t, step->clip_fraction * t, step->approx_kl * t, step->entropy * t});
        if (!summed.ok()) return summed.status().with_context(where + ", the step's statistics");
        const std::vector<double>& v = *summed;
        step->loss = v[0] / world;
        step->tokens = v[1];
        step->clip_fraction = v[1] > 0 ? v[2] / v[1] : 0.0;
        step->approx_kl = v[1] > 0 ? v[3] / v[1] : 0.0;
        step->entropy = v[1] > 0 ? v[4] / v[1] : 0.0;
      }
      PolicyStepStats ps;
      ps.epoch = epoch;
      ps.sequences = static_cast<int>(all.size());
      ps.skipped = static_cast<int>(all.size() - active.size());
      ps.step = *step;
      double all_tokens = 0;
      for (const Rollout* r : all) all_tokens += static_cast<double>(r->completion_ids.size());
      ps.step.tokens = all_tokens;
      // The step's statistics back into sums over its scored tokens.
      model::LossStats s;
      s.tokens = step->tokens;
      s.clipped = step->clip_fraction * step->tokens;
      s.kl = step->approx_kl * step->tokens;
      s.kl_tokens = step->tokens;
      s.entropy = step->entropy * step->tokens;
      sums.add(s);
      out.loss += step->loss;
      out.grad_norm += step->grad_norm;
      out.max_grad_norm = std::max(out.max_grad_norm, step->grad_norm);
      out.tokens += all_tokens;
      out.skipped_sequences += ps.skipped;
      out.per_step.push_back(ps);
      ++out.steps;
    }
  }
  out.loss /= static_cast<double>(out.steps);
  out.grad_norm /= static_cast<double>(out.steps);
  out.clip_fraction = sums.clip_fraction();
  out.approx_kl = sums.approx_kl();
  out.entropy = sums.mean_entropy();
  out.scored_tokens = sums.tokens;
  return out;
}

}  // namespace kz::rl
