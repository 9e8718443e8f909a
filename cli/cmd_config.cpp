// `kz config show`: the resolved evaluation configuration (defaults <- --config <- flags).
#include <iostream>

#include "commands.h"

namespace kz::cli {

Action add_config_command(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  auto* config = app.add_subcommand("config", "Configuration");
  config->require_subcommand(1);
  auto* show = config->add_subcommand("show", "Print the resolved evaluation configuration as TOML");
  add_eval_flags(*show, *flags);
  return [flags] {
    auto options = resolve_eval_options(*flags);
    if (!options.ok()) return report_error(options.status());
    std::cout << to_toml(*options);
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
