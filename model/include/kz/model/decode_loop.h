// Decoding on the device: each step is CausalLM::decode_step plus the Sampler's token choice
// (argmax, or temperature/top-k/top-p sampling with per-row streams), optionally captured once as
// a CUDA graph and replayed per token, with no host sync inside the loop.
//
// The step feeds a static token buffer [B] and writes its choice back into it, so replay i
// consumes the token replay i-1 chose; chosen tokens and their log-probs (under the unmodified
// distribution, as generate.h defines them) are copied into output columns by small kernels
// queued after each replay. The caller syncs when it reads them (e.g. every k steps to check stop
// tokens, or once at the end).
//
// Capturing: the cache must already be prefilled (the graph is recorded against its tensors, so
// keep the cache and the loop together; KVCache::reset + prefill keeps the graph valid). Capture
// runs two eager warm-up steps on a side stream (cuBLAS workspaces, kernel selection) and then
// restores the cache's slot, positions and mask and the sampler's token indices, so it costs no
// slots and no draws. CUDA graphs need a CUDA device and a build against libtorch's CUDA headers
// (KZ_MODEL_CUDA_GRAPHS); elsewhere, or with cuda_graph = false, the same step runs eagerly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kz/core/status.h"
#include "kz/model/sampler.h"
#include "kz/model/transformer.h"

namespace kz::model {

struct DecodeLoopOptions {
  bool cuda_graph = true;  // capture the step on CUDA devices; false: always eager
};

// Outputs of DecodeLoop::run, on the model's device.
struct DecodedTokens {
  at::Tensor tokens;    // [B, steps] int64: the token chosen after each step
  at::Tensor logprobs;  // [B, steps] float32: log p(token) under the raw logits
};

class DecodeLoop {
 public:
  // Errors: an empty or full cache, a sampler for another batch size. A failed capture is not an
  // error: the loop runs eagerly and graph_error() says why.
  static Result<std::unique_ptr<DecodeLoop>> create(CausalLM& model, KVCache& cache, Sampler sampler,
                                                    const DecodeLoopOptions& options = {});
  ~DecodeLoop();

  // Feeds `first` [B] (int64, e.g. sampler().choose() of the prefill logits) and runs `steps`
  // decode steps; the cache advances by `steps` slots. Errors: too few free slots, a libtorch failure.
  Result<DecodedTokens> run(const at::Tensor& first, int64_t steps);

  Sampler& sampler() { return sampler_; }
  bool uses_graph() const;
  const std::string& graph_error() const { return graph_error_; }  // empty when captured or not tried
  double capture_s() const { return capture_s_; }                   // warm-up + capture wall time

 private:
  struct Graph;  // the at::cuda::CUDAGraph, only in CUDA builds
  DecodeLoop(CausalLM& model, KVCache& cache, Sampler sampler);
  void step();   // decode_step + the sampler's choice into token_ and logprob_
  void capture();

  CausalLM& model_;
  KVCache& cache_;
  Sampler sampler_;
  at::Tensor token_;    // [B] int64: fed to the next step, overwritten with its choice
  at::Tensor logprob_;  // [B] float32: log-prob of token_ after a step
  std::unique_ptr<Graph> graph_;
  std::string graph_error_;
  double capture_s_ = 0;
};

}  // namespace kz::model
