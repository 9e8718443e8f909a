// [sandbox] applied to the worker process, and the verdicts for the limits the supervisor sees.
#include "kz/eval/sandbox.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>

#include "kz/eval/cache.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

// Besides its scratch dir a worker may write to /dev/shm only (CUDA's IPC and torch's shared memory
// live there): its own tmpfs there ([sandbox] shm_mb), else the host's. Every compile cache is the
// request's own, in its scratch dir, and the GPU locks' files are the supervisor's
// (prepared_gpu_lock_dir).
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

namespace {

// Whether `path` opens as a regular file, made if missing and never truncated (one may be in use);
// never following a symlink nor waiting on a FIFO. `error` says why not.
bool opens_as_regular_file(const fs::path& path, std::string& error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    error = std::strerror(errno);
    return false;
  }
  struct stat info {};
  bool regular = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  ::close(fd);
  if (!regular) error = "not a regular file";
  return regular;
}

// A regular lock file at `path`. Anything else there (a symlink or a FIFO a candidate left in a
// directory once writable to workers) is removed first: following it would split
// the lock again, or block on open.
Status make_lock_file(const fs::path& path) {
  std::string error;
  if (opens_as_regular_file(path, error) || (::unlink(path.c_str()) == 0 && opens_as_regular_file(path, error)))
    return Status::ok();
  return internal_error(fmt::format("making the GPU lock file {}: {}", path.string(), error));
}

}  // namespace

Status make_gpu_lock_files(const fs::path& lock_dir, const std::vector<std::string>& gpu_uuids) {
  std::error_code error;
  fs::create_directories(lock_dir, error);
  if (error) return internal_error(fmt::format("making the GPU lock dir {}: {}", lock_dir.string(), error.message()));
  for (const std::string& uuid : gpu_uuids) {
    std::string stem = gpu_lock_file_stem(uuid);
    for (const char* suffix : {".lock", ".turnstile", ".memory-turnstile"})
      KZ_RETURN_IF_ERROR(make_lock_file(lock_dir / (stem + suffix)));
    for (int slot = 0; slot < kGpuMemorySlots; ++slot)
      KZ_RETURN_IF_ERROR(make_lock_file(lock_dir / fmt::format("{}.memory-slot-{}", stem, slot)));
  }
  return Status::ok();
}

fs::path prepared_gpu_lock_dir(const fs::path& cache_dir) {
  // The UUIDs are asked for once a process (again a minute after none were found); the files are
  // checked at every request (19 opens per GPU, tens of microseconds each), so a cache dir cleared
  // under a running service is mended.
  static std::mutex mutex;
  static std::vector<std::string> uuids;
  static std::optional<std::chrono::steady_clock::time_point> asked;
  static std::set<fs::path> warned;
  fs::path dir = gpu_lock_dir(cache_dir);
  std::lock_guard lock(mutex);
  auto now = std::chrono::steady_clock::now();
  if (!asked || (uuids.empty() && now - *asked > std::chrono::minutes(1))) {
    uuids = gpu_uuids();
    asked = now;
  }
  Status made = make_gpu_lock_files(dir, uuids);
  if (uuids.empty()) made = not_found("no GPU UUID found (nvidia-smi -L, /proc/driver/nvidia/gpus)");
  if (!made.is_ok() && warned.insert(dir).second)
    std::fprintf(stderr, "kz: %s: no GPU lock files in %s; a sandboxed worker cannot make its own, and its "
                         "evaluation is an infra_error\n", made.to_string().c_str(), dir.c_str());
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
  spec.new_pid_namespace = options.pid_namespace;
  spec.syscall_filter = options.syscall_filter;
  if (options.read_only_filesystem) {
    spec.writable_paths = {spec.cwd};
    std::error_code ec;
    if (!fs::is_directory(kSharedMemoryDir, ec)) return;
    if (options.shm_mb > 0)
      spec.fresh_tmpfs.push_back({kSharedMemoryDir, static_cast<uint64_t>(options.shm_mb) << 20});
    else
      spec.writable_paths.push_back(kSharedMemoryDir);
  }
}

nlohmann::json sandbox_request_json(const SandboxOptions& options) {
  return {{"enabled", options.enabled},
          {"writable_dirs", nlohmann::json::array({kSharedMemoryDir})},
          {"gpu_memory_fraction", options.gpu_memory_fraction}};
}

ScratchBound scratch_bound(const SandboxOptions& options) {
  if (!options.enabled) return {};
  return {static_cast<uint64_t>(options.scratch_mb) << 20, static_cast<uint64_t>(options.scratch_files)};
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
    case LimitHit::scratch:
      check = Check::scratch_limit;
      // The supervisor's own words (scratch_over_bound): which bound, or why it could not measure.
      message = verdict.message;
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
