// [sandbox] applied to the worker process, and the verdicts for the limits the supervisor sees.
#include "kz/eval/sandbox.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "kz/eval/cache.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

// Besides its scratch dir a worker may write to /dev/shm only (CUDA's IPC and torch's shared memory
// live there). Every compile cache is the request's own, in its scratch dir, and the GPU locks'
// files are the supervisor's (prepared_gpu_lock_dir).
constexpr const char* kSharedMemoryDir = "/dev/shm";

}  // namespace

fs::path gpu_lock_dir(const fs::path& cache_dir) { return cache_dir / "locks"; }

std::string gpu_lock_file_stem(const std::string& gpu_uuid) {
  bool prefixed = gpu_uuid.rfind("GPU-", 0) == 0 || gpu_uuid.rfind("MIG-", 0) == 0;
  std::string name = prefixed ? gpu_uuid.substr(4) : gpu_uuid;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  return "gpu-" + name;
}

Status make_gpu_lock_files(const fs::path& lock_dir, const std::vector<std::string>& gpu_uuids) {
  std::error_code error;
  fs::create_directories(lock_dir, error);
  if (error) return internal_error(fmt::format("making the GPU lock dir {}: {}", lock_dir.string(), error.message()));
  for (const std::string& uuid : gpu_uuids) {
    for (const char* suffix : {".lock", ".turnstile"}) {
      fs::path path = lock_dir / (gpu_lock_file_stem(uuid) + suffix);
      int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);  // never truncates one in use
      if (fd < 0) return internal_error(fmt::format("making the GPU lock file {}: {}", path.string(), std::strerror(errno)));
      ::close(fd);
    }
  }
  return Status::ok();
}

fs::path prepared_gpu_lock_dir(const fs::path& cache_dir) {
  static std::mutex mutex;
  static std::set<fs::path> prepared;
  fs::path dir = gpu_lock_dir(cache_dir);
  std::lock_guard lock(mutex);
  if (prepared.insert(dir).second) {
    auto uuids = gpu_uuids();
    if (uuids.empty())
      std::fprintf(stderr, "kz: no GPU UUID found (nvidia-smi -L, /proc/driver/nvidia/gpus): no GPU lock files made in "
                           "%s; a sandboxed worker cannot make its own, and its evaluation fails\n", dir.c_str());
    if (Status made = make_gpu_lock_files(dir, uuids); !made.is_ok())
      std::fprintf(stderr, "kz: %s (GPU evaluations will fail to take their lock)\n", made.to_string().c_str());
  }
  return dir;
}

fs::path extension_builds_dir(const fs::path& cache_dir) { return cache_dir / "extension_builds"; }

void apply_sandbox(const SandboxOptions& options, const std::string& device, ProcessSpec& spec) {
  if (!options.enabled) return;
  static std::once_flag protect_once;
  std::call_once(protect_once, [] { ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); });

  ResourceLimits& limits = spec.limits;
  limits.cpu_time_s = static_cast<uint64_t>(std::ceil(options.cpu_time_s));
  limits.file_size_bytes = static_cast<uint64_t>(options.file_size_mb) << 20;
  limits.max_processes = static_cast<uint64_t>(options.max_processes);
  limits.address_space_bytes = device == "cpu" ? static_cast<uint64_t>(options.memory_mb) << 20 : 0;
  limits.open_files = static_cast<uint64_t>(options.open_files);
  limits.no_core_dumps = true;
  spec.new_network_namespace = !options.network;
  spec.drop_capabilities = true;
  spec.read_only_filesystem = options.read_only_filesystem;
  if (options.read_only_filesystem) {
    spec.writable_paths = {spec.cwd};
    std::error_code ec;
    if (fs::is_directory(kSharedMemoryDir, ec)) spec.writable_paths.push_back(kSharedMemoryDir);
  }
}

nlohmann::json sandbox_request_json(const SandboxOptions& options) {
  return {{"enabled", options.enabled},
          {"writable_dirs", nlohmann::json::array({kSharedMemoryDir})},
          {"gpu_memory_fraction", options.gpu_memory_fraction}};
}

std::optional<Verdict> limit_verdict(LimitHit hit, const SandboxOptions& options, const Verdict& verdict) {
  Check check = Check::cpu_limit;
  std::string message;
  switch (hit) {
    case LimitHit::none:
      return std::nullopt;
    case LimitHit::cpu_time:
      check = Check::cpu_limit;
      message = fmt::format("the worker used up its CPU-time limit ({:g} s, RLIMIT_CPU) and was killed",
                            options.cpu_time_s);
      break;
    case LimitHit::file_size:
      check = Check::file_size_limit;
      message = fmt::format("a write went past the file size limit ({} MB, RLIMIT_FSIZE); the worker was killed",
                            options.file_size_mb);
      break;
    case LimitHit::processes:
      check = Check::process_limit;
      message = fmt::format(
          "the candidate started more than {} processes/threads (sandbox.max_processes); the worker's process "
          "group was killed",
          options.max_processes);
      break;
  }
  Verdict v = make_verdict(EvalStatus::sandbox_violation, {check}, message);
  v.stage = verdict.stage;
  v.compiled = verdict.compiled;
  if (!verdict.stage.empty()) v.message += fmt::format(" (stage '{}')", verdict.stage);
  if (verdict.status == EvalStatus::sandbox_violation) {  // keep what the worker caught itself
    for (Check c : verdict.checks)
      if (!v.has_check(c)) v.checks.push_back(c);
    v.message += "\n" + verdict.message;
  }
  return v;
}

void warn_sandbox_gaps(const SandboxReport& report) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard lock(mutex);
  for (const std::string& note : report.notes) {
    // Remount failures name a mount each: say the first kind of failure once, not once per mount.
    std::string key = note.substr(0, note.find(" ("));
    if (!said.insert(key).second) continue;
    std::fprintf(stderr, "kz: sandbox: %s (continuing without it; docs/evaluation.md, \"Sandbox\")\n", note.c_str());
  }
}

}  // namespace kz
