// The decoder (see transformer.h): modules, forward passes, checkpoint loading and saving.
//
// Numerics follow transformers' modeling_qwen2/qwen3/llama so fp32 logits agree to ~1e-5:
// RMSNorm in float32, RoPE tables computed in float32 then cast, attention through
// at::scaled_dot_product_attention with HF's 1/sqrt(head_dim) scale.
#include "kz/model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <set>

#include "kz/model/safetensors.h"
#include "torch_status.h"

namespace kz::model {
namespace {

// Removes and returns weights[name]; the constructor's caller guarantees presence.
at::Tensor take(std::map<std::string, at::Tensor>& weights, const std::string& name) {
  auto it = weights.find(name);
  TORCH_CHECK(it != weights.end(), "weight ", name, " was not supplied");
  at::Tensor t = std::move(it->second);
  weights.erase(it);
  return t;
}

std::optional<at::Tensor> take_optional(std::map<std::string, at::Tensor>& weights, const std::string& name) {
  if (!weights.count(name)) return std::nullopt;
  return take(weights, name);
}

std::shared_ptr<Linear> make_linear(std::map<std::string, at::Tensor>& w, const std::string& prefix) {
  return std::make_shared<Linear>(take(w, prefix + ".weight"), take_optional(w, prefix + ".bias"));
}

at::Tensor rotate_half(const at::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// HF's default RoPE frequencies, with Llama 3.1's wavelength-dependent scaling when configured.
at::Tensor rope_inv_freq(const ModelConfig& c) {
  at::Tensor exponents = at::arange(0, c.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(c.head_dim);
  at::Tensor inv_freq = 1.0 / at::pow(c.rope_theta, exponents);
  const Llama3RopeScaling& s = c.rope_llama3;
  if (s.factor <= 0) return inv_freq;
  double old_len = static_cast<double>(s.original_max_position_embeddings);
  double low_freq_wavelen = old_len / s.low_freq_factor;
  double high_freq_wavelen = old_len / s.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  at::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// Causal + key-padding mask [B, 1, T, T] from attention_mask [B, T]. A pad query may attend to
// itself so no row is empty (an all-masked row gives NaN); its output is never used.
at::Tensor padded_causal_mask(const at::Tensor& attention_mask) {
  int64_t t = attention_mask.size(1);
  auto opts = attention_mask.options().dtype(at::kBool);
  at::Tensor causal = at::ones({t, t}, opts).tril();
  at::Tensor mask = causal.view({1, 1, t, t}).logical_and(attention_mask.to(at::kBool).view({-1, 1, 1, t}));
  return mask.logical_or(at::eye(t, opts).view({1, 1, t, t}));
}

// transformers' generate(): position = number of real tokens before this one.
at::Tensor positions_from_mask(const at::Tensor& attention_mask) {
  return (attention_mask.to(at::kLong).cumsum(-1) - 1).clamp_min(0);
}

// "name [a, b]"-style shape text for error messages.
std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 20;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  std::string out = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) out += fmt::format(", ... ({} more)", names.size() - kShown);
  return out;
}

// Tensors HF may store that carry no information for us.
bool ignorable_extra(const ModelConfig& c, const std::string& name) {
  if (name.ends_with("rotary_emb.inv_freq")) return true;   // buffers saved by old transformers
  return c.tie_word_embeddings && name == "lm_head.weight";  // tied: same as embed_tokens
}

Result<at::ScalarType> stored_scalar_type(StDType dtype) {
  switch (dtype) {
    case StDType::f32: return at::kFloat;
    case StDType::bf16: return at::kBFloat16;
    case StDType::f16: return at::kHalf;
    default: return invalid_argument(fmt::format("dtype {} is not a floating-point weight type", st_dtype_name(dtype)));
  }
}

StDType st_dtype_of(at::ScalarType t) {
  return t == at::kBFloat16 ? StDType::bf16 : t == at::kHalf ? StDType::f16 : StDType::f32;
}

// Checks the checkpoint against the architecture: every missing, unexpected and mis-shaped
// tensor, and non-float dtypes, in one error.
Status check_checkpoint(const ModelConfig& config, const Checkpoint& ck, const fs::path& dir) {
  std::vector<std::string> missing, unexpected, misshaped, bad_dtype;
  std::set<std::string> expected;
  for (const auto& spec : expected_weights(config)) {
    expected.insert(spec.name);
    const Checkpoint::Entry* e = ck.find(spec.name);
    if (!e) {
      missing.push_back(spec.name);
      continue;
    }
    if (e->info->shape != spec.shape)
      misshaped.push_back(fmt::format("{} (file {}, expected {})", spec.name, shape_text(e->info->shape),
                                      shape_text(spec.shape)));
    if (!stored_scalar_type(e->info->dtype).ok())
      bad_dtype.push_back(fmt::format("{} ({})", spec.name, st_dtype_name(e->info->dtype)));
  }
  for (const auto& [name, entry] : ck.entries())
    if (!expected.count(name) && !ignorable_extra(config, name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && misshaped.empty() && bad_dtype.empty()) return Status::ok();
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("{} missing: {}", missing.size(), name_list(missing)));
  if (!unexpected.empty()) parts.push_back(fmt::format("{} unexpected: {}", unexpected.size(), name_list(unexpected)));
  if (!misshaped.empty()) parts.push_back(fmt::format("{} mis-shaped: {}", misshaped.size(), name_list(misshaped)));
  if (!bad_dtype.empty()) parts.push_back(fmt::format("{} not float32/bfloat16/float16: {}", bad_dtype.size(), name_list(bad_dtype)));
  return invalid_argument(fmt::format("checkpoint {} does not match its config.json ({}, {} layers): {}",
                                      dir.string(), family_name(config.family), config.num_hidden_layers,
                                      fmt::join(parts, "; ")));
}

// Copies each checked tensor out of the mapping into its own tensor of the target dtype/device.
std::map<std::string, at::Tensor> read_weights(const ModelConfig& config, const Checkpoint& ck, at::ScalarType dtype,
                                               at::Device device) {
  std::map<std::string, at::Tensor> out;
  for (const auto& spec : expected_weights(config)) {
    const Checkpoint::Entry* e = ck.find(spec.name);
    at::ScalarType stored = *stored_scalar_type(e->info->dtype);
    at::Tensor view = at::from_blob(const_cast<void*>(e->file->data(*e->info)), spec.shape, at::dtype(stored));
    out[spec.name] = view.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  return out;
}

}  // namespace

// ---- modules ----

Linear::Linear(at::Tensor w, std::optional<at::Tensor> b) {
  weight = register_parameter("weight", std::move(w));
  if (b) bias = register_parameter("bias", std::move(*b));
}

at::Tensor Linear::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight, bias);
  if (!lora_A) return y;
  at::Tensor h = x.to(lora_A->weight.scalar_type());
  if (lora_dropout > 0 && is_training()) h = at::dropout(h, lora_dropout, true);
  return y + (lora_B->forward(lora_A->forward(h)) * lora_scaling).to(y.scalar_type());
}

Embedding::Embedding(at::Tensor w) { weight = register_parameter("weight", std::move(w)); }

at::Tensor Embedding::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

RMSNorm::RMSNorm(at::Tensor w, double eps_) : eps(eps_) { weight = register_parameter("weight", std::move(w)); }

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

Attention::Attention(const ModelConfig& c, int64_t layer_, std::map<std::string, at::Tensor>& w,
                     const std::string& p)
    : layer(layer_), heads(c.num_attention_heads), kv_heads(c.num_key_value_heads), head_dim(c.head_dim) {
  q_proj = register_module("q_proj", make_linear(w, p + "q_proj"));
  k_proj = register_module("k_proj", make_linear(w, p + "k_proj"));
  v_proj = register_module("v_proj", make_linear(w, p + "v_proj"));
  o_proj = register_module("o_proj", make_linear(w, p + "o_proj"));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(take(w, p + "q_norm.weight"), c.rms_norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(take(w, p + "k_norm.weight"), c.rms_norm_eps));
  }
}

