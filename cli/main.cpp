// kz: the KernelZero command line. Thin glue: each subcommand parses flags into library
// options, calls the library and prints.
#include <CLI/CLI.hpp>

#include <iostream>
#include <map>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"KernelZero: evaluate (and, later, train) kernel-writing models", "kz"};
  app.require_subcommand(1);
  std::map<CLI::App*, kz::cli::Action> actions;
  auto add = [&](kz::cli::Action action) { actions[app.get_subcommands({}).back()] = std::move(action); };
  add(kz::cli::add_eval_command(app));
  add(kz::cli::add_eval_suite_command(app));
  add(kz::cli::add_bench_command(app));
#ifdef KZ_WITH_SERVICE
  add(kz::cli::add_serve_eval_command(app));
#endif
  add(kz::cli::add_propose_command(app));
  add(kz::cli::add_init_model_command(app));
#ifdef KZ_WITH_ENGINE
  add(kz::cli::add_generate_command(app));
#endif
#ifdef KZ_WITH_MODEL_SERVER
  add(kz::cli::add_serve_model_command(app));
#endif
  add(kz::cli::add_config_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kz::cli::kExitUsage;
  }
  for (auto& [command, action] : actions)
    if (command->parsed()) return action();
  return kz::cli::kExitUsage;
}
