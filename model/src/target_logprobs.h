// The log-probs of each sequence's next tokens from its logits: one piece of arithmetic for
// token_logprobs (generate.cpp) and the training loss (train.cpp), so that a policy ratio against
// token_logprobs' output is exactly 1 for an unchanged model.
#pragma once

#include <ATen/ATen.h>

namespace kz::model {

struct TargetLogprobs {
  at::Tensor logprobs;  // [B, T-1] float32: log softmax(logits / temperature) at input_ids[:, 1:]; 0 at pad targets
  at::Tensor logits;    // [B, T-1, V] float32, divided by the temperature (the loss's entropy is of them)
};

// logits [B, T, V] of input_ids [B, T]; attention_mask [B, T] (undefined: no padding); temperature > 0.
inline TargetLogprobs target_logprobs(const at::Tensor& logits, const at::Tensor& input_ids,
                                      const at::Tensor& attention_mask, double temperature) {
  const int64_t t = input_ids.size(1);
  at::Tensor lf = logits.narrow(1, 0, t - 1).to(at::kFloat);
  if (temperature != 1.0) lf = lf / temperature;
  at::Tensor targets = input_ids.narrow(1, 1, t - 1).to(lf.device());
  at::Tensor lp = lf.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lf.logsumexp(-1);
  if (attention_mask.defined()) lp = lp.masked_fill(attention_mask.narrow(1, 1, t - 1).to(lp.device()).eq(0), 0.0);
  return {lp, lf};
}

}  // namespace kz::model