at::Tensor Attention::forward(const at::Tensor& x, const AttentionInputs& in) {
  const int64_t b = x.size(0), t = x.size(1);
  at::Tensor q = q_proj->forward(x).view({b, t, heads, head_dim});
  at::Tensor k = k_proj->forward(x).view({b, t, kv_heads, head_dim});
  at::Tensor v = v_proj->forward(x).view({b, t, kv_heads, head_dim}).transpose(1, 2);
  if (q_norm) {  // Qwen3 normalises each head before RoPE
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  q = q * in.cos + rotate_half(q) * in.sin;
  k = k * in.cos + rotate_half(k) * in.sin;
  at::Tensor out;  // [B, T, H * D]
  if (in.cache && in.decode) {  // write this token's slot, then attend over every slot (masked)
    in.cache->k[layer].index_copy_(2, in.cache->slot, k);
    in.cache->v[layer].index_copy_(2, in.cache->slot, v);
    out = decode_attention(q, in.cache->k[layer], in.cache->v[layer], in.mask);
  } else {
    if (in.cache) {  // prefill: keep the prompt's keys/values, attend among them
      in.cache->k[layer].narrow(2, 0, t).copy_(k);
      in.cache->v[layer].narrow(2, 0, t).copy_(v);
    }
    out = prompt_attention(q, k, v, in.mask);
  }
  return o_proj->forward(out);
}

// One query token per row. Instead of SDPA's enable_gqa (which on CUDA only the flash and math
// kernels take, and flash takes no mask), the G = H / Hkv query heads sharing a key/value head
// become G query rows of that head: q [B, Hkv, G, D] against the cache [B, Hkv, S, D] is plain
// multi-head attention, so the memory-efficient kernel runs it with the additive mask and the
// cache is read once, never expanded. HF's head h uses key/value head h / G, so the grouping is a
// reshape.
at::Tensor Attention::decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& mask) const {
  const int64_t b = q.size(0), groups = heads / kv_heads;
  at::Tensor qg = q.reshape({b, kv_heads, groups, head_dim});
  at::Tensor out = at::scaled_dot_product_attention(qg, k, v, mask, 0.0, /*is_causal=*/false, scale());
  return out.reshape({b, 1, heads * head_dim});  // [B, Hkv, G, D] is head-major like [B, H, D]
}

