// Every setting of the model commands (`kz generate`, `kz serve-model`) but the checkpoint
// (--model) and the prompt (--prompt), with its default, and its TOML form.
//
// configs/model.toml writes out every default below; `--config FILE` applies such a file and the
// flags given on the command line override it (cli/model_flags.h). The TOML sections are
// [engine], [sampling] and [serve]. Torch-free and httplib-free (target kz_model_options): the
// structs' headers declare no torch types, and nothing here calls into the engine or the server.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "kz/core/config_fields.h"
#include "kz/core/status.h"
#include "kz/llm/openai_server.h"
#include "kz/model/engine.h"

namespace kz {

struct ModelOptions {
  model::EngineOptions engine;   // [engine]: device, dtype (model_dir is the --model flag)
  // [sampling], kz generate only (a server's requests carry their own). stop_at_eos is not a key:
  // the command sets it from ignore_eos, the flag's sense.
  model::TextSampling sampling;
  bool ignore_eos = false;
  // [serve], kz serve-model only. An empty served_model_name means the checkpoint directory's
  // name, hence not the server's own default.
  OpenAIServerOptions serve{.model_name = ""};
};

// "section.key" -> field, with each field's accepted values (what kz/core/config_fields.h reads
// and prints). The flags of cli/model_flags.h name their fields by these keys.
ConfigTable config_table(ModelOptions& options);

// Overrides fields of `options` with the keys present in the TOML text; unknown keys, wrong types
// and out-of-range values are errors naming `origin` (a file path, ...) and the key.
Status apply_toml_text(std::string_view text, std::string_view origin, ModelOptions& options);
Status apply_toml_file(const std::filesystem::path& path, ModelOptions& options);
// The complete configuration as TOML text.
std::string to_toml(const ModelOptions& options);

}  // namespace kz
