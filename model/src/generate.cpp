// Batched generation (prefill + cached decode, per-request sampling) and teacher-forced log-probs.
#include "kz/model/generate.h"

#include "kz/model/decode_loop.h"
#include "torch_status.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace kz::model {
namespace {

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
  const GenerateRequest* request;
  GenerateResult result;
  bool done = false;
};

// Marks rows that hit a stop token or their token limit.
bool update_finished(std::vector<Row>& rows) {
  bool all_done = true;
  for (auto& row : rows) {
    if (row.done) continue;
    const auto& stops = row.request->sampling.stop_token_ids;
    int64_t last = row.result.token_ids.back();
    if (std::find(stops.begin(), stops.end(), last) != stops.end()) {
      row.result.finish_reason = FinishReason::stop;
      row.done = true;
    } else if (static_cast<int64_t>(row.result.token_ids.size()) >= row.request->sampling.max_new_tokens) {
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

// Hands each row that grew in the last chunk its result so far (generate.h's on_progress);
// had[i]: row i's token count before the chunk.
void report_progress(const std::vector<Row>& rows, const std::vector<size_t>& had) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (row.request->on_progress && row.result.token_ids.size() > had[i]) row.request->on_progress(row.result, row.done);
  }
}

// Appends chunk [B, n] of tokens and log-probs (host tensors) to the running rows, stopping each
// row at a stop token or its limit like update_finished, and reports the rows' progress; returns
// whether every row is done.
bool append_chunk(const at::Tensor& tokens, const at::Tensor& logprobs, std::vector<Row>& rows) {
  std::vector<size_t> had;
  for (const auto& row : rows) had.push_back(row.result.token_ids.size());
  auto t = tokens.accessor<int64_t, 2>();
  auto lp = logprobs.accessor<float, 2>();
  bool all_done = false;
  for (int64_t j = 0; j < tokens.size(1) && !all_done; ++j) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].done) continue;
      auto row = static_cast<int64_t>(i);
      rows[i].result.token_ids.push_back(t[row][j]);
      rows[i].result.logprobs.push_back(lp[row][j]);
    }
    all_done = update_finished(rows);
  }
  report_progress(rows, had);
  return all_done;
}

std::vector<GenerateResult> collect(std::vector<Row>& rows) {
  std::vector<GenerateResult> out;
  for (auto& row : rows) out.push_back(std::move(row.result));
  return out;
}

Result<std::vector<GenerateResult>> run_generation(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                                   const GenerateOptions& options) {
  c10::NoGradGuard no_grad;
  // Each distinct prompt is prefilled once; rows that share it (a GRPO group's samples) fork its
  // cache. prompt_of[i]: row i's distinct prompt.
  std::vector<std::vector<int64_t>> prompts;
  std::map<std::vector<int64_t>, int64_t> prompt_index;
  std::vector<int64_t> prompt_of;
  std::vector<SamplingOptions> sampling;
  int64_t max_new = 0;
  std::vector<Row> rows;
  for (const auto& r : requests) {
    auto [it, added] = prompt_index.emplace(r.prompt_ids, static_cast<int64_t>(prompts.size()));
    if (added) prompts.push_back(r.prompt_ids);
    prompt_of.push_back(it->second);
    sampling.push_back(r.sampling);
    max_new = std::max(max_new, r.sampling.max_new_tokens);
    rows.push_back(Row{&r, {}});
  }
  auto [ids, mask] = left_pad(prompts, options.pad_token_id);
  // The last new token is never fed back, so it needs no slot.
  KVCache cache = model.new_cache(ids.size(0), ids.size(1) + max_new - 1);
  auto logits = model.prefill(ids, mask, cache);
  if (!logits.ok()) return logits.status();
  if (prompts.size() < requests.size()) {
    at::Tensor fork = at::tensor(prompt_of, at::kLong).to(model.device());
    cache = cache.select_rows(fork);
    *logits = logits->index_select(0, fork);
  }
  Sampler sampler(sampling, model.device());
  auto [first, first_logprob] = sampler.choose(*logits);  // the first token, from the prefill
  // A row still running after it needs another token, so max_new >= 2 and the cache has a free slot.
  if (append_chunk(first.unsqueeze(1).to(at::kCPU), first_logprob.unsqueeze(1).to(at::kCPU), rows))
    return collect(rows);
  auto loop = DecodeLoop::create(model, cache, std::move(sampler), {.cuda_graph = options.cuda_graph});
  if (!loop.ok()) return loop.status();
  at::Tensor last = first;
  for (;;) {
    int64_t steps = std::min(std::max<int64_t>(options.stop_check_steps, 1), cache.capacity() - cache.length);
    auto out = (*loop)->run(last, steps);
    if (!out.ok()) return out.status();
    if (append_chunk(out->tokens.to(at::kCPU), out->logprobs.to(at::kCPU), rows)) break;
    last = out->tokens.select(1, steps - 1).contiguous();
  }
  return collect(rows);
}

}  // namespace

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
