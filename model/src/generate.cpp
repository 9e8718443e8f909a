// Batched generation (prefill + cached decode, per-request sampling) and teacher-forced log-probs.
#include "kz/model/generate.h"

#include "kz/model/decode_loop.h"
#include "torch_status.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace kz::model {
namespace {

// A random stream on the logits' device, so sampling never copies a vocabulary row to the host.
at::Generator make_generator(at::Device device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  at::Generator gen = at::globalContext().getAcceleratorHooksInterface(device.type()).getNewGenerator(device.index());
  gen.set_current_seed(seed);
  return gen;
}

// Temperature, top-k and top-p applied to one row of float32 logits [V], then one draw. Returns
// a one-element tensor on the logits' device (no host sync per row).
at::Tensor sample_row(at::Tensor x, const SamplingOptions& s, at::Generator& gen) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  x = x / s.temperature;
  if (s.top_k > 0 && s.top_k < x.size(0)) {
    at::Tensor kth = std::get<0>(x.topk(s.top_k)).narrow(0, s.top_k - 1, 1);
    x = x.masked_fill(x < kth, neg_inf);
  }
  if (s.top_p < 1.0) {
    auto [sorted, order] = x.sort(/*dim=*/0, /*descending=*/true);
    at::Tensor probs = sorted.softmax(0);
    // Drop a token when the tokens above it already reach top_p; the most likely always stays.
    at::Tensor drop = (probs.cumsum(0) - probs) >= s.top_p;
    x = x.scatter(0, order, sorted.masked_fill(drop, neg_inf));
  }
  return at::multinomial(x.softmax(0), 1, /*replacement=*/false, gen);
}

Status validate_requests(const std::vector<GenerateRequest>& requests, int64_t vocab_size) {
  if (requests.empty()) return invalid_argument("generate: no requests");
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    std::string where = fmt::format("generate: request {}", i);
    if (r.prompt_ids.empty()) return invalid_argument(where + ": empty prompt");
    for (int64_t id : r.prompt_ids)
      if (id < 0 || id >= vocab_size)
        return invalid_argument(fmt::format("{}: token id {} outside the vocabulary [0, {})", where, id, vocab_size));
    KZ_RETURN_IF_ERROR(r.sampling.validate().with_context(where));
  }
  return Status::ok();
}

// Per-row state of one generate() call.
struct Row {
  const SamplingOptions* sampling;
  const GenerateRequest* request;
  at::Generator gen;
  GenerateResult result;
  bool done = false;
};

// Chooses each running row's next token from logits [B, V]; returns the tokens (pads for
// finished rows) and records tokens and log-probs in the rows. One host copy per step.
std::vector<int64_t> choose_tokens(const at::Tensor& logits, std::vector<Row>& rows, int64_t pad_id) {
  at::Tensor lf = logits.to(at::kFloat);
  at::Tensor chosen = lf.argmax(-1);  // greedy rows keep this
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].done || rows[i].sampling->temperature == 0) continue;
    auto row = static_cast<int64_t>(i);
    chosen.narrow(0, row, 1).copy_(sample_row(lf.select(0, row), *rows[i].sampling, rows[i].gen));
  }
  // Log-probs under the unmodified distribution (see generate.h).
  at::Tensor lp = lf.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - lf.logsumexp(-1);
  at::Tensor host = at::stack({chosen.to(at::kDouble), lp.to(at::kDouble)}).to(at::kCPU);
  auto a = host.accessor<double, 2>();
  std::vector<int64_t> tokens(rows.size(), pad_id);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].done) continue;
    auto row = static_cast<int64_t>(i);
    tokens[i] = static_cast<int64_t>(a[0][row]);  // exact: vocabulary ids are far below 2^53
    rows[i].result.token_ids.push_back(tokens[i]);
    rows[i].result.logprobs.push_back(static_cast<float>(a[1][row]));
  }
  return tokens;
}

// Marks rows that hit a stop token or their token limit.
bool update_finished(std::vector<Row>& rows) {
  bool all_done = true;
  for (auto& row : rows) {
    if (row.done) continue;
    const auto& stops = row.sampling->stop_token_ids;
    int64_t last = row.result.token_ids.back();
    if (std::find(stops.begin(), stops.end(), last) != stops.end()) {
      row.result.finish_reason = FinishReason::stop;
      row.done = true;
    } else if (static_cast<int64_t>(row.result.token_ids.size()) >= row.sampling->max_new_tokens) {
      row.result.finish_reason = FinishReason::length;
      row.done = true;
    } else if (row.request->stop_check && row.request->stop_check(row.result.token_ids)) {
      row.result.finish_reason = FinishReason::stop;
      row.done = true;
    }
    all_done = all_done && row.done;
  }
  return all_done;
}

// Appends chunk [B, n] of tokens and log-probs (host tensors) to the running rows, stopping each
// row at a stop token or its limit like update_finished; returns whether every row is done.
bool append_chunk(const at::Tensor& tokens, const at::Tensor& logprobs, std::vector<Row>& rows) {
  auto t = tokens.accessor<int64_t, 2>();
  auto lp = logprobs.accessor<float, 2>();
  for (int64_t j = 0; j < tokens.size(1); ++j) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].done) continue;
      auto row = static_cast<int64_t>(i);
      rows[i].result.token_ids.push_back(t[row][j]);
      rows[i].result.logprobs.push_back(lp[row][j]);
    }
    if (update_finished(rows)) return true;
  }
  return false;
}

