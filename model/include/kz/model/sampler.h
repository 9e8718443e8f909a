// Token choice on the device: temperature, top-k, top-p and a per-row random stream, with no host
// sync, so a CUDA graph can capture it with the decode step (decode_loop.h).
//
// Each row draws one uniform per token from a counter-based hash of (its seed, its own token
// index), then inverts the cumulative distribution of its probabilities (filtered by top-k/top-p,
// in sorted order, for rows that filter; over the whole vocabulary otherwise). A row's tokens
// depend on its own settings, seed and logits only, never on what else is in the batch, where its
// row sits or when it joined (generate.h's continuous batching moves rows between batches), and
// the token indices are a device tensor advanced in place, which a replayed graph advances too.
// Rows of temperature 0 take the argmax. Log-probs are under the unmodified distribution (softmax
// of the raw logits), as generate.h defines them.
#pragma once

#include <ATen/ATen.h>

#include <array>
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
  // Sampled with top_k or top_p: the path that sorts the vocabulary each step.
  bool filtered() const { return temperature > 0 && (top_k > 0 || top_p < 1); }
};

class Sampler {
 public:
  // One row per entry of `rows` (validated settings), tensors on `device`.
  Sampler(const std::vector<SamplingOptions>& rows, at::Device device);
  // Every row greedy: the argmax and its log-prob, nothing else computed.
  static Sampler greedy(int64_t rows, at::Device device);

  // The next token of every row from float32 logits [B, V]: tokens [B] int64 and their log-probs
  // [B] float32, on the logits' device. Advances every row's token index.
  std::pair<at::Tensor, at::Tensor> choose(const at::Tensor& logits);

  // A sampler whose row i is this sampler's row rows[i] (int64 [B'] on any device), token index
  // included; it computes the same paths (greedy, plain, filtered) as this one, so its rows can
  // later be written back with replace_rows.
  Sampler select_rows(const at::Tensor& rows) const;
  // This sampler, computing the top-k/top-p path too (for rows that may take it later: replace_rows).
  // Needs a sampler that is not all greedy (one built from per-row settings).
  Sampler with_filtering() const;
  // Row rows[i] of this sampler becomes row i of `from`, in place (a captured graph stays valid).
  // Errors: `from` needs a path this sampler does not compute (build this one from the options of
  // every row it may take, then narrow it with select_rows), or the sizes differ.
  Status replace_rows(const at::Tensor& rows, const Sampler& from);

  // Every row's token index (int64 [B]): a graph's warm-up steps advance it, and capture puts it back.
  at::Tensor& step() { return step_; }
  int64_t rows() const { return rows_; }

 private:
  Sampler(int64_t rows, at::Device device);
  at::Tensor uniforms() const;  // [B] float32 in (0, 1): every row's draw for its next token
  at::Tensor sample(const at::Tensor& logits) const;  // [B] sampled tokens of float32 logits [B, V]
  // The per-row tensors, in one order (select_rows, replace_rows); const for a const sampler.
  template <typename Self>
  static auto row_state(Self& s) {
    return std::array{&s.greedy_, &s.filtered_, &s.inv_temperature_, &s.top_k_, &s.top_p_, &s.seed_key_, &s.step_};
  }

  int64_t rows_ = 0;
  // The paths choose() computes; each row takes its own (greedy_, filtered_), so these only say
  // which rows may come up.
  bool all_greedy_ = true;
  bool filters_ = false;    // some row has top_k or top_p: sort each step
  bool plain_ = false;      // some row samples without filters
  at::Tensor greedy_;       // [B] bool
  at::Tensor filtered_;     // [B] bool: samples from the sorted, filtered distribution
  at::Tensor inv_temperature_;  // [B] float32 (1 for greedy rows: their draw is discarded)
  at::Tensor top_k_;        // [B] int64, V or more for none
  at::Tensor top_p_;        // [B] float32
  at::Tensor seed_key_;     // [B] int64 in [0, 2^32): each row's seed hashed once, mixed with step_
  at::Tensor step_;         // [B] int64: each row's token index
};

}  // namespace kz::model
