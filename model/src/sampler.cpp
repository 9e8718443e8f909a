// Token choice on the device (see sampler.h).
#include "kz/model/sampler.h"

#include <fmt/format.h>

#include <limits>

#include "tensor_hash.h"

namespace kz::model {

Status SamplingOptions::validate() const {
  if (!(temperature >= 0)) return invalid_argument(fmt::format("temperature must be >= 0, got {}", temperature));
  if (top_k < 0) return invalid_argument(fmt::format("top_k must be >= 0, got {}", top_k));
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument(fmt::format("top_p must be in (0, 1], got {}", top_p));
  if (max_new_tokens < 1) return invalid_argument(fmt::format("max_new_tokens must be >= 1, got {}", max_new_tokens));
  return Status::ok();
}

Sampler::Sampler(int64_t rows, at::Device device) : rows_(rows) {
  step_ = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kLong));
}

Sampler Sampler::greedy(int64_t rows, at::Device device) { return Sampler(rows, device); }

Sampler::Sampler(const std::vector<SamplingOptions>& rows, at::Device device)
    : Sampler(static_cast<int64_t>(rows.size()), device) {
  std::vector<uint8_t> greedy;
  std::vector<float> inv_temperature, top_p;
  std::vector<int64_t> top_k, seed_lo, seed_hi;  // each seed's two 32-bit halves
  for (const auto& r : rows) {
    bool is_greedy = r.temperature == 0;
    all_greedy_ = all_greedy_ && is_greedy;
    filters_ = filters_ || (!is_greedy && (r.top_k > 0 || r.top_p < 1));
    greedy.push_back(is_greedy);
    inv_temperature.push_back(is_greedy ? 1.0f : static_cast<float>(1.0 / r.temperature));
    top_k.push_back(r.top_k > 0 ? r.top_k : std::numeric_limits<int64_t>::max());
    top_p.push_back(static_cast<float>(r.top_p));
    seed_lo.push_back(static_cast<int64_t>(r.seed & 0xffffffffULL));
    seed_hi.push_back(static_cast<int64_t>(r.seed >> 32));
  }
  auto on = [&](at::Tensor t) { return t.to(device); };
  greedy_ = on(at::tensor(std::vector<int64_t>(greedy.begin(), greedy.end()), at::kLong).to(at::kBool));
  inv_temperature_ = on(at::tensor(inv_temperature, at::kFloat));
  top_k_ = on(at::tensor(top_k, at::kLong));
  top_p_ = on(at::tensor(top_p, at::kFloat));
  seed_key_ = mix32(mix32(on(at::tensor(seed_lo, at::kLong)).bitwise_xor(0x5851f42dLL))
                        .bitwise_xor(on(at::tensor(seed_hi, at::kLong))));
}

at::Tensor Sampler::uniforms() const {
  at::Tensor h = mix32(seed_key_.bitwise_xor(step_.bitwise_and(kLow32)));
  // The top 24 bits, centred in their bucket: exact in float32, never 0 or 1.
  return (h.bitwise_right_shift(8).to(at::kFloat) + 0.5f) * (1.0f / 16777216.0f);
}

std::pair<at::Tensor, at::Tensor> Sampler::choose(const at::Tensor& logits) {
  at::Tensor lf = logits.to(at::kFloat);
  at::Tensor token = lf.argmax(-1);
  if (!all_greedy_) {
    const int64_t vocab = lf.size(-1);
    at::Tensor scaled = lf * inv_temperature_.unsqueeze(1);
    at::Tensor order;  // sorted position -> token id, when the rows filter
    at::Tensor probs;
    if (filters_) {
      at::Tensor sorted;
      std::tie(sorted, order) = scaled.sort(/*dim=*/-1, /*descending=*/true);
      at::Tensor rank = at::arange(vocab, order.options()).unsqueeze(0);
      sorted = sorted.masked_fill(rank >= top_k_.unsqueeze(1), -std::numeric_limits<float>::infinity());
      probs = sorted.softmax(-1);
      // Drop a token when the tokens above it already reach top_p; the most likely always stays.
      probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p_.unsqueeze(1), 0.0);
    } else {
      probs = scaled.softmax(-1);
    }
    // Inverse CDF: the first position whose cumulative mass reaches u * total (total > 0, u in
    // (0, 1)), which is never a position of zero mass.
    at::Tensor cdf = probs.cumsum(-1);
    at::Tensor target = (uniforms() * cdf.select(-1, vocab - 1)).unsqueeze(1);
    at::Tensor pick = at::searchsorted(cdf, target).clamp_max(vocab - 1);
    if (order.defined()) pick = order.gather(1, pick);
    token = at::where(greedy_, token, pick.squeeze(1));
  }
  at::Tensor logprob = lf.gather(-1, token.unsqueeze(-1)).squeeze(-1) - lf.logsumexp(-1);
  step_.add_(1);
  return {token, logprob};
}

}  // namespace kz::model
