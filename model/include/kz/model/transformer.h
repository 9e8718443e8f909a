// The decoder-only transformer (Qwen2/Qwen3/Llama) as libtorch modules, loaded from and saved to
// Hugging Face checkpoints.
//
// Modules are registered under Hugging Face's names, so CausalLM::named_parameters() yields
// exactly the checkpoint's keys ("model.layers.0.self_attn.q_proj.weight", ...): loading,
// saving, optimisers and LoRA adapters (a later Linear wrapper, see Linear) all speak that one
// vocabulary. Each DecoderLayer::forward is a pure function of its inputs so activation
// checkpointing can recompute it.
//
// Shapes: B batch, T tokens in this call, S key slots (cache capacity or T), H query heads,
// Hkv key/value heads, D head_dim, C hidden_size, V vocab_size.
// Padding: prompts of different lengths are LEFT-padded for generation (attention_mask 0 on the
// pads); positions count only real tokens (as transformers' generate does), so a padded row gives
// the same logits as the same prompt alone. Teacher-forced scoring accepts any padding pattern.
//
// Errors: functions returning Result catch libtorch's exceptions and report them with context.
// This header includes <torch/nn/module.h>; include it only where tensors are needed.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/model/config.h"

namespace kz::model {

// y = x W^T + b, weight [out, in] as in nn.Linear. The single place a LoRA adapter hooks in
// (lora.h attaches, loads, merges it).
class Linear : public torch::nn::Module {
 public:
  Linear(at::Tensor weight, std::optional<at::Tensor> bias);
  // With an adapter: y + lora_scaling * lora_B(lora_A(dropout(x))), computed in the adapter's
  // dtype (float32 over a bf16 base, as PEFT does) and cast back to y's. Dropout only in training
  // mode (add_lora leaves the model in eval mode; the Trainer switches it on for its passes).
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;  // bias undefined when the config has none
  // LoRA: A [r, in], B [out, r], registered as submodules "lora_A"/"lora_B" so their parameters
  // carry PEFT's names ("...q_proj.lora_A.weight"). Null without an adapter.
  std::shared_ptr<Linear> lora_A, lora_B;
  double lora_scaling = 0, lora_dropout = 0;
};

// A token-embedding table, weight [V, C].
class Embedding : public torch::nn::Module {
 public:
  explicit Embedding(at::Tensor weight);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};

// HF's RMSNorm: normalised in float32, cast back, then scaled by weight.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(at::Tensor weight, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};

// Preallocated key/value cache for generation: slots [0, length) hold the prompt (left-padded)
// and the tokens generated so far; every row shares `length`. Shapes stay fixed for a whole
// generation (decode attends over all S slots, masked) and a decode step reads its slot and
// positions from device tensors updated in place, so the step can be captured in a CUDA graph.
struct KVCache {
  std::vector<at::Tensor> k, v;  // per layer, [B, Hkv, S, D]
  at::Tensor key_mask;           // [B, S] bool: slot holds a real (non-pad) token
  at::Tensor next_position;      // [B] int64: RoPE position of each row's next token
  at::Tensor slot;               // [1] int64 on the device: the slot the next decode writes
  int64_t length = 0;            // slots filled (host copy of slot, for bounds checks)
  int64_t capacity() const { return key_mask.defined() ? key_mask.size(1) : 0; }
  // Empties the cache for the next prefill, keeping its tensors (a captured CUDA graph of the
  // decode step stays valid).
  void reset();
  // A cache whose row i is a copy of this cache's row rows[i] (rows: int64 [B'] on any device):
  // prompts shared by several rows are prefilled once, then forked.
  KVCache select_rows(const at::Tensor& rows) const;
};

// RoPE and mask inputs shared by every layer of one forward call.
struct AttentionInputs {
  at::Tensor cos, sin;  // [B, 1, T, D], the model's dtype
  at::Tensor mask;      // [B, 1, T, S]: bool (true = may attend) or additive float in the model's
                        // dtype (0 or -inf; what decode uses); undefined = causal, no padding
  KVCache* cache = nullptr;
  bool decode = false;  // with cache: T = 1 written at cache->slot, attending over all S slots;
                        // otherwise (prefill) the T tokens fill slots [0, T) and attend to themselves
};

class Attention : public torch::nn::Module {
 public:
  Attention(const ModelConfig& config, int64_t layer, std::map<std::string, at::Tensor>& weights,
            const std::string& prefix);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in);
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // Qwen3 only
  int64_t layer, heads, kv_heads, head_dim;

 private:
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }  // HF's
  at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask) const;
  at::Tensor prompt_attention(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& mask) const;
};

