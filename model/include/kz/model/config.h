// The architecture of a decoder-only model, read from a Hugging Face `config.json`.
//
// Families: Qwen2/Qwen2.5 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, explicit head_dim, biases
// only with attention_bias) and Llama (attention_bias, mlp_bias, rope_scaling type "llama3").
// Anything the engine cannot compute faithfully (sliding windows, other RoPE scalings, other
// activations) is rejected with an error naming the file and the field, never silently ignored.
// Torch-free: tests and tools read configs without libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::model {

enum class Family { qwen2, qwen3, llama };
const char* family_name(Family family);

// Weight storage types of a checkpoint (safetensors "F32", "BF16", "F16").
enum class WeightDType { f32, bf16, f16 };
const char* weight_dtype_name(WeightDType dtype);  // "float32", "bfloat16", "float16" (HF's names)
Result<WeightDType> parse_weight_dtype(const std::string& hf_name);

// RoPE frequency scaling of Llama 3.1+ ("rope_type": "llama3"); factor 0 means none.
struct Llama3RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Family family = Family::qwen2;
  std::string model_type;                // "qwen2", "qwen3" or "llama", as in the file
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;         // SwiGLU inner width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;       // GQA: query heads share key/value heads
  int64_t head_dim = 0;                  // hidden_size / heads unless the file says otherwise
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  Llama3RopeScaling rope_llama3;         // factor 0: plain RoPE
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;           // q/k/v biases (always true for Qwen2)
  bool attention_out_bias = false;       // o_proj bias (Llama's attention_bias covers it)
  bool mlp_bias = false;                 // Llama only
  bool qk_norm = false;                  // Qwen3: RMSNorm over each head of q and k
  bool tie_word_embeddings = false;      // lm_head shares embed_tokens.weight
  WeightDType dtype = WeightDType::f32;  // torch_dtype / dtype of the stored weights
  std::vector<int64_t> bos_token_ids;    // empty when the file has none
  std::vector<int64_t> eos_token_ids;    // an int or a list in the file
  // The file as read, so saving keeps every field we do not model (architectures, ...).
  std::string raw_json;

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Checks the numbers are consistent (positive, heads divisible, ...).
  Status validate() const;
};

// Parses config.json text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Reads `dir`/config.json (or `path` itself when it is a file).
Result<ModelConfig> load_model_config(const fs::path& path);
// The config as config.json text: raw_json with dtype fields updated to `dtype`.
std::string model_config_json(const ModelConfig& config, WeightDType dtype);

// One weight the architecture expects: its Hugging Face name and shape.
struct WeightSpec {
  std::string name;            // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
};
// Every weight of the model in Hugging Face layout, in module order. With tied embeddings there
// is no lm_head.weight (as transformers saves it).
std::vector<WeightSpec> expected_weights(const ModelConfig& config);

}  // namespace kz::model