// T query tokens attending to the same T keys. Key/value heads are expanded to H (cheap: only
// this call's T tokens) so every SDPA kernel is eligible: flash for the causal, unpadded case,
// memory-efficient with a mask; enable_gqa would limit a masked call to the math kernel.
at::Tensor Attention::prompt_attention(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& mask) const {
  const int64_t b = q.size(0), t = q.size(2), groups = heads / kv_heads;
  if (groups > 1) {  // HF's repeat_kv
    k = k.unsqueeze(2).expand({b, kv_heads, groups, t, head_dim}).reshape({b, heads, t, head_dim});
    v = v.unsqueeze(2).expand({b, kv_heads, groups, t, head_dim}).reshape({b, heads, t, head_dim});
  }
  std::optional<at::Tensor> m;
  if (mask.defined()) m = mask;
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, m, 0.0, /*is_causal=*/!mask.defined() && t > 1, scale());
  return out.transpose(1, 2).reshape({b, t, heads * head_dim});
}

Mlp::Mlp(std::map<std::string, at::Tensor>& w, const std::string& p) {
  gate_proj = register_module("gate_proj", make_linear(w, p + "gate_proj"));
  up_proj = register_module("up_proj", make_linear(w, p + "up_proj"));
  down_proj = register_module("down_proj", make_linear(w, p + "down_proj"));
}