class Mlp : public torch::nn::Module {
 public:
  Mlp(std::map<std::string, at::Tensor>& weights, const std::string& prefix);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const ModelConfig& config, int64_t layer, std::map<std::string, at::Tensor>& weights);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in);
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
};

struct LoadOptions {
  std::optional<at::ScalarType> dtype;  // default: the checkpoint's (config.json dtype)
  at::Device device = at::kCPU;         // "cuda:0" etc.
};

struct SaveOptions {
  std::optional<at::ScalarType> dtype;        // default: the model's
  size_t max_shard_bytes = size_t(5) << 30;   // transformers' default 5 GB; 0 = one file
};

// Qwen2ForCausalLM / Qwen3ForCausalLM / LlamaForCausalLM.
class CausalLM : public torch::nn::Module {
 public:
  // Loads `dir` (config.json + model.safetensors or sharded). Every missing, unexpected and
  // mis-shaped tensor is listed in one error.
  static Result<std::shared_ptr<CausalLM>> load(const fs::path& dir, const LoadOptions& options = {});
  // Random weights (normal(0, 0.02), norms 1, biases 0), for tests and `kz init-model`.
  static Result<std::shared_ptr<CausalLM>> random(const ModelConfig& config, uint64_t seed,
                                                  const LoadOptions& options = {});
  // Builds the modules from tensors keyed by HF name; `weights` must hold exactly
  // expected_weights(config) with the right shapes (load() checks that).
  CausalLM(ModelConfig config, std::map<std::string, at::Tensor> weights);

  // Writes config.json and safetensors (sharded above max_shard_bytes) in HF layout.
  Status save(const fs::path& dir, const SaveOptions& options = {}) const;

  // Logits [B, T, V] of every position; attention_mask [B, T] (1 = token, 0 = pad; undefined =
  // all ones). Keeps the autograd graph unless called under NoGradGuard.
  Result<at::Tensor> logits(const at::Tensor& input_ids, const at::Tensor& attention_mask = {});

  // Generation. new_cache allocates [B, ..., capacity] slots on the model's device, capacity
  // rounded up to a multiple of 16 (the fused attention kernels want aligned mask rows; the extra
  // slots stay masked).
  KVCache new_cache(int64_t batch, int64_t capacity) const;
  // Runs left-padded prompts [B, T] into an empty cache; returns last-position logits [B, V].
  Result<at::Tensor> prefill(const at::Tensor& input_ids, const at::Tensor& attention_mask, KVCache& cache);
  // Appends one token per row [B] at slot cache.length; returns its logits [B, V].
  Result<at::Tensor> decode(const at::Tensor& tokens, KVCache& cache);
  // decode() without its checks and host bookkeeping (cache.length is left to the caller): only
  // device work on tensors updated in place, no host sync, so a CUDA graph can capture it.
  // tokens [B] int64 on the model's device. Throws c10::Error.
  at::Tensor decode_step(const at::Tensor& tokens, KVCache& cache);

  // Activation checkpointing (train.h): when true and grad mode is on (no KV cache), each decoder
  // layer keeps only its input and recomputes its activations during backward.
  bool activation_checkpointing = false;

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return embed_tokens->weight.scalar_type(); }
  at::Device device() const { return embed_tokens->weight.device(); }

  // Final hidden states [B, T, C] for explicit positions [B, T] and mask.
  at::Tensor hidden_states(const at::Tensor& input_ids, const at::Tensor& positions, AttentionInputs in);
  at::Tensor lm_head_forward(const at::Tensor& hidden);

  // The "model" submodule's parts, reachable for adapters and tests.
  std::shared_ptr<torch::nn::Module> model;  // holds embed_tokens, layers, norm
  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> lm_head;           // null when tied: embed_tokens.weight is used

 private:
  ModelConfig config_;
  at::Tensor inv_freq_;  // [D/2] float32 RoPE frequencies (llama3 scaling applied)
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& positions) const;
};

// layer->forward(x, in) through a recompute-in-backward autograd function (defined in
// train.cpp): saves x and the attention inputs, not the layer's activations.
at::Tensor checkpointed_layer_forward(DecoderLayer& layer, const at::Tensor& x, const AttentionInputs& in);

// at::kFloat / kBFloat16 / kHalf for a checkpoint dtype, and back.
at::ScalarType to_scalar_type(WeightDType dtype);
Result<WeightDType> to_weight_dtype(at::ScalarType type);
// A dtype option: "fp32" / "float32", "bf16" / "bfloat16", "fp16" / "float16"; "" is nullopt (the
// checkpoint's own).
Result<std::optional<at::ScalarType>> parse_dtype(const std::string& name);

}  // namespace kz::model
