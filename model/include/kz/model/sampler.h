// Token choice on the device: temperature, top-k, top-p and a per-row random stream, with no host
// sync, so a CUDA graph can capture it with the decode step (decode_loop.h).
//
// Each row draws one uniform per step from a counter-based hash of (its seed, the step), then
// inverts the cumulative distribution of its filtered probabilities. A row's tokens depend on its
// own seed and logits only, never on what else is in the batch or on a generator's state, and the
// step counter is a device tensor advanced in place, which a replayed graph advances too.
// Rows of temperature 0 take the argmax. Log-probs are under the unmodified distribution (softmax
// of the raw logits), as generate.h defines them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "kz/core/status.h"

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

class Sampler {
 public:
  // One row per entry of `rows` (validated settings), tensors on `device`.
  Sampler(const std::vector<SamplingOptions>& rows, at::Device device);
  // Every row greedy: the argmax and its log-prob, nothing else computed.
  static Sampler greedy(int64_t rows, at::Device device);

  // The next token of every row from float32 logits [B, V]: tokens [B] int64 and their log-probs
  // [B] float32, on the logits' device. Advances the step counter.
  std::pair<at::Tensor, at::Tensor> choose(const at::Tensor& logits);

  // The device step counter (int64 [1]): a graph's warm-up steps advance it, and capture puts it back.
  at::Tensor& step() { return step_; }
  int64_t rows() const { return rows_; }

 private:
  Sampler(int64_t rows, at::Device device);
  at::Tensor uniforms() const;  // [B] float32 in (0, 1): this step's draw of every row

  int64_t rows_ = 0;
  bool all_greedy_ = true;
  bool filters_ = false;    // some row has top_k or top_p: sort each step
  at::Tensor greedy_;       // [B] bool
  at::Tensor inv_temperature_;  // [B] float32 (1 for greedy rows: their draw is discarded)
  at::Tensor top_k_;        // [B] int64, V or more for none
  at::Tensor top_p_;        // [B] float32
  at::Tensor seed_key_;     // [B] int64 in [0, 2^32): each row's seed hashed once, mixed with the step
  at::Tensor step_;         // [1] int64
};

}  // namespace kz::model