at::Tensor Mlp::forward(const at::Tensor& x) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

DecoderLayer::DecoderLayer(const ModelConfig& c, int64_t layer, std::map<std::string, at::Tensor>& w) {
  std::string p = fmt::format("model.layers.{}.", layer);
  self_attn = register_module("self_attn", std::make_shared<Attention>(c, layer, w, p + "self_attn."));
  mlp = register_module("mlp", std::make_shared<Mlp>(w, p + "mlp."));
  input_layernorm = register_module(
      "input_layernorm", std::make_shared<RMSNorm>(take(w, p + "input_layernorm.weight"), c.rms_norm_eps));
  post_attention_layernorm = register_module(
      "post_attention_layernorm",
      std::make_shared<RMSNorm>(take(w, p + "post_attention_layernorm.weight"), c.rms_norm_eps));
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const AttentionInputs& in) {
  at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), in);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

// ---- the causal LM ----

CausalLM::CausalLM(ModelConfig config, std::map<std::string, at::Tensor> w) : config_(std::move(config)) {
  model = register_module("model", std::make_shared<torch::nn::Module>("model"));
  embed_tokens = model->register_module("embed_tokens", std::make_shared<Embedding>(take(w, "model.embed_tokens.weight")));
  auto list = model->register_module("layers", std::make_shared<torch::nn::Module>("layers"));
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<DecoderLayer>(config_, i, w)));
  norm = model->register_module("norm", std::make_shared<RMSNorm>(take(w, "model.norm.weight"), config_.rms_norm_eps));
  if (!config_.tie_word_embeddings) lm_head = register_module("lm_head", make_linear(w, "lm_head"));
  TORCH_CHECK(w.empty(), "unused weight ", w.empty() ? "" : w.begin()->first);
  inv_freq_ = rope_inv_freq(config_).to(device());
}

std::pair<at::Tensor, at::Tensor> CausalLM::rope(const at::Tensor& positions) const {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq_;  // [B, T, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);               // [B, 1, T, D]
  return {emb.cos().to(dtype()), emb.sin().to(dtype())};
}

at::Tensor CausalLM::hidden_states(const at::Tensor& input_ids, const at::Tensor& positions, AttentionInputs in) {
  std::tie(in.cos, in.sin) = rope(positions);
  at::Tensor x = embed_tokens->forward(input_ids);
  const bool recompute = activation_checkpointing && !in.cache && c10::GradMode::is_enabled();
  for (auto& layer : layers) x = recompute ? checkpointed_layer_forward(*layer, x, in) : layer->forward(x, in);
  return norm->forward(x);
}

at::Tensor CausalLM::lm_head_forward(const at::Tensor& hidden) {
  return at::linear(hidden, lm_head ? lm_head->weight : embed_tokens->weight);
}

Result<at::Tensor> CausalLM::logits(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  return guarded("forward", [&]() -> Result<at::Tensor> {
    at::Tensor ids = input_ids.to(device());
    AttentionInputs in;
    at::Tensor positions;
    if (attention_mask.defined()) {
      at::Tensor am = attention_mask.to(device());
      in.mask = padded_causal_mask(am);
      positions = positions_from_mask(am);
    } else {
      positions = at::arange(ids.size(1), ids.options().dtype(at::kLong)).unsqueeze(0).expand({ids.size(0), -1});
    }
    return lm_head_forward(hidden_states(ids, positions, in));
  });
}

void KVCache::reset() {
  key_mask.zero_();
  next_position.zero_();
  slot.zero_();
  length = 0;
}

