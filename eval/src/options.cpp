// EvalOptions: validation, the TOML mapping (one table of keys, used both ways), and the evaluations
// at once they ask for.
#include "kz/eval/options.h"

#include <fmt/format.h>

#include <algorithm>

#include "kz/core/config_fields.h"
#include "kz/core/parallel.h"
#include "kz/eval/format.h"

namespace kz {
namespace {

// The field table, in the order `kz config show` prints it. Sections are the prefixes.
ConfigTable config_table(EvalOptions& o) {
  return {
      {"device", o.device},
      {"format", o.format},
      {"trials", o.trials},
      {"seed", o.seed},
      {"use_cpu_sizes", o.use_cpu_sizes},
      {"kernel_share", o.kernel_share},
      {"jobs", o.jobs},
      {"size_overrides", o.size_overrides},
      {"policy.mode", o.policy.mode},
      {"policy.min_custom_kernel_share", o.policy.min_custom_kernel_share},
      {"tolerance.rule", o.tolerance.rule},
      {"tolerance.atol_fp32", o.tolerance.atol_fp32},
      {"tolerance.rtol_fp32", o.tolerance.rtol_fp32},
      {"tolerance.norm_tol_fp32", o.tolerance.norm_tol_fp32},
      {"tolerance.atol_half", o.tolerance.atol_half},
      {"tolerance.rtol_half", o.tolerance.rtol_half},
      {"tolerance.norm_tol_half", o.tolerance.norm_tol_half},
      {"timing.enabled", o.timing.enabled},
      {"timing.warmup_runs", o.timing.warmup_runs},
      {"timing.runs", o.timing.runs},
      {"timing.input_sets", o.timing.input_sets},
      {"timing.l2_flush_mb", o.timing.l2_flush_mb},
      {"timing.launch_spin_us", o.timing.launch_spin_us},
      {"timing.exclusive", o.timing.exclusive},
      {"timing.gpu_jobs", o.timing.gpu_jobs},
      {"timing.niceness", o.timing.niceness},
      {"timing.baseline", o.timing.baseline},
      {"timeouts.startup_s", o.timeouts.startup_s},
      {"timeouts.load_reference_s", o.timeouts.load_reference_s},
      {"timeouts.compile_s", o.timeouts.compile_s},
      {"timeouts.correctness_s", o.timeouts.correctness_s},
      {"timeouts.timing_s", o.timeouts.timing_s},
      {"timeouts.recheck_s", o.timeouts.recheck_s},
      {"timeouts.await_memory_s", o.timeouts.await_memory_s},
      {"worker.python", o.worker.python},
      {"worker.worker_dir", o.worker.worker_dir},
      {"worker.cache_dir", o.worker.cache_dir},
      {"worker.scratch_root", o.worker.scratch_root},
      {"worker.keep_scratch", o.worker.keep_scratch},
      {"worker.kept_builds_max_mb", o.worker.kept_builds_max_mb},
      {"worker.fork_server", o.worker.fork_server},
      {"worker.zygote", o.worker.zygote},
      {"worker.fresh_while_zygote_imports", o.worker.fresh_while_zygote_imports},
      {"worker.parallel_nvcc", o.worker.parallel_nvcc},
      {"worker.nvcc_side_by_side", o.worker.nvcc_side_by_side},
      {"worker.spare_servers", o.worker.spare_servers},
      {"worker.prebuild_niceness", o.worker.prebuild_niceness},
      {"worker.prepare_niceness", o.worker.prepare_niceness},
      {"worker.compile_niceness", o.worker.compile_niceness},
      {"worker.cuda_connections", o.worker.cuda_connections},
      {"worker.check_kernels_while_awaited", o.worker.check_kernels_while_awaited},
      {"worker.syntax_check", o.worker.syntax_check},
      {"cache.enabled", o.cache.enabled},
      {"cache.path", o.cache.path},
      {"sandbox.enabled", o.sandbox.enabled},
      {"sandbox.cpu_time_s", o.sandbox.cpu_time_s},
      {"sandbox.file_size_mb", o.sandbox.file_size_mb},
      {"sandbox.scratch_mb", o.sandbox.scratch_mb},
      {"sandbox.scratch_files", o.sandbox.scratch_files},
      {"sandbox.max_processes", o.sandbox.max_processes},
      {"sandbox.memory_mb", o.sandbox.memory_mb},
      {"sandbox.open_files", o.sandbox.open_files},
      {"sandbox.network", o.sandbox.network},
      {"sandbox.read_only_filesystem", o.sandbox.read_only_filesystem},
      {"sandbox.pid_namespace", o.sandbox.pid_namespace},
      {"sandbox.syscall_filter", o.sandbox.syscall_filter},
      {"sandbox.shm_mb", o.sandbox.shm_mb},
      {"sandbox.require_isolation", o.sandbox.require_isolation},
      {"sandbox.gpu_memory_fraction", o.sandbox.gpu_memory_fraction},
  };
}

}  // namespace

int default_jobs(const EvalOptions& options) {
  if (options.jobs > 0) return options.jobs;
  if (options.device == "cpu") return cpu_cores();
  return options.timing.exclusive ? std::min(options.timing.gpu_jobs, cpu_cores()) : 1;
}

int spare_servers(const EvalOptions& options) { return options.device == "cpu" ? 0 : options.worker.spare_servers; }

void set_gpu_memory_processes(EvalOptions& options, int jobs) {
  options.worker.gpu_memory_processes = std::max(1, jobs + spare_servers(options));
}

Status EvalOptions::validate() const {
  if (device != "cpu" && device.rfind("cuda", 0) != 0)
    return invalid_argument(fmt::format("device '{}' is neither 'cpu' nor 'cuda:N'", device));
  if (format != "auto" && !parse_format(format))
    return invalid_argument(fmt::format("format '{}' is not one of auto, cuda, triton, cuda-rtc, torch", format));
  if (trials < 1) return invalid_argument("trials must be at least 1");
  if (kernel_share != "cuda" && kernel_share != "all")
    return invalid_argument(fmt::format("kernel_share '{}' is neither 'cuda' nor 'all'", kernel_share));
  if (policy.mode != "strict" && policy.mode != "kernelbench")
    return invalid_argument(fmt::format("policy.mode '{}' is neither 'strict' nor 'kernelbench'", policy.mode));
  if (!(policy.min_custom_kernel_share >= 0 && policy.min_custom_kernel_share <= 1))
    return invalid_argument("policy.min_custom_kernel_share must be within [0, 1] (0: off)");
  if (tolerance.rule != "kz" && tolerance.rule != "kernelbench" && tolerance.rule != "float64")
    return invalid_argument(fmt::format("tolerance.rule '{}' is not one of kz, kernelbench, float64", tolerance.rule));
  if (jobs < 0) return invalid_argument("jobs must be 0 (automatic) or positive");
  if (timing.runs < 1 || timing.input_sets < 1 || timing.gpu_jobs < 1 || timing.warmup_runs < 0 ||
      timing.l2_flush_mb < 0 || timing.launch_spin_us < 0)
    return invalid_argument(
        "timing: runs, input_sets and gpu_jobs must be >= 1, warmup_runs, l2_flush_mb and launch_spin_us >= 0");
  if (timing.baseline != "eager" && timing.baseline != "compile")
    return invalid_argument(fmt::format("timing.baseline '{}' is neither 'eager' nor 'compile'", timing.baseline));
  if (timing.niceness < -20 || timing.niceness > 0)
    return invalid_argument("timing.niceness must be within -20..0 (0: the worker's priority left as is)");
  for (double t : {timeouts.startup_s, timeouts.load_reference_s, timeouts.compile_s, timeouts.correctness_s,
                   timeouts.timing_s, timeouts.recheck_s, timeouts.await_memory_s})
    if (t <= 0) return invalid_argument("every stage timeout must be positive");
  for (double t : {tolerance.atol_fp32, tolerance.rtol_fp32, tolerance.norm_tol_fp32, tolerance.atol_half,
                   tolerance.rtol_half, tolerance.norm_tol_half})
    if (t < 0) return invalid_argument("tolerances must be non-negative");
  if (sandbox.cpu_time_s < 0 || sandbox.file_size_mb < 0 || sandbox.max_processes < 0 || sandbox.memory_mb < 0 ||
      sandbox.open_files < 0 || sandbox.shm_mb < 0 || sandbox.scratch_mb < 0 || sandbox.scratch_files < 0)
    return invalid_argument("sandbox limits must be non-negative (0: no limit)");
  if (worker.kept_builds_max_mb < 0) return invalid_argument("worker.kept_builds_max_mb must be non-negative (0: no limit)");
  if (worker.spare_servers < 0) return invalid_argument("worker.spare_servers must be non-negative");
  if (worker.gpu_memory_processes < 1)
    return invalid_argument(fmt::format("worker.gpu_memory_processes is {}: at least 1 (the evaluation's own worker)",
                                        worker.gpu_memory_processes));
  if (worker.prebuild_niceness < -20 || worker.prebuild_niceness > 19)
    return invalid_argument("worker.prebuild_niceness must be within -20..19 (0: the evaluations' priority)");
  // Above 0 the supervisor could not set the worker back without CAP_SYS_NICE: the request would run niced.
  if (worker.prepare_niceness < -20 || worker.prepare_niceness > 0)
    return invalid_argument("worker.prepare_niceness must be within -20..0 (0: none)");
  if (worker.compile_niceness < -20 || worker.compile_niceness > 0)
    return invalid_argument("worker.compile_niceness must be within -20..0 (0: left as is)");
  if (worker.cuda_connections < 0 || worker.cuda_connections > 32)
    return invalid_argument("worker.cuda_connections must be within 0..32 (0: the driver's default, 8)");
  if (worker.nvcc_side_by_side != "idle" && worker.nvcc_side_by_side != "always")
    return invalid_argument(fmt::format("worker.nvcc_side_by_side \"{}\": expected idle or always", worker.nvcc_side_by_side));
  if (worker.fork_server != "gpu" && worker.fork_server != "always" && worker.fork_server != "never")
    return invalid_argument(
        fmt::format("worker.fork_server '{}' is not one of always, gpu, never", worker.fork_server));
  if (sandbox.gpu_memory_fraction < 0 || sandbox.gpu_memory_fraction > 1)
    return invalid_argument("sandbox.gpu_memory_fraction must be within [0, 1] (0: no limit)");
  return Status::ok();
}

Status apply_toml_text(std::string_view text, std::string_view origin, EvalOptions& options) {
  KZ_RETURN_IF_ERROR(apply_config_text(text, origin, config_table(options)));
  return options.validate().with_context(std::string(origin));
}

Status apply_toml_file(const std::filesystem::path& path, EvalOptions& options) {
  KZ_RETURN_IF_ERROR(apply_config_file(path, config_table(options)));
  return options.validate().with_context(path.string());
}

std::string to_toml(const EvalOptions& options) {
  EvalOptions copy = options;  // the table holds non-const references
  return config_to_toml(config_table(copy));
}

}  // namespace kz