// All-greedy batches after the prefill: the device-side loop, one host copy per chunk.
Status greedy_loop(CausalLM& model, KVCache& cache, std::vector<Row>& rows, const GenerateOptions& options) {
  auto loop = GreedyLoop::create(model, cache, {.cuda_graph = options.cuda_graph});
  if (!loop.ok()) return loop.status();
  at::Tensor last = at::empty({static_cast<int64_t>(rows.size())}, at::kLong);
  for (size_t i = 0; i < rows.size(); ++i) last[static_cast<int64_t>(i)] = rows[i].result.token_ids.back();
  for (;;) {
    int64_t steps = std::min(std::max<int64_t>(options.stop_check_steps, 1), cache.capacity() - cache.length);
    auto out = (*loop)->run(last, steps);
    if (!out.ok()) return out.status();
    at::Tensor tokens = out->tokens.to(at::kCPU), logprobs = out->logprobs.to(at::kCPU);
    if (append_chunk(tokens, logprobs, rows)) return Status::ok();
    last = tokens.select(1, steps - 1).contiguous();
  }
}

Result<std::vector<GenerateResult>> run_generation(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                                   const GenerateOptions& options) {
  c10::NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_new = 0;
  std::vector<Row> rows;
  for (const auto& r : requests) {
    prompts.push_back(r.prompt_ids);
    max_new = std::max(max_new, r.sampling.max_new_tokens);
    rows.push_back(Row{&r.sampling, &r, make_generator(model.device(), r.sampling.seed), {}});
  }
  auto [ids, mask] = left_pad(prompts, options.pad_token_id);
  // The last new token is never fed back, so it needs no slot.
  KVCache cache = model.new_cache(ids.size(0), ids.size(1) + max_new - 1);
  auto logits = model.prefill(ids, mask, cache);
  if (!logits.ok()) return logits.status();
  bool all_greedy = std::all_of(requests.begin(), requests.end(),
                                [](const GenerateRequest& r) { return r.sampling.temperature == 0; });
  if (all_greedy && options.greedy_device_loop) {
    choose_tokens(*logits, rows, options.pad_token_id);  // the first token, from the prefill
    if (!update_finished(rows)) KZ_RETURN_IF_ERROR(greedy_loop(model, cache, rows, options));
  } else {
    for (;;) {  // one host copy per step (per-row sampling)
      std::vector<int64_t> tokens = choose_tokens(*logits, rows, options.pad_token_id);
      if (update_finished(rows)) break;
      logits = model.decode(at::tensor(tokens, at::kLong), cache);
      if (!logits.ok()) return logits.status();
    }
  }
  std::vector<GenerateResult> out;
  for (auto& row : rows) out.push_back(std::move(row.result));
  return out;
}

}  // namespace

Status SamplingOptions::validate() const {
  if (!(temperature >= 0)) return invalid_argument(fmt::format("temperature must be >= 0, got {}", temperature));
  if (top_k < 0) return invalid_argument(fmt::format("top_k must be >= 0, got {}", top_k));
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument(fmt::format("top_p must be in (0, 1], got {}", top_p));
  if (max_new_tokens < 1) return invalid_argument(fmt::format("max_new_tokens must be >= 1, got {}", max_new_tokens));
  return Status::ok();
}

const char* finish_reason_name(FinishReason reason) { return reason == FinishReason::stop ? "stop" : "length"; }

std::pair<at::Tensor, at::Tensor> left_pad(const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id) {
  size_t width = 0;
  for (const auto& s : sequences) width = std::max(width, s.size());
  const auto b = static_cast<int64_t>(sequences.size()), t = static_cast<int64_t>(width);
  at::Tensor ids = at::full({b, t}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({b, t}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& s = sequences[static_cast<size_t>(i)];
    int64_t start = t - static_cast<int64_t>(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      ids_a[i][start + static_cast<int64_t>(j)] = s[j];
      mask_a[i][start + static_cast<int64_t>(j)] = 1;
    }
  }
  return {ids, mask};
}

Result<std::vector<GenerateResult>> generate(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                             const GenerateOptions& options) {
  KZ_RETURN_IF_ERROR(validate_requests(requests, model.config().vocab_size));
  return guarded("generate", [&] { return run_generation(model, requests, options); });
}

Result<at::Tensor> token_logprobs(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  bool keep_graph) {
  return guarded("token_logprobs", [&]() -> Result<at::Tensor> {
    if (input_ids.dim() != 2 || input_ids.size(1) < 2)
      return invalid_argument("token_logprobs: input_ids must be [B, T] with T >= 2");
    c10::AutoGradMode grad_mode(keep_graph && c10::GradMode::is_enabled());
    auto logits = model.logits(input_ids, attention_mask);
    if (!logits.ok()) return logits.status().with_context("token_logprobs");
    const int64_t t = input_ids.size(1);
    at::Tensor lf = logits->narrow(1, 0, t - 1).to(at::kFloat);
    at::Tensor targets = input_ids.narrow(1, 1, t - 1).to(lf.device());
    at::Tensor lp = lf.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lf.logsumexp(-1);
    if (attention_mask.defined()) {
      at::Tensor pad = attention_mask.narrow(1, 1, t - 1).to(lp.device()).eq(0);
      lp = lp.masked_fill(pad, 0.0);
    }
    return lp;
  });
}

}  // namespace kz::model
