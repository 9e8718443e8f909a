// Generation and scoring on token ids with a CausalLM.
//
// generate(): one batch of requests, left-padded, prefilled together, then decoded one token per
// step with a preallocated KV cache until every request has stopped. Each request samples with
// its own settings and its own random stream (seeded per request): the same request with the same
// seed gives the same tokens whatever else is in the batch (up to floating-point differences of
// batched matrix products on some devices).
//
// Log-probs: GenerateResult::logprobs[i] is log p(token_i) under the model's *unmodified*
// distribution (softmax of the raw logits: temperature 1, no top-k/top-p), i.e. what the RL
// trainer's teacher-forced token_logprobs() recomputes for the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/model/transformer.h"

namespace kz::model {

struct SamplingOptions {
  double temperature = 1.0;               // 0: greedy (argmax)
  int64_t top_k = 0;                      // keep the k most likely tokens; 0: all
  double top_p = 1.0;                     // nucleus: smallest set with mass >= top_p; 1: all
  uint64_t seed = 0;                      // this request's random stream
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_token_ids;    // e.g. the config's eos ids; the stop token is kept
  Status validate() const;
};

struct GenerateRequest {
  std::vector<int64_t> prompt_ids;  // not empty
  SamplingOptions sampling;
  // Optional: called on the host with this row's new tokens after each step that added one (not
  // after the step that ends the row anyway); true ends the row with FinishReason::stop. For
  // stop strings, which need the decoded text.
  std::function<bool(const std::vector<int64_t>& new_tokens)> stop_check;
};

enum class FinishReason { stop, length };
const char* finish_reason_name(FinishReason reason);  // "stop", "length" (OpenAI's words)

struct GenerateResult {
  std::vector<int64_t> token_ids;  // new tokens only; ends with the stop token when reason is stop
  std::vector<float> logprobs;     // one per token_ids entry, see the header comment
  FinishReason finish_reason = FinishReason::length;
};

struct GenerateOptions {
  int64_t pad_token_id = 0;  // fills left padding (never attended to, any valid id works)
  // When every request is greedy: decode with GreedyLoop (argmax on the device) and copy tokens
  // to the host only every stop_check_steps steps; rows that stopped in between are truncated.
  bool greedy_device_loop = true;
  int64_t stop_check_steps = 16;
  // ...and capture its step as a CUDA graph (costs a warm-up and a capture per call: worth it for
  // long generations). Off until measured on the GPU (bench/model_bench.py uses the loop directly).
  bool cuda_graph = false;
};

// Runs all requests as one batch. Errors: invalid settings or token ids (naming the request
// index), or a libtorch failure.
Result<std::vector<GenerateResult>> generate(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                             const GenerateOptions& options = {});

// Teacher-forced log-probs of given sequences: input_ids [B, T] (int64), attention_mask [B, T]
// (1 token, 0 pad; any padding pattern). Returns [B, T-1] float32 where out[b, t] =
// log p(input_ids[b, t+1] | input_ids[b, ..t]), and 0 where input_ids[b, t+1] is a pad.
// keep_graph = true keeps the autograd graph (the RL policy loss backpropagates through it);
// false runs under NoGradGuard and saves the activations' memory.
Result<at::Tensor> token_logprobs(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  bool keep_graph);

// Left-pads id lists into input_ids and attention_mask [B, max length] (CPU int64).
std::pair<at::Tensor, at::Tensor> left_pad(const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id);

}  // namespace kz::model