KVCache KVCache::select_rows(const at::Tensor& rows) const {
  at::Tensor index = rows.to(key_mask.device());
  KVCache out;
  for (size_t i = 0; i < k.size(); ++i) {
    out.k.push_back(k[i].index_select(0, index));
    out.v.push_back(v[i].index_select(0, index));
  }
  out.key_mask = key_mask.index_select(0, index);
  out.next_position = next_position.index_select(0, index);
  out.slot = slot.clone();
  out.length = length;
  return out;
}

KVCache CausalLM::new_cache(int64_t batch, int64_t capacity) const {
  capacity = (capacity + 15) / 16 * 16;
  KVCache cache;
  auto opts = at::TensorOptions().dtype(dtype()).device(device());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(at::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, opts));
    cache.v.push_back(at::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, opts));
  }
  cache.key_mask = at::zeros({batch, capacity}, opts.dtype(at::kBool));
  cache.next_position = at::zeros({batch}, opts.dtype(at::kLong));
  cache.slot = at::zeros({1}, opts.dtype(at::kLong));
  return cache;
}

Result<at::Tensor> CausalLM::prefill(const at::Tensor& input_ids, const at::Tensor& attention_mask, KVCache& cache) {
  return guarded("prefill", [&]() -> Result<at::Tensor> {
    c10::NoGradGuard no_grad;  // generation never backpropagates; the cache must not join a graph
    const int64_t t = input_ids.size(1);
    if (cache.length != 0 || t > cache.capacity() || input_ids.size(0) != cache.key_mask.size(0))
      return invalid_argument(fmt::format("prefill of {}x{} tokens into a cache of {}x{} slots holding {}",
                                          input_ids.size(0), t, cache.key_mask.size(0), cache.capacity(), cache.length));
    at::Tensor ids = input_ids.to(device());
    at::Tensor am = attention_mask.defined() ? attention_mask.to(device()) : at::ones_like(ids);
    AttentionInputs in;
    // Unpadded prompts take the causal path (flash attention on CUDA); one host sync per prefill.
    if (!am.all().item<bool>()) in.mask = padded_causal_mask(am);
    in.cache = &cache;
    at::Tensor hidden = hidden_states(ids, positions_from_mask(am), in);
    cache.key_mask.narrow(1, 0, t).copy_(am.to(at::kBool));
    cache.next_position.copy_(am.to(at::kLong).sum(-1));
    cache.slot.fill_(t);
    cache.length = t;
    return lm_head_forward(hidden.select(1, t - 1));  // left padding: the last slot is real
  });
}

Result<at::Tensor> CausalLM::decode(const at::Tensor& tokens, KVCache& cache) {
  return guarded("decode", [&]() -> Result<at::Tensor> {
    if (cache.length == 0 || cache.length >= cache.capacity())
      return invalid_argument(fmt::format("decode at slot {} of a cache of {} slots (prefill first; raise capacity)",
                                          cache.length, cache.capacity()));
    at::Tensor logits = decode_step(tokens.to(device()), cache);
    cache.length += 1;
    return logits;
  });
}

at::Tensor CausalLM::decode_step(const at::Tensor& tokens, KVCache& cache) {
  c10::NoGradGuard no_grad;
  const int64_t b = tokens.size(0);
  // Only in-place updates of device tensors from here on: no host values enter the step.
  cache.key_mask.index_fill_(1, cache.slot, true);
  AttentionInputs in;
  // Additive, in the model's dtype: what the memory-efficient kernel takes without a conversion.
  in.mask = at::zeros({b, 1, 1, cache.capacity()}, cache.k[0].options())
                .masked_fill_(cache.key_mask.logical_not().view({b, 1, 1, -1}), -INFINITY);
  in.cache = &cache;
  in.decode = true;
  at::Tensor hidden = hidden_states(tokens.view({b, 1}), cache.next_position.view({b, 1}), in);
  cache.slot.add_(1);
  cache.next_position.add_(1);
  return lm_head_forward(hidden.select(1, 0));
}

// ---- loading and saving ----

