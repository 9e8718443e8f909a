// LoRA adapters on a CausalLM, in PEFT's format.
//
// An adapter on a Linear with weight W [out, in] adds scaling * B A x with A [r, in], B [out, r],
// scaling = alpha / r (alpha / sqrt(r) with rslora). Fresh adapters start as PEFT's: A
// kaiming-uniform(a = sqrt(5)), i.e. uniform(-1/sqrt(in), 1/sqrt(in)), and B = 0, so the model is
// unchanged until B trains. Adapter weights are float32 whatever the base dtype (PEFT's
// autocast_adapter_dtype), and attaching freezes every base parameter: a Trainer created
// afterwards trains only the adapters. Attaching leaves the model in eval mode, so dropout acts
// only inside Trainer::backward/step (which switch training mode on for their passes).
//
// On disk (PEFT's save_pretrained / PeftModel.from_pretrained): DIR/adapter_config.json
// ({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha", "target_modules", ...})
// and DIR/adapter_model.safetensors with names
//   base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight   [r, in]
//   base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight   [out, r]
// Our parameter names are the same without the "base_model.model." prefix. Only plain LoRA
// loads: DoRA, per-module rank/alpha patterns, layer subsets, excluded modules, fan_in_fan_out,
// LoRA biases, modules_to_save, aLoRA and Arrow are rejected with an error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/model/transformer.h"

namespace kz::model {

// The projections LoRA can target, by their HF leaf names.
const std::vector<std::string>& lora_target_names();  // q,k,v,o,gate,up,down _proj

struct LoraOptions {
  int64_t r = 16;            // rank
  double alpha = 32;         // scaling = alpha / r
  double dropout = 0.0;      // on the adapter's input, in training mode only
  bool use_rslora = false;   // scaling = alpha / sqrt(r)
  std::vector<std::string> target_modules = lora_target_names();
  uint64_t seed = 0;         // A's initialisation
  Status validate() const;
  double scaling() const;
};

// Attaches fresh adapters to every Linear whose leaf name is in target_modules and freezes the
// base. Errors: invalid options, a model that already has adapters.
Status add_lora(CausalLM& model, const LoraOptions& options);

bool has_lora(const CausalLM& model);

// The adapters' parameters by our names ("model.layers.0.self_attn.q_proj.lora_A.weight"),
// in module order.
std::vector<std::pair<std::string, at::Tensor>> lora_parameters(const CausalLM& model);

// Writes adapter_config.json and adapter_model.safetensors into `dir` (created). Error if the
// model has no adapters.
Status save_lora(const CausalLM& model, const fs::path& dir, const std::string& base_model_name_or_path = "");

// Reads a PEFT adapter directory: options from adapter_config.json (seed unused).
Result<LoraOptions> read_lora_config(const fs::path& dir);

// Attaches the adapter in `dir` (as add_lora, then its weights). Every missing, unexpected and
// mis-shaped tensor is named in one error; the model is left without adapters on error.
Status load_lora(CausalLM& model, const fs::path& dir);

// Folds every adapter into its base weight (W += scaling * B A, in float32, rounded to W's
// dtype), removes the adapters and makes every parameter trainable again: the model is then a
// plain CausalLM that save() writes as a full checkpoint.
Status merge_lora(CausalLM& model);

// Removes the adapters without merging and unfreezes the base.
void remove_lora(CausalLM& model);

}  // namespace kz::model
