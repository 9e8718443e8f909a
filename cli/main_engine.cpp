// kz-engine: the subcommands that run the libtorch model engine (generate, serve-model, evolve, sft). Users
// call them as `kz generate ...`: kz hands these over (main.cpp), so that kz itself does not link
// libtorch (it starts in milliseconds, and evaluates where libtorch cannot even be loaded).
#include <CLI/CLI.hpp>

#include <map>

#include "commands.h"
#include "kz/dist/world.h"

int main(int argc, char** argv) {
  kz::dist::disable_nvlink_multicast();  // also when started directly, not through kz
  CLI::App app{"KernelZero's model engine: generate text, serve a checkpoint, train", "kz"};
  app.require_subcommand(1);
  std::map<CLI::App*, kz::cli::Action> actions;
  auto add = [&](kz::cli::Action action) { actions[app.get_subcommands({}).back()] = std::move(action); };
  add(kz::cli::add_generate_command(app));
  add(kz::cli::add_evolve_command(app));
  add(kz::cli::add_sft_command(app));
#ifdef KZ_WITH_MODEL_SERVER
  add(kz::cli::add_serve_model_command(app));
#endif
  return kz::cli::run_subcommand(app, actions, argc, argv);
}
