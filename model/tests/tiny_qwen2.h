// The smallest Qwen2 the data-parallel tests train (2 layers, hidden 32, a vocabulary of 96,
// untied embeddings), random weights from a seed: one definition, so that the trainer's and the
// policy update's data-parallel tests check the same model.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "kz/model/config.h"
#include "kz/model/transformer.h"

namespace kz::model::test {

inline std::shared_ptr<CausalLM> tiny_qwen2(uint64_t seed, const at::Device& device = at::kCPU,
                                            at::ScalarType dtype = at::kFloat) {
  auto config = parse_model_config(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "torch_dtype": "float32"})", "tiny qwen2");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  LoadOptions load;
  load.device = device;
  load.dtype = dtype;
  auto m = CausalLM::random(*config, seed, load);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

}  // namespace kz::model::test
