// `kz` subcommands. Each lives in its own file: it declares its flags on a CLI11 subcommand,
// parses them into library options, calls the library and prints. Exit codes: 0 when the
// command did its job (an evaluation that reached a verdict, pass or fail), 1 for
// infrastructure errors, 2 for usage errors.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>

#include "kz/eval/options.h"

namespace kz::cli {

enum ExitCode { kExitOk = 0, kExitInfra = 1, kExitUsage = 2 };

// Returns the action to run after parsing (it returns the exit code).
using Action = std::function<int()>;

Action add_eval_command(CLI::App& app);
Action add_eval_suite_command(CLI::App& app);
Action add_config_command(CLI::App& app);
Action add_bench_command(CLI::App& app);
Action add_serve_eval_command(CLI::App& app);
Action add_propose_command(CLI::App& app);
Action add_teach_command(CLI::App& app);        // the kernel teacher's corpus (kz/teacher/corpus.h)
Action add_init_model_command(CLI::App& app);
Action add_report_command(CLI::App& app);
Action add_train_tokenizer_command(CLI::App& app);
Action add_generate_command(CLI::App& app);     // kz-engine only (libtorch)
Action add_serve_model_command(CLI::App& app);
Action add_evolve_command(CLI::App& app);       // kz-engine: the co-evolution loop (kz/loop/evolve.h)  // kz-engine, with cpp-httplib (KZ_WITH_MODEL_SERVER)
Action add_sft_command(CLI::App& app);          // kz-engine: supervised training (kz/sft/sft.h)
Action add_launch_command(CLI::App& app);       // N local data-parallel ranks (kz/dist/launch.h)

// Flags shared by every command that evaluates: declared once here.
struct EvalFlags {
  std::string config_path;
  std::string device;
  std::string format;
  std::string policy;  // strict | kernelbench; empty: the config's ([policy] mode)
  std::string baseline;  // eager | compile; empty: the config's ([timing] baseline)
  int trials = 0;
  uint64_t seed = 0;
  std::vector<std::string> sizes;  // NAME=VALUE
  bool no_timing = false;
  bool no_cache = false;
  int jobs = -1;
};
void add_eval_flags(CLI::App& command, EvalFlags& flags);
// Defaults <- configs file (if given) <- flags. Errors name the flag or config key.
Result<EvalOptions> resolve_eval_options(const EvalFlags& flags);
// Several GPUs (--device cuda:0,cuda:1 or cuda:all): the list, with flags.device set to its first
// (the evaluation options' device); one device: an empty list.
Result<std::vector<std::string>> take_device_list(EvalFlags& flags);

// Prints "kz: <message>" on stderr and returns the exit code for the status.
int report_error(const Status& status);

// Parses argv and runs the subcommand given (its Action from `actions`); the exit code.
int run_subcommand(CLI::App& app, const std::map<CLI::App*, Action>& actions, int argc, char** argv);

}  // namespace kz::cli
