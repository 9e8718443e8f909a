// config.json parsing for the Qwen2, Qwen3 and Llama families (see config.h).
#include "kz/model/config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

namespace kz::model {
namespace {

using nlohmann::json;

// Reads config fields with errors that name the file and the field.
class FieldReader {
 public:
  FieldReader(const json& root, std::string source) : root_(root), source_(std::move(source)) {}

  Status error(const std::string& field, const std::string& what) const {
    return invalid_argument(fmt::format("{}: field '{}': {}", source_, field, what));
  }
  bool has(const std::string& field) const { return root_.contains(field) && !root_[field].is_null(); }

  Result<int64_t> integer(const std::string& field, std::optional<int64_t> fallback = {}) const {
    if (!has(field)) {
      if (fallback) return *fallback;
      return error(field, "missing");
    }
    const json& v = root_[field];
    if (!v.is_number_integer()) return error(field, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  Result<double> number(const std::string& field, std::optional<double> fallback = {}) const {
    if (!has(field)) {
      if (fallback) return *fallback;
      return error(field, "missing");
    }
    const json& v = root_[field];
    if (!v.is_number()) return error(field, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  Result<bool> boolean(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = root_[field];
    if (!v.is_boolean()) return error(field, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  // An int or a list of ints (eos_token_id); absent or null gives an empty list.
  Result<std::vector<int64_t>> id_list(const std::string& field) const {
    std::vector<int64_t> out;
    if (!has(field)) return out;
    const json& v = root_[field];
    if (v.is_number_integer()) return std::vector<int64_t>{v.get<int64_t>()};
    if (!v.is_array()) return error(field, "expected an integer or a list of integers, got " + v.dump());
    for (const json& e : v) {
      if (!e.is_number_integer()) return error(field, "expected integers, got " + e.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  const json& root_;
  std::string source_;
};

#define KZ_ASSIGN(lhs, expr)          \
  do {                                \
    auto kz_r_ = (expr);              \
    if (!kz_r_.ok()) return kz_r_.status(); \
    lhs = std::move(kz_r_).value();   \
  } while (0)

Result<Family> parse_family(const FieldReader& in, const json& root) {
  if (!in.has("model_type")) return in.error("model_type", "missing");
  if (!root["model_type"].is_string()) return in.error("model_type", "expected a string");
  std::string type = root["model_type"].get<std::string>();
  if (type == "qwen2") return Family::qwen2;
  if (type == "qwen3") return Family::qwen3;
  if (type == "llama") return Family::llama;
  return in.error("model_type", "'" + type + "' is not supported (qwen2, qwen3, llama)");
}

// RoPE: transformers 5 writes "rope_parameters" {rope_type, rope_theta, ...}; older files have
// "rope_theta" at the top and an optional "rope_scaling" object.
Status parse_rope(const FieldReader& in, const json& root, const std::string& source, ModelConfig& c) {
  KZ_ASSIGN(c.rope_theta, in.number("rope_theta", 10000.0));
  std::string field = in.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!in.has(field)) return Status::ok();
  const json& rope = root[field];
  if (!rope.is_object()) return in.error(field, "expected an object");
  FieldReader r(rope, source + ": " + field);
  KZ_ASSIGN(c.rope_theta, r.number("rope_theta", c.rope_theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rope.contains(key) && rope[key].is_string()) type = rope[key].get<std::string>();
  if (type == "default") return Status::ok();
  if (type != "llama3")
    return in.error(field, "rope type '" + type + "' is not supported (default, llama3)");
  KZ_ASSIGN(c.rope_llama3.factor, r.number("factor"));
  KZ_ASSIGN(c.rope_llama3.low_freq_factor, r.number("low_freq_factor"));
  KZ_ASSIGN(c.rope_llama3.high_freq_factor, r.number("high_freq_factor"));
  KZ_ASSIGN(c.rope_llama3.original_max_position_embeddings,
            r.integer("original_max_position_embeddings", c.max_position_embeddings));
  if (c.rope_llama3.factor <= 0 || c.rope_llama3.high_freq_factor <= c.rope_llama3.low_freq_factor)
    return in.error(field, "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor");
  return Status::ok();
}

// Features of the families that the engine does not implement: rejected, not ignored.
Status reject_unsupported(const FieldReader& in, const json& root) {
  auto use_sliding = in.boolean("use_sliding_window", false);
  if (!use_sliding.ok()) return use_sliding.status();
  if (*use_sliding) return in.error("use_sliding_window", "sliding-window attention is not supported");
  if (in.has("hidden_act") && root["hidden_act"] != "silu")
    return in.error("hidden_act", "only 'silu' (SwiGLU) is supported, got " + root["hidden_act"].dump());
  if (in.has("pretraining_tp") && root["pretraining_tp"] != 1)
    return in.error("pretraining_tp", "only 1 is supported");
  return Status::ok();
}

Status parse_dtype(const FieldReader& in, const json& root, ModelConfig& c) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!in.has(key)) continue;
    if (!root[key].is_string()) return in.error(key, "expected a string");
    auto d = parse_weight_dtype(root[key].get<std::string>());
    if (!d.ok()) return in.error(key, d.status().message());
    c.dtype = *d;
    return Status::ok();
  }
  return Status::ok();  // float32, transformers' default
}

Status parse_fields(const FieldReader& in, const json& root, const std::string& source, ModelConfig& c) {
  KZ_ASSIGN(c.family, parse_family(in, root));
  c.model_type = root["model_type"].get<std::string>();
  KZ_ASSIGN(c.vocab_size, in.integer("vocab_size"));
  KZ_ASSIGN(c.hidden_size, in.integer("hidden_size"));
  KZ_ASSIGN(c.intermediate_size, in.integer("intermediate_size"));
  KZ_ASSIGN(c.num_hidden_layers, in.integer("num_hidden_layers"));
  KZ_ASSIGN(c.num_attention_heads, in.integer("num_attention_heads"));
  KZ_ASSIGN(c.num_key_value_heads, in.integer("num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads <= 0) return in.error("num_attention_heads", "must be positive");
  KZ_ASSIGN(c.head_dim, in.integer("head_dim", c.hidden_size / c.num_attention_heads));
  KZ_ASSIGN(c.max_position_embeddings, in.integer("max_position_embeddings", 2048));
  KZ_ASSIGN(c.rms_norm_eps, in.number("rms_norm_eps", 1e-6));
  KZ_ASSIGN(c.tie_word_embeddings, in.boolean("tie_word_embeddings", false));
  KZ_ASSIGN(c.bos_token_ids, in.id_list("bos_token_id"));
  KZ_ASSIGN(c.eos_token_ids, in.id_list("eos_token_id"));
  bool bias = false;
  KZ_ASSIGN(bias, in.boolean("attention_bias", false));
  c.attention_bias = c.family == Family::qwen2 || bias;  // Qwen2 always has q/k/v biases
  c.attention_out_bias = c.family != Family::qwen2 && bias;
  KZ_ASSIGN(c.mlp_bias, in.boolean("mlp_bias", false));
  if (c.family != Family::llama) c.mlp_bias = false;  // only Llama's MLP reads mlp_bias
  c.qk_norm = c.family == Family::qwen3;
  KZ_RETURN_IF_ERROR(parse_rope(in, root, source, c));
  KZ_RETURN_IF_ERROR(parse_dtype(in, root, c));
  return reject_unsupported(in, root);
}

}  // namespace

const char* family_name(Family family) {
  switch (family) {
    case Family::qwen2: return "qwen2";
    case Family::qwen3: return "qwen3";
    case Family::llama: return "llama";
  }
  return "?";
}

const char* weight_dtype_name(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::f32: return "float32";
    case WeightDType::bf16: return "bfloat16";
    case WeightDType::f16: return "float16";
  }
  return "?";
}

Result<WeightDType> parse_weight_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return WeightDType::f32;
  if (name == "bfloat16" || name == "bf16") return WeightDType::bf16;
  if (name == "float16" || name == "fp16") return WeightDType::f16;
  return invalid_argument("dtype '" + name + "' is not supported (float32, bfloat16, float16)");
}

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    return v > 0 ? Status::ok() : invalid_argument(fmt::format("{} must be positive, got {}", name, v));
  };
  for (auto [v, name] : {std::pair{vocab_size, "vocab_size"}, {hidden_size, "hidden_size"},
                         {intermediate_size, "intermediate_size"}, {num_hidden_layers, "num_hidden_layers"},
                         {num_attention_heads, "num_attention_heads"}, {num_key_value_heads, "num_key_value_heads"},
                         {head_dim, "head_dim"}, {max_position_embeddings, "max_position_embeddings"}})
    KZ_RETURN_IF_ERROR(positive(v, name));
  if (num_attention_heads % num_key_value_heads != 0)
    return invalid_argument(fmt::format("num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                                        num_attention_heads, num_key_value_heads));
  if (head_dim % 2 != 0) return invalid_argument(fmt::format("head_dim must be even for RoPE, got {}", head_dim));
  if (!(rms_norm_eps > 0)) return invalid_argument("rms_norm_eps must be positive");
  if (!(rope_theta > 0)) return invalid_argument("rope_theta must be positive");
  return Status::ok();
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return parse_error(source + ": not valid JSON");
  if (!root.is_object()) return parse_error(source + ": expected a JSON object");
  ModelConfig c;
  FieldReader in(root, source);
  KZ_RETURN_IF_ERROR(parse_fields(in, root, source, c));
  KZ_RETURN_IF_ERROR(c.validate().with_context(source));
  c.raw_json = json_text;
  return c;
}

Result<ModelConfig> load_model_config(const fs::path& path) {
  fs::path file = fs::is_directory(path) ? path / "config.json" : path;
  auto text = read_file(file);
  if (!text.ok()) return text.status();
  return parse_model_config(*text, file.string());
}

std::string model_config_json(const ModelConfig& config, WeightDType dtype) {
  json root = json::parse(config.raw_json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) root = json::object();
  // transformers 5 writes "dtype"; older readers (vLLM, transformers 4) read "torch_dtype".
  root["dtype"] = weight_dtype_name(dtype);
  root["torch_dtype"] = weight_dtype_name(dtype);
  return root.dump(2) + "\n";
}

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  std::vector<WeightSpec> out;
  const int64_t h = c.hidden_size;
  auto add = [&](std::string name, std::vector<int64_t> shape) { out.push_back({std::move(name), std::move(shape)}); };
  auto linear = [&](const std::string& prefix, int64_t in, int64_t outf, bool bias) {
    add(prefix + ".weight", {outf, in});
    if (bias) add(prefix + ".bias", {outf});
  };
  add("model.embed_tokens.weight", {c.vocab_size, h});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = fmt::format("model.layers.{}.", i);
    linear(p + "self_attn.q_proj", h, c.q_size(), c.attention_bias);
    linear(p + "self_attn.k_proj", h, c.kv_size(), c.attention_bias);
    linear(p + "self_attn.v_proj", h, c.kv_size(), c.attention_bias);
    linear(p + "self_attn.o_proj", c.q_size(), h, c.attention_out_bias);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim});
      add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    linear(p + "mlp.gate_proj", h, c.intermediate_size, c.mlp_bias);
    linear(p + "mlp.up_proj", h, c.intermediate_size, c.mlp_bias);
    linear(p + "mlp.down_proj", c.intermediate_size, h, c.mlp_bias);
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
  }
  add("model.norm.weight", {h});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h});
  return out;
}

}  // namespace kz::model
