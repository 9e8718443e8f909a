// The part of main() every kz program shares: parse, then run the one subcommand given.
#include "commands.h"

namespace kz::cli {

int run_subcommand(CLI::App& app, const std::map<CLI::App*, Action>& actions, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  for (const auto& [command, action] : actions)
    if (command->parsed()) return action();
  return kExitUsage;
}

}  // namespace kz::cli