at::ScalarType to_scalar_type(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::f32: return at::kFloat;
    case WeightDType::bf16: return at::kBFloat16;
    case WeightDType::f16: return at::kHalf;
  }
  return at::kFloat;
}

Result<std::optional<at::ScalarType>> parse_dtype(const std::string& name) {
  if (name.empty()) return std::optional<at::ScalarType>();
  if (name == "fp32" || name == "float32") return std::optional(at::kFloat);
  if (name == "bf16" || name == "bfloat16") return std::optional(at::kBFloat16);
  if (name == "fp16" || name == "float16") return std::optional(at::kHalf);
  return invalid_argument(fmt::format("dtype \"{}\" is not fp32, bf16 or fp16", name));
}

Result<WeightDType> to_weight_dtype(at::ScalarType type) {
  if (type == at::kFloat) return WeightDType::f32;
  if (type == at::kBFloat16) return WeightDType::bf16;
  if (type == at::kHalf) return WeightDType::f16;
  return invalid_argument(fmt::format("dtype {} is not float32, bfloat16 or float16", c10::toString(type)));
}

Result<std::shared_ptr<CausalLM>> CausalLM::load(const fs::path& dir, const LoadOptions& options) {
  auto config = load_model_config(dir);
  if (!config.ok()) return config.status();
  at::ScalarType dtype = options.dtype.value_or(to_scalar_type(config->dtype));
  if (auto d = to_weight_dtype(dtype); !d.ok()) return d.status().with_context("loading " + dir.string());
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  KZ_RETURN_IF_ERROR(check_checkpoint(*config, *ck, dir));
  return guarded("loading " + dir.string(), [&]() -> Result<std::shared_ptr<CausalLM>> {
    return std::make_shared<CausalLM>(*config, read_weights(*config, *ck, dtype, options.device));
  });
}

Result<std::shared_ptr<CausalLM>> CausalLM::random(const ModelConfig& config, uint64_t seed, const LoadOptions& options) {
  KZ_RETURN_IF_ERROR(config.validate());
  return guarded("random init", [&]() -> Result<std::shared_ptr<CausalLM>> {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    at::ScalarType dtype = options.dtype.value_or(to_scalar_type(config.dtype));
    std::map<std::string, at::Tensor> w;
    for (const auto& spec : expected_weights(config)) {
      at::Tensor t;
      if (spec.name.ends_with("norm.weight")) t = at::ones(spec.shape);
      else if (spec.name.ends_with(".bias")) t = at::zeros(spec.shape);
      else t = at::normal(0.0, 0.02, spec.shape, gen);
      w[spec.name] = t.to(options.device, dtype);
    }
    return std::make_shared<CausalLM>(config, std::move(w));
  });
}

Status CausalLM::save(const fs::path& dir, const SaveOptions& options) const {
  at::ScalarType dtype = options.dtype.value_or(this->dtype());
  auto wdtype = to_weight_dtype(dtype);
  if (!wdtype.ok()) return wdtype.status().with_context("saving " + dir.string());
  return guarded("saving " + dir.string(), [&]() -> Status {
    auto params = named_parameters(/*recurse=*/true);
    std::vector<at::Tensor> host;  // keeps the CPU copies alive while writing
    std::vector<StTensorView> views;
    for (const auto& spec : expected_weights(config_)) {
      const at::Tensor* p = params.find(spec.name);
      if (!p) return internal_error("parameter " + spec.name + " is not registered");
      host.push_back(p->detach().to(at::kCPU, dtype).contiguous());
      const at::Tensor& t = host.back();
      views.push_back({spec.name, st_dtype_of(dtype), t.sizes().vec(), t.data_ptr(), t.nbytes()});
    }
    KZ_RETURN_IF_ERROR(write_checkpoint(dir, views, options.max_shard_bytes));
    return write_file_atomic(dir / "config.json", model_config_json(config_, *wdtype));
  });
}

}  // namespace kz::model
