// The model engine behind one torch-free header: a checkpoint directory (weights, tokenizer,
// generation config) loaded once, and text-level generation on it. `kz generate`,
// `kz serve-model` and the in-process Generator (llm/engine_generator.h) use this, so none of
// them includes libtorch headers.
//
// Requests run in continuous batches (generate.h) on the engine's scheduler thread: a request
// from any thread joins the batch under way at its next copy to the host when the batch's cache
// holds it (else it waits for the next batch), so calls from several threads share the device
// instead of waiting for each other's whole batch; each call returns when its own requests are
// done. A request's tokens do not depend on what else runs (per-request seed and token index,
// sampler.h). Stop strings are checked on each row's decoded text after every step (the row ends
// there), then the text is cut before the first stop string and the tokens end with the one that
// completed it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/model/config.h"
#include "kz/model/tokenizer.h"

namespace kz::model {

class CausalLM;  // transformer.h (libtorch); only named here

struct EngineOptions {
  fs::path model_dir;           // config.json, safetensors, tokenizer.json (+ generation_config.json)
  std::string device = "cpu";   // "cpu", "cuda", "cuda:N"
  std::string dtype;            // "": the checkpoint's; "fp32", "bf16" or "fp16"
  bool cuda_graph = true;       // decode through a CUDA graph on CUDA devices (generate.h); false: eager
  // Rows decoded at once, across all callers; more requests wait for rows to free. 0: no bound.
  int64_t max_batch_rows = 64;
  Status validate() const;
};

// A request's sampling, as generate.h's SamplingOptions plus text-level stops.
struct TextSampling {
  double temperature = 1.0;        // 0: greedy
  int64_t top_k = 0;               // 0: all tokens
  double top_p = 1.0;
  uint64_t seed = 0;
  // New tokens at most; clamped so prompt + new tokens fit the model's context
  // (max_position_embeddings). Must be >= 1.
  int64_t max_new_tokens = 256;
  std::vector<std::string> stop;   // stop strings (not included in the text)
  bool stop_at_eos = true;         // the generation config's eos ids end generation
};

struct EngineCompletion {
  std::string text;                 // new tokens decoded, special tokens skipped, cut at a stop string
  std::vector<int64_t> token_ids;   // new tokens (the eos token included when generation stopped on it)
  std::vector<float> logprobs;      // per token, under the unmodified distribution (generate.h)
  std::string finish_reason;        // "stop" (eos or stop string) or "length"
  size_t prompt_tokens = 0;
};

struct EngineRequest {
  std::vector<TokenId> prompt_ids;  // not empty
  TextSampling sampling;
  // Optional, for streaming: called on the engine's scheduler thread with each new piece of the text while
  // the batch decodes (whenever the row's tokens reach the host, generate.h), and a last time with
  // the rest of the text and the finished completion. The pieces concatenate to the completion's
  // text: a piece never ends inside a UTF-8 character or in a tail that could still grow into a
  // stop string (stop_strings.h).
  std::function<void(std::string_view piece, const EngineCompletion* finished)> on_text;
};

class Engine {
 public:
  static Result<std::shared_ptr<Engine>> load(const EngineOptions& options);
  ~Engine();

  // One Result per request, in order: an invalid request (empty or too long prompt, token ids
  // outside the vocabulary, bad settings) fails alone; the valid ones join the running batch (see
  // the header comment). A libtorch failure fails every request of the batch it hit.
  std::vector<Result<EngineCompletion>> generate(const std::vector<EngineRequest>& requests);

  const Tokenizer& tokenizer() const;
  const ModelConfig& config() const;
  const std::vector<int64_t>& eos_token_ids() const;  // generation_config.json, else config.json, else the tokenizer's
  int64_t context_length() const;                     // max_position_embeddings
  std::string device() const;                         // as torch names it: "cpu", "cuda:0"
  std::string dtype() const;                          // "float32", "bfloat16", "float16"
  std::string describe() const;                       // "engine:<dir> (<device>, <dtype>)"
  const fs::path& model_dir() const;
  int64_t pad_token_id() const;                       // fills left padding: the generation config's, else the tokenizer's, else 0

  // The model generate() runs, for callers that train it in place (the loop's trainable roles):
  // weights changed through it show in the next generate(). the caller must not train (or otherwise
  // change the weights) while a generate() runs.
  std::shared_ptr<CausalLM> model() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz::model
