// ModelOptions <-> TOML: one table of keys, with the ranges the engine and the server accept
// (checked here because their own validate() functions live in the libtorch and httplib targets).
#include "kz/llm/model_options.h"

namespace kz {

ConfigTable config_table(ModelOptions& o) {
  return {
      {"engine.device", ConfigField(o.engine.device).matching("cpu|cuda(:[0-9]+)?", "cpu, cuda or cuda:N")},
      {"engine.dtype", ConfigField(o.engine.dtype)
                           .matching("|fp32|bf16|fp16|float32|bfloat16|float16",
                                     "fp32, bf16, fp16 or \"\" (the checkpoint's)")},
      {"engine.cuda_graph", o.engine.cuda_graph},
      {"engine.max_batch_rows", ConfigField(o.engine.max_batch_rows).at_least(0)},
      {"sampling.max_new_tokens", ConfigField(o.sampling.max_new_tokens).at_least(1)},
      {"sampling.temperature", ConfigField(o.sampling.temperature).at_least(0)},
      {"sampling.top_p", ConfigField(o.sampling.top_p).above(0).at_most(1)},
      {"sampling.top_k", ConfigField(o.sampling.top_k).at_least(0)},
      {"sampling.seed", o.sampling.seed},
      {"sampling.stop", o.sampling.stop},
      {"sampling.ignore_eos", o.ignore_eos},
      {"serve.host", o.serve.host},
      {"serve.port", ConfigField(o.serve.port).at_least(0).at_most(65535)},
      {"serve.served_model_name", o.serve.model_name},
      {"serve.max_batch", ConfigField(o.serve.max_batch).at_least(1)},
      {"serve.batch_wait_ms", ConfigField(o.serve.batch_wait_ms).at_least(0)},
      {"serve.concurrent_batches", ConfigField(o.serve.concurrent_batches).at_least(1)},
      {"serve.http_threads", ConfigField(o.serve.http_threads).at_least(1)},
      {"serve.max_n", ConfigField(o.serve.max_n).at_least(1)},
      {"serve.default_max_tokens", ConfigField(o.serve.default_max_tokens).at_least(1)},
      {"serve.chat_default_max_tokens", ConfigField(o.serve.chat_default_max_tokens).at_least(1)},
  };
}

Status apply_toml_text(std::string_view text, std::string_view origin, ModelOptions& options) {
  return apply_config_text(text, origin, config_table(options));
}

Status apply_toml_file(const std::filesystem::path& path, ModelOptions& options) {
  return apply_config_file(path, config_table(options));
}

std::string to_toml(const ModelOptions& options) {
  ModelOptions copy = options;  // the table holds non-const references
  return config_to_toml(config_table(copy));
}

}  // namespace kz
