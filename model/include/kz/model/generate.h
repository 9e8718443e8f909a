// Generation and scoring on token ids with a CausalLM.
//
// generate(): continuous batching. Requests run in a batch of at most max_batch_rows rows (all of
// them by default), decoded on the device (decode_loop.h) with a preallocated KV cache, tokens
// copied to the host every few steps. At those copies finished rows are freed and waiting
// requests join in their place (their prompts prefilled apart, each distinct prompt once, then
// copied into the freed rows; the cache holds the longest prompt plus the most new tokens, and a
// joiner that finds no room even after the live rows' slots are compacted waits for them to
// finish); once nothing waits and at most half the rows are live, the batch shrinks to its live
// rows (a new CUDA graph each time), so compute and memory follow the live sequences. Each
// request samples with its own settings and its own random stream (sampler.h, seeded per request,
// indexed by the request's own tokens): the same request with the same seed gives the same tokens
// whatever else is in the batch and whenever it joined (up to floating-point differences of
// batched matrix products on some devices).
//
// Serving: GenerateOptions::admit hands the batch requests that arrived after it started; they
// wait and join like the call's own requests. Such a batch takes power-of-two row counts: it grows
// (up to max_batch_rows) to the one that seats its waiting requests, and shrinks, once at most a
// quarter of its rows are live, to the one of twice the live rows. A request that has finished,
// with every request before it, is dropped, so a batch that arrivals keep alive holds only what
// is live, waiting, or finished behind a longer request.
//
// Log-probs: GenerateResult::logprobs[i] is log p(token_i) under the model's *unmodified*
// distribution (softmax of the raw logits: temperature 1, no top-k/top-p), i.e. what the RL
// trainer's teacher-forced token_logprobs() recomputes for the same tokens (at temperature 1).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/model/sampler.h"
#include "kz/model/transformer.h"

namespace kz::model {

enum class FinishReason { stop, length };
const char* finish_reason_name(FinishReason reason);  // "stop", "length" (OpenAI's words)

struct GenerateResult {
  std::vector<int64_t> token_ids;  // new tokens only; ends with the stop token when reason is stop
  std::vector<float> logprobs;     // one per token_ids entry, see the header comment
  FinishReason finish_reason = FinishReason::length;
};

struct GenerateRequest {
  std::vector<int64_t> prompt_ids;  // not empty
  SamplingOptions sampling;
  // Optional: called on the host with this row's new tokens after each step that added one (not
  // after the step that ends the row anyway); true ends the row with FinishReason::stop. For
  // stop strings, which need the decoded text.
  std::function<bool(const std::vector<int64_t>& new_tokens)> stop_check;
  // Optional, for streaming: called on the host with this row's result so far each time its new
  // tokens reach the host (after the prefill, then every stop_check_steps steps, so streaming adds
  // no device sync), and a last time with finished = true (finish_reason then set).
  std::function<void(const GenerateResult& so_far, bool finished)> on_progress;
};

struct GenerateStats {
  int64_t peak_rows = 0;          // the widest batch decoded
  int64_t joins = 0;              // requests that joined a batch already under way
  int64_t compactions = 0;        // times live rows' slots moved to make room for joiners
  int64_t shrinks = 0;            // times the batch was narrowed (to its live rows, or their bucket)
  int64_t grows = 0;              // times the batch was widened to seat admitted requests
  int64_t admitted = 0;           // requests taken from GenerateOptions::admit
  int64_t prefilled_prompts = 0;  // prompts prefilled (each distinct prompt once)
  int64_t decode_row_steps = 0;   // decode steps x batch rows computed, finished rows included
};

struct GenerateOptions {
  int64_t pad_token_id = 0;  // fills left padding (never attended to, any valid id works)
  // Tokens are copied to the host, and stops checked, every stop_check_steps steps; rows that
  // stopped in between are truncated (their extra steps cost compute, not results).
  int64_t stop_check_steps = 16;
  // Capture the decode step as a CUDA graph on CUDA devices (a warm-up and a capture per call, then
  // one launch per token instead of the step's hundreds); where capture fails, the step runs
  // eagerly. false: always eager.
  bool cuda_graph = true;
  // Rows decoded at once; more requests wait and join as rows finish. 0: every request at once.
  int64_t max_batch_rows = 0;
  // Optional: filled with what the call did, for benchmarks.
  GenerateStats* stats = nullptr;
  // Optional, for a server: called before the first step and at each copy to the host with the
  // cache's capacity in slots (fixed when the call starts, from its own requests); returns newly
  // arrived requests, each valid (check_request) and with prompt + max_new_tokens - 1 <= capacity
  // (the others stay with the caller for a later call). They join the batch as the call's own
  // requests do, and their results reach them only through on_progress(result, true): the call
  // returns its own requests' results. With a hook, the sampler also computes the greedy and plain
  // sampled paths; the top-k/top-p path (a sort over the vocabulary each step) only once a request
  // needs it (a new CUDA graph at the next chunk). The batch grows to seat waiting requests (up to
  // max_batch_rows; 0: no bound).
  std::function<std::vector<GenerateRequest>(int64_t capacity)> admit;
};

// A request's settings and token ids against the model's vocabulary; errors name no request.
Status check_request(const GenerateRequest& request, int64_t vocab_size);

// Cache slots a request needs alone: its prompt and every new token but the last (never fed
// back). What GenerateOptions::admit compares with the capacity.
int64_t cache_slots_needed(const GenerateRequest& request);

// Runs the requests (see the header comment). Errors: invalid settings or token ids (naming the
// request index), or a libtorch failure.
Result<std::vector<GenerateResult>> generate(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                             const GenerateOptions& options = {});

// Teacher-forced log-probs of given sequences: input_ids [B, T] (int64), attention_mask [B, T]
// (1 token, 0 pad; any padding pattern). Returns [B, T-1] float32 where out[b, t] =
// log p(input_ids[b, t+1] | input_ids[b, ..t]), and 0 where input_ids[b, t+1] is a pad.
// keep_graph = true keeps the autograd graph (the RL policy loss backpropagates through it);
// false runs under NoGradGuard and saves the activations' memory. temperature: log-probs of
// softmax(logits / temperature) (> 0), the distribution a sampler at that temperature draws from.
Result<at::Tensor> token_logprobs(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  bool keep_graph, double temperature = 1.0);

// Left-pads id lists into input_ids and attention_mask [B, max length] (CPU int64).
std::pair<at::Tensor, at::Tensor> left_pad(const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id);

}  // namespace kz::model
