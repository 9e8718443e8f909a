// `kz launch`: N local ranks of a kz command with the torchrun environment (kz/dist/launch.h),
// e.g. `kz launch --nproc 2 -- sft --config C.toml` (or `kz sft --nproc 2 --config C.toml`).
// Exits 0 when every rank did; else with the code of the rank that failed first, the others
// stopped. Several hosts: the same command on each with --nnodes, --node-rank, --master-addr
// and --master-port (docs/scale.md).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "commands.h"
#include "kz/dist/launch.h"

namespace kz::cli {

Action add_launch_command(CLI::App& app) {
  auto options = std::make_shared<dist::LaunchOptions>();
  auto command_args = std::make_shared<std::vector<std::string>>();
  auto* command = app.add_subcommand("launch", "Run a kz command as N data-parallel ranks on this host "
                                               "(kz launch --nproc 2 -- sft --config C.toml)");
  command->add_option("--nproc", options->nproc, "ranks on this host, one per GPU")->check(CLI::PositiveNumber);
  command->add_option("--nnodes", options->nnodes, "hosts taking part (default 1)")->check(CLI::PositiveNumber);
  command->add_option("--node-rank", options->node_rank, "this host's index among them (default 0)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--master-addr", options->master_addr, "rank 0's host (default 127.0.0.1)");
  command->add_option("--master-port", options->master_port, "its rendezvous port (default: a free one)")
      ->check(CLI::Range(0, 65535));
  command->add_option("command", *command_args, "the kz subcommand and its flags, after --")->required();
  return [options, command_args] {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return report_error(io_error("kz launch: cannot find its own executable: " + ec.message()));
    options->argv = {self.string()};
    options->argv.insert(options->argv.end(), command_args->begin(), command_args->end());
    auto report = dist::launch_local(*options);
    if (!report.ok()) return report_error(report.status());
    if (report->failure.empty()) return static_cast<int>(kExitOk);
    std::cerr << fmt::format("kz launch: {}; the other ranks were stopped\n", report->failure);
    const int local = report->failed_rank - options->node_rank * options->nproc;
    if (report->failed_rank < 0 || local < 0 || local >= static_cast<int>(report->exit_codes.size()))
      return static_cast<int>(kExitInfra);  // interrupted
    return report->exit_codes[static_cast<size_t>(local)];
  };
}

}  // namespace kz::cli
