// The evaluation flags shared by `kz eval`, `kz eval-suite` and `kz config show`.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "kz/eval/suite.h"

namespace kz::cli {

void add_eval_flags(CLI::App& command, EvalFlags& flags) {
  command.add_option("--config", flags.config_path, "TOML file overriding the defaults (see configs/eval.toml)");
  command.add_option("--device", flags.device,
                     "cpu or cuda:N (default cpu); eval-suite and serve-eval also take cuda:0,cuda:1,... or cuda:all (a pool per GPU)");
  command.add_option("--format", flags.format, "auto, cuda, triton, cuda-rtc or torch (default auto)");
  command.add_option("--policy", flags.policy,
                     "what ModelNew.forward may run: strict (its own kernels, with allocation, views and copies) or "
                     "kernelbench (any PyTorch op too, its kernels' work reaching the output); default strict "
                     "([policy] mode)")
      ->check(CLI::IsMember({"strict", "kernelbench"}));
  command.add_option("--baseline", flags.baseline,
                     "GPU timing: eager (speedup over the reference as written) or compile (also over "
                     "torch.compile of it: compile_speedup); default eager ([timing] baseline)")
      ->check(CLI::IsMember({"eager", "compile"}));
  command.add_option("--trials", flags.trials, "correctness trials, each on fresh inputs (default 5)");
  command.add_option("--seed", flags.seed, "fixed evaluation seed (default: a fresh secret seed per evaluation)");
  command.add_option("--size", flags.sizes, "override a reference size constant, NAME=VALUE (repeatable)");
  command.add_flag("--no-timing", flags.no_timing, "skip GPU timing (correctness only)");
  command.add_flag("--no-cache", flags.no_cache, "neither reuse nor store verdicts (the [cache] section)");
  command.add_option("--jobs", flags.jobs, "evaluations at once, per device (default: cores on cpu, [tuning] gpu_jobs on a GPU)");
}

Result<EvalOptions> resolve_eval_options(const EvalFlags& flags) {
  EvalOptions options;
  if (!flags.config_path.empty()) KZ_RETURN_IF_ERROR(apply_toml_file(flags.config_path, options));
  if (!flags.device.empty()) options.device = flags.device;
  if (!flags.format.empty()) options.format = flags.format;
  if (!flags.policy.empty()) options.policy.mode = flags.policy;
  if (!flags.baseline.empty()) options.timing.baseline = flags.baseline;
  if (flags.trials) options.trials = flags.trials;
  if (flags.seed) options.seed = flags.seed;
  if (flags.no_timing) options.timing.enabled = false;
  if (flags.no_cache) options.cache.enabled = false;
  if (flags.jobs >= 0) options.tuning.jobs = flags.jobs;
  for (const auto& size : flags.sizes) {
    auto eq = size.find('=');
    long long value = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument("no '='");
      size_t used = 0;
      value = std::stoll(size.substr(eq + 1), &used);
      if (used != size.size() - eq - 1) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      return invalid_argument(fmt::format("--size '{}': expected NAME=INTEGER", size));
    }
    options.size_overrides[size.substr(0, eq)] = value;
  }
  KZ_RETURN_IF_ERROR(options.validate());
  return options;
}

Result<std::vector<std::string>> take_device_list(EvalFlags& flags) {
  if (flags.device.find(',') == std::string::npos && flags.device != "cuda:all") return std::vector<std::string>{};
  auto devices = parse_devices(flags.device);
  if (!devices.ok()) return devices.status();
  flags.device = devices->front();
  return devices;
}

int report_error(const Status& status) {
  std::cerr << "kz: " << status.message() << "\n";
  return status.code() == StatusCode::invalid_argument ? kExitUsage : kExitInfra;
}

}  // namespace kz::cli
