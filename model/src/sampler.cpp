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
  step_ = at::zeros({rows}, at::TensorOptions().device(device).dtype(at::kLong));
}

Sampler Sampler::greedy(int64_t rows, at::Device device) { return Sampler(rows, device); }

Sampler::Sampler(const std::vector<SamplingOptions>& rows, at::Device device)
    : Sampler(static_cast<int64_t>(rows.size()), device) {
  std::vector<uint8_t> greedy, filtered;
  std::vector<float> inv_temperature, top_p;
  std::vector<int64_t> top_k, seed_lo, seed_hi;  // each seed's two 32-bit halves
  for (const auto& r : rows) {
    bool is_greedy = r.temperature == 0;
    bool is_filtered = r.filtered();
    all_greedy_ = all_greedy_ && is_greedy;
    filters_ = filters_ || is_filtered;
    plain_ = plain_ || (!is_greedy && !is_filtered);
    greedy.push_back(is_greedy);
    filtered.push_back(is_filtered);
    inv_temperature.push_back(is_greedy ? 1.0f : static_cast<float>(1.0 / r.temperature));
    top_k.push_back(r.top_k > 0 ? r.top_k : std::numeric_limits<int64_t>::max());
    top_p.push_back(static_cast<float>(r.top_p));
    seed_lo.push_back(static_cast<int64_t>(r.seed & 0xffffffffULL));
    seed_hi.push_back(static_cast<int64_t>(r.seed >> 32));
  }
  auto on = [&](at::Tensor t) { return t.to(device); };
  auto flags = [&](const std::vector<uint8_t>& v) {
    return on(at::tensor(std::vector<int64_t>(v.begin(), v.end()), at::kLong).to(at::kBool));
  };
  greedy_ = flags(greedy);
  filtered_ = flags(filtered);
  inv_temperature_ = on(at::tensor(inv_temperature, at::kFloat));
  top_k_ = on(at::tensor(top_k, at::kLong));
  top_p_ = on(at::tensor(top_p, at::kFloat));
  seed_key_ = mix32(mix32(on(at::tensor(seed_lo, at::kLong)).bitwise_xor(0x5851f42dLL))
                        .bitwise_xor(on(at::tensor(seed_hi, at::kLong))));
}

Sampler Sampler::select_rows(const at::Tensor& rows) const {
  Sampler out = *this;
  at::Tensor index = rows.to(step_.device());
  for (at::Tensor* t : row_state(out))
    if (t->defined()) *t = t->index_select(0, index);
  out.rows_ = index.size(0);
  return out;
}

Sampler Sampler::with_filtering() const {
  Sampler out = *this;
  out.filters_ = true;  // rows that do not filter keep their own pick (filtered_ is per row)
  return out;
}

Status Sampler::replace_rows(const at::Tensor& rows, const Sampler& from) {
  bool paths_covered = (from.all_greedy_ || !all_greedy_) && (!from.filters_ || filters_) && (!from.plain_ || plain_);
  if (!paths_covered || (!all_greedy_ && !from.greedy_.defined()))
    return invalid_argument("sampler: the new rows need a sampling path this batch's sampler does not compute");
  if (rows.dim() != 1 || rows.size(0) != from.rows_)
    return invalid_argument(fmt::format("sampler: {} rows to replace from a sampler of {}", rows.numel(), from.rows_));
  at::Tensor index = rows.to(step_.device());
  auto mine = row_state(*this);
  auto theirs = row_state(from);
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i]->defined()) mine[i]->index_copy_(0, index, *theirs[i]);
  return Status::ok();
}

at::Tensor Sampler::uniforms() const {
  at::Tensor h = mix32(seed_key_.bitwise_xor(step_.bitwise_and(kLow32)));
  // The top 24 bits, centred in their bucket: exact in float32, never 0 or 1.
  return (h.bitwise_right_shift(8).to(at::kFloat) + 0.5f) * (1.0f / 16777216.0f);
}

namespace {
// Inverse CDF: per row, the first position whose cumulative mass reaches u * total (total > 0, u
// in (0, 1)), which is never a position of zero mass. probs [B, V], u [B]; returns [B, 1].
at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u) {
  at::Tensor cdf = probs.cumsum(-1);
  at::Tensor target = (u * cdf.select(-1, cdf.size(-1) - 1)).unsqueeze(1);
  return at::searchsorted(cdf, target).clamp_max(cdf.size(-1) - 1);
}
}  // namespace

at::Tensor Sampler::sample(const at::Tensor& logits) const {
  const int64_t vocab = logits.size(-1);
  at::Tensor scaled = logits * inv_temperature_.unsqueeze(1);
  at::Tensor u = uniforms();
  at::Tensor pick;
  if (plain_) pick = inverse_cdf(scaled.softmax(-1), u).squeeze(1);
  if (filters_) {
    auto [sorted, order] = scaled.sort(/*dim=*/-1, /*descending=*/true);
    at::Tensor rank = at::arange(vocab, order.options()).unsqueeze(0);
    sorted = sorted.masked_fill(rank >= top_k_.unsqueeze(1), -std::numeric_limits<float>::infinity());
    at::Tensor probs = sorted.softmax(-1);
    // Drop a token when the tokens above it already reach top_p; the most likely always stays.
    probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p_.unsqueeze(1), 0.0);
    at::Tensor filtered_pick = order.gather(1, inverse_cdf(probs, u)).squeeze(1);
    pick = pick.defined() ? at::where(filtered_, filtered_pick, pick) : filtered_pick;
  }
  return pick;
}

std::pair<at::Tensor, at::Tensor> Sampler::choose(const at::Tensor& logits) {
  at::Tensor lf = logits.to(at::kFloat);
  at::Tensor token = lf.argmax(-1);
  if (!all_greedy_) token = at::where(greedy_, token, sample(lf));
  at::Tensor logprob = lf.gather(-1, token.unsqueeze(-1)).squeeze(-1) - lf.logsumexp(-1);
  step_.add_(1);
  return {token, logprob};
}

}  // namespace kz::model
