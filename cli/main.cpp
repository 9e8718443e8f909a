// kz: the KernelZero command line. Thin glue: each subcommand parses flags into library
// options, calls the library and prints.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string_view>
#include <vector>

#include "commands.h"
#include "kz/dist/world.h"

namespace {

// generate and serve-model run in kz-engine, built beside kz where libtorch was found: the only
// program that links it. Returns only when kz-engine could not be started.
int hand_over_to_engine(int argc, char** argv) {
  std::error_code ec;
  auto engine = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "kz-engine";
  if (ec || !std::filesystem::exists(engine)) {
    std::cerr << "kz: " << argv[1] << " needs kz-engine beside kz, built only where libtorch is found "
              << "(KZ_WITH_TORCH; docs/model.md)\n";
    return kz::cli::kExitUsage;
  }
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  ::execv(engine.c_str(), args.data());
  std::cerr << "kz: cannot start " << engine.string() << ": " << std::strerror(errno) << "\n";
  return kz::cli::kExitInfra;
}

// `kz sft --nproc N ...` is `kz launch --nproc N -- sft ...` (and so for evolve): the arguments
// rewritten so.
std::vector<std::string> launch_arguments(int argc, char** argv) {
  std::vector<std::string> rest;
  std::string nproc;
  for (int i = 2; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--nproc" && i + 1 < argc) nproc = argv[++i];
    else if (arg.starts_with("--nproc=")) nproc = std::string(arg.substr(8));
    else rest.emplace_back(arg);
  }
  if (nproc.empty()) return {};
  std::vector<std::string> args = {argv[0], "launch", "--nproc", nproc, "--", argv[1]};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

bool is_engine_command(std::string_view name) {
  return name == "generate" || name == "serve-model" || name == "evolve" || name == "sft";
}

}  // namespace

int main(int argc, char** argv) {
  kz::dist::disable_nvlink_multicast();  // inherited by every process kz starts
  const bool data_parallel = argc > 1 && (std::string_view(argv[1]) == "sft" || std::string_view(argv[1]) == "evolve");
  std::vector<std::string> launch = data_parallel ? launch_arguments(argc, argv) : std::vector<std::string>{};
  std::vector<char*> launch_argv;
  for (auto& arg : launch) launch_argv.push_back(arg.data());
  if (!launch.empty()) argc = static_cast<int>(launch_argv.size()), argv = launch_argv.data();
  if (argc > 1 && is_engine_command(argv[1])) return hand_over_to_engine(argc, argv);
  CLI::App app{"KernelZero: train and evaluate kernel-writing models", "kz"};
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
  add(kz::cli::add_teach_command(app));
  add(kz::cli::add_init_model_command(app));
  add(kz::cli::add_report_command(app));
  add(kz::cli::add_train_tokenizer_command(app));
  add(kz::cli::add_launch_command(app));
  // Listed for --help only: main() hands these to kz-engine before parsing.
  app.add_subcommand("generate", "Raw-text continuation from a checkpoint (kz-engine; kz generate --help)");
  app.add_subcommand("serve-model", "A checkpoint as an OpenAI-compatible endpoint (kz-engine; kz serve-model --help)");
  app.add_subcommand("evolve", "Co-evolve a Proposer and a Coder with CA-GRPO (kz-engine; kz evolve --help)");
  app.add_subcommand("sft", "Supervised training on a kz teach corpus (kz-engine; kz sft --help)");
  add(kz::cli::add_config_command(app));
  return kz::cli::run_subcommand(app, actions, argc, argv);
}
