// The settings flags of the model commands (kz generate, kz serve-model) and --config.
//
// Each flag is declared with the configs/model.toml key it sets. Precedence: the built-in
// defaults, then the --config file, then the flags given on the command line. Only flags actually
// given override (CLI11's count()), so a flag left out never puts its default back over the
// file's value.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/llm/model_options.h"

namespace kz::cli {

class ModelFlags {
 public:
  // Declares --config on `command`, which must outlive this object (as must this object the parse).
  explicit ModelFlags(CLI::App& command);
  ModelFlags(const ModelFlags&) = delete;  // CLI11 holds references into given_
  ModelFlags& operator=(const ModelFlags&) = delete;

  // Declares `flag` for the field of config key `key` (bool fields become switches).
  CLI::Option* add(const std::string& flag, const std::string& key, const std::string& description);

  // The defaults, overridden by the --config file, overridden by the flags given.
  Result<ModelOptions> resolve() const;

 private:
  struct Override {
    CLI::Option* option;
    std::string key;
  };
  CLI::App& command_;
  std::string config_path_;
  ModelOptions given_;  // the flags' values (meaningful where given)
  std::vector<Override> overrides_;
};

}  // namespace kz::cli
