// The sandbox around a worker process: [sandbox] options -> ProcessSpec (OS-level limits and
// namespaces, kz/sandbox/process.h), the worker's own share (the audit hook of
// worker/kz_worker/sandbox.py, configured by the request's "sandbox" object), and the verdicts for
// the limits only the supervisor sees (a worker killed by SIGXCPU / SIGXFSZ, the process cap).
//
// docs/evaluation.md ("Sandbox") has the table of what is enforced by what, and what is not.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/sandbox/process.h"
#include "kz/eval/options.h"
#include "kz/eval/scratch_dirs.h"
#include "kz/eval/verdict.h"

namespace kz {

// Where the workers of one machine find their per-GPU lock files (worker/kz_worker/gpu_lock.py):
// under the cache dir, so every kz process that shares the caches shares the locks too.
std::filesystem::path gpu_lock_dir(const std::filesystem::path& cache_dir);

// "gpu-<UUID>", the lock files' name without suffix, as the workers name them: nvidia-smi's "GPU-" or
// "MIG-" prefix dropped (torch's UUIDs have none), any character but alphanumerics and '-' made '_'.
std::string gpu_lock_file_stem(const std::string& gpu_uuid);

// GPU memory slots per GPU: a worker locks ceil(budget / slot) of the ".memory-slot-N" files before
// it allocates (worker/kz_worker/gpu_memory.py). worker/kz_worker/gpu_memory.py's SLOTS must be the
// same: a slot file the supervisor did not make is one a sandboxed worker cannot make.
inline constexpr int kGpuMemorySlots = 16;

// Makes `lock_dir` and, for each GPU, its ".lock" and ".turnstile" files (the timing lock,
// gpu_lock.py), and its ".memory-turnstile" and ".memory-slot-0" .. ".memory-slot-15" files (the
// memory reservation, gpu_memory.py): existing regular files are kept as they are, anything else in
// their place (a symlink, a FIFO) is replaced. Workers cannot write in the lock dir under the
// sandbox: a lock file a candidate could unlink would split the lock, and timings would overlap (or
// evaluations allocate past the card).
Status make_gpu_lock_files(const std::filesystem::path& lock_dir, const std::vector<std::string>& gpu_uuids);

// gpu_lock_dir(cache_dir), with the lock files of every GPU and MIG instance (gpu_uuids: asked once
// per process, again after a minute where none were found), checked and made at each call; a
// failure, or no UUID found, is said once on stderr, and the workers then report the missing file.
std::filesystem::path prepared_gpu_lock_dir(const std::filesystem::path& cache_dir);

// Where the supervisor keeps `cuda` candidates' extension builds, one directory per candidate
// (Evaluator): read-only to every worker, so no candidate can touch another's build.
std::filesystem::path extension_builds_dir(const std::filesystem::path& cache_dir);

// Applies `options` to a worker's spec (nothing when disabled). spec.cwd must be the scratch dir:
// it and /dev/shm stay writable (/dev/shm a fresh tmpfs of the worker's own where shm_mb > 0).
// The address-space limit applies only when `device` is "cpu". The first call with the sandbox
// enabled also makes this (supervisor) process non-dumpable, so a worker without CAP_SYS_PTRACE
// cannot read its /proc/<pid>/environ or memory, nor ptrace it.
void apply_sandbox(const SandboxOptions& options, const std::string& device, ProcessSpec& spec);

// The request's "sandbox" object: what the worker enforces itself (the audit hook's writable
// directories, the GPU memory fraction).
nlohmann::json sandbox_request_json(const SandboxOptions& options);

// What a worker's scratch dir may hold under `options` (nothing bounded with the sandbox off).
ScratchBound scratch_bound(const SandboxOptions& options);

// The sandbox_violation verdict for a limit the worker hit (cpu_limit, file_size_limit,
// scratch_limit, process_limit), keeping the stage and any sandbox checks of `verdict` (the worker's or the
// supervisor's own conclusion); nullopt when no limit was hit.
std::optional<Verdict> limit_verdict(LimitHit hit, const SandboxOptions& options, const Verdict& verdict);

// Says once per process, on stderr, which requested sandbox parts this machine could not apply
// (e.g. no network namespace without root). Never fails an evaluation.
void warn_sandbox_gaps(const SandboxReport& report);

}  // namespace kz
