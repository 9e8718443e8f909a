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
      {"timing.baseline", o.timing.baseline},
      {"timeouts.startup_s", o.timeouts.startup_s},
      {"timeouts.load_reference_s", o.timeouts.load_reference_s},
      {"timeouts.compile_s", o.timeouts.compile_s},
      {"timeouts.correctness_s", o.timeouts.correctness_s},
      {"timeouts.timing_s", o.timeouts.timing_s},
      {"timeouts.recheck_s", o.timeouts.recheck_s},
      {"timeouts.await_memory_s", o.timeouts.await_memory_s},
      {"timeouts.device_memory_wait_s", o.timeouts.device_memory_wait_s},
      {"worker.python", o.worker.python},
      {"worker.worker_dir", o.worker.worker_dir},
      {"worker.cache_dir", o.worker.cache_dir},
      {"worker.scratch_root", o.worker.scratch_root},
      {"worker.keep_scratch", o.worker.keep_scratch},
      {"worker.kept_builds_max_mb", o.worker.kept_builds_max_mb},
      {"worker.cuda_connections", o.worker.cuda_connections},
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
      {"tuning.jobs", o.tuning.jobs},
      {"tuning.exclusive_timing", o.tuning.exclusive_timing},
      {"tuning.gpu_jobs", o.tuning.gpu_jobs},
      {"tuning.timing_niceness", o.tuning.timing_niceness},
      {"tuning.fork_server", o.tuning.fork_server},
      {"tuning.zygote", o.tuning.zygote},
      {"tuning.parallel_nvcc", o.tuning.parallel_nvcc},
      {"tuning.nvcc_side_by_side", o.tuning.nvcc_side_by_side},
      {"tuning.spare_servers", o.tuning.spare_servers},
      {"tuning.prebuild_niceness", o.tuning.prebuild_niceness},
      {"tuning.prepare_niceness", o.tuning.prepare_niceness},
      {"tuning.compile_niceness", o.tuning.compile_niceness},
      {"tuning.syntax_check", o.tuning.syntax_check},
  };
}

}  // namespace

int default_jobs(const EvalOptions& options) {
  const TuningOptions& tuning = options.tuning;
  if (tuning.jobs > 0) return tuning.jobs;
  if (options.device == "cpu") return cpu_cores();
  return tuning.exclusive_timing ? std::min(tuning.gpu_jobs, cpu_cores()) : 1;
}

int spare_servers(const EvalOptions& options) { return options.device == "cpu" ? 0 : options.tuning.spare_servers; }

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
  if (timing.runs < 1 || timing.input_sets < 1 || timing.warmup_runs < 0 || timing.l2_flush_mb < 0 ||
      timing.launch_spin_us < 0)
    return invalid_argument("timing: runs and input_sets must be >= 1, warmup_runs, l2_flush_mb and launch_spin_us >= 0");
  if (timing.baseline != "eager" && timing.baseline != "compile")
    return invalid_argument(fmt::format("timing.baseline '{}' is neither 'eager' nor 'compile'", timing.baseline));
  for (double t : {timeouts.startup_s, timeouts.load_reference_s, timeouts.compile_s, timeouts.correctness_s,
                   timeouts.timing_s, timeouts.recheck_s, timeouts.await_memory_s})
    if (t <= 0) return invalid_argument("every stage timeout must be positive");
  if (timeouts.device_memory_wait_s < 0) return invalid_argument("timeouts.device_memory_wait_s must be >= 0 (0: no wait)");
  for (double t : {tolerance.atol_fp32, tolerance.rtol_fp32, tolerance.norm_tol_fp32, tolerance.atol_half,
                   tolerance.rtol_half, tolerance.norm_tol_half})
    if (t < 0) return invalid_argument("tolerances must be non-negative");
  if (sandbox.cpu_time_s < 0 || sandbox.file_size_mb < 0 || sandbox.max_processes < 0 || sandbox.memory_mb < 0 ||
      sandbox.open_files < 0 || sandbox.shm_mb < 0 || sandbox.scratch_mb < 0 || sandbox.scratch_files < 0)
    return invalid_argument("sandbox limits must be non-negative (0: no limit)");
  if (worker.kept_builds_max_mb < 0) return invalid_argument("worker.kept_builds_max_mb must be non-negative (0: no limit)");
  if (worker.gpu_memory_processes < 1)
    return invalid_argument(fmt::format("worker.gpu_memory_processes is {}: at least 1 (the evaluation's own worker)",
                                        worker.gpu_memory_processes));
  if (worker.cuda_connections < 0 || worker.cuda_connections > 32)
    return invalid_argument("worker.cuda_connections must be within 0..32 (0: the driver's default, 8)");
  if (sandbox.gpu_memory_fraction < 0 || sandbox.gpu_memory_fraction > 1)
    return invalid_argument("sandbox.gpu_memory_fraction must be within [0, 1] (0: no limit)");
  return tuning.validate();
}

Status TuningOptions::validate() const {
  if (jobs < 0) return invalid_argument("tuning.jobs must be 0 (automatic) or positive");
  if (gpu_jobs < 1) return invalid_argument("tuning.gpu_jobs must be at least 1");
  if (timing_niceness < -20 || timing_niceness > 0)
    return invalid_argument("tuning.timing_niceness must be within -20..0 (0: the worker's priority left as is)");
  if (spare_servers < 0) return invalid_argument("tuning.spare_servers must be non-negative");
  if (prebuild_niceness < -20 || prebuild_niceness > 19)
    return invalid_argument("tuning.prebuild_niceness must be within -20..19 (0: the evaluations' priority)");
  // Above 0 the supervisor could not set the worker back without CAP_SYS_NICE: the request would run niced.
  if (prepare_niceness < -20 || prepare_niceness > 0)
    return invalid_argument("tuning.prepare_niceness must be within -20..0 (0: none)");
  if (compile_niceness < -20 || compile_niceness > 0)
    return invalid_argument("tuning.compile_niceness must be within -20..0 (0: left as is)");
  if (nvcc_side_by_side != "idle" && nvcc_side_by_side != "always")
    return invalid_argument(fmt::format("tuning.nvcc_side_by_side \"{}\": expected idle or always", nvcc_side_by_side));
  if (fork_server != "gpu" && fork_server != "always" && fork_server != "never")
    return invalid_argument(fmt::format("tuning.fork_server '{}' is not one of always, gpu, never", fork_server));
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
