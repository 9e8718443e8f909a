// The verdict cache: an evaluation whose inputs were all seen before returns the stored verdict
// instead of starting a worker.
//
// One SQLite file (WAL mode, a busy timeout) shared by every kz process and thread on a machine:
// key -> verdict JSON + creation time. The key (verdict_cache_key) covers everything that can
// change a verdict: both sources, the resolved format, the device and its GPU model, every protocol
// option the worker receives, the sandbox settings, the worker's own code, its Python interpreter,
// and the supervisor's build (the running executable: the C++ side shapes verdicts too, so a
// rebuilt kz evaluates afresh). What the key leaves out cannot change a verdict (stage timeouts: a
// timeout is never stored; job counts, scratch and cache folders).
//
// Only verdicts that would come out the same again are stored: not infra_error or timeout
// (transient: a busy machine, a broken install), not out_of_memory_shared (memory that other
// evaluations held on the GPU), not worker_crashed (a crash may come from outside: the OOM killer,
// a kill -9), and never compile-only pre-build verdicts. A replay says nothing of the stored run's
// retry (retried_alone): it ran no worker.
//
// Seed 0 ("a fresh secret seed per evaluation") is cached too: such a verdict is a valid sample of
// the same inputs' verdict distribution, so a hit replays that sample (with its seed) instead of
// drawing another. Identical code therefore always earns the identical verdict.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kz/core/status.h"
#include "kz/eval/format.h"
#include "kz/eval/options.h"
#include "kz/eval/verdict.h"

namespace kz {

// An open cache file. Safe to share between threads (calls are serialised on one connection) and
// between processes (SQLite's file locks; WAL lets readers run while one process writes).
class VerdictCache {
 public:
  // Opens the cache at `path`, creating the file and its folder when missing. A file that is not
  // an SQLite database, or whose schema pages are corrupt, is moved aside to `<path>.corrupt` and a
  // fresh cache takes its place (rebuilt() is then true): the cache holds only derived data, so
  // losing it costs time, never correctness. Other failures (an unwritable folder) are errors.
  static Result<VerdictCache> open(const std::filesystem::path& path);

  VerdictCache(VerdictCache&&) noexcept;
  VerdictCache& operator=(VerdictCache&&) noexcept;
  ~VerdictCache();

  // The stored verdict for `key` (its `cached` flag set), nullopt on a miss.
  Result<std::optional<Verdict>> lookup(const std::string& key) const;
  // Stores (or replaces) the verdict for `key` with the current time.
  Status store(const std::string& key, const Verdict& verdict);
  // Number of stored verdicts.
  Result<long long> size() const;

  const std::filesystem::path& path() const;
  bool rebuilt() const;  // open() found a corrupt file and started afresh

 private:
  struct Impl;
  explicit VerdictCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What identifies an evaluation besides the options.
struct CacheKeyParts {
  std::string_view reference_source;
  std::string_view candidate_source;
  Format format;                     // after auto-detection
  std::string_view gpu_name;         // the GPU model(s); empty on the CPU or when unknown
  std::string_view code_version;     // worker_code_version(), the interpreter, supervisor_version()
};

// 32 hex digits over the parts and protocol_fingerprint(options).
std::string verdict_cache_key(const EvalOptions& options, const CacheKeyParts& parts);

// The protocol options of a worker request: device, trials, use_cpu_sizes, size overrides,
// tolerances and timing settings. The evaluator sends exactly this object to the worker, so an
// option added here reaches both the worker and the cache key; one added elsewhere reaches neither.
nlohmann::json protocol_options_json(const EvalOptions& options);

// Canonical JSON (sorted keys) of protocol_options_json, the configured seed and the sandbox
// settings (a limit or a namespace can turn a verdict into sandbox_violation).
std::string protocol_fingerprint(const EvalOptions& options);

// content_hash over every .py file of kz_worker and kz_rtc, subpackages included, under `worker_dir`
// (names and texts): editing the worker invalidates every verdict it produced.
Result<std::string> worker_code_version(const std::filesystem::path& worker_dir);

// content_hash of the running executable (read once per process): verdicts also depend on the
// supervisor's code (statuses it assigns, sandbox limits it enforces). Unreadable: a per-process
// random value, so nothing is shared rather than something stale.
const std::string& supervisor_version();

// The GPU model names, sorted and joined with '|' ("NVIDIA H200"): the driver's
// /proc/driver/nvidia/gpus/*/information, else nvidia-smi's; empty when neither says. Every model of the host is named (not just the evaluated device's, whose
// nvidia-smi index may differ from its CUDA index), so a verdict never crosses GPU models.
std::string gpu_model_names();
// Every GPU's UUID ("GPU-...") and every MIG instance's ("MIG-..."), whatever CUDA_VISIBLE_DEVICES
// says: from `nvidia-smi -L`, else the GPUs' alone from the driver's
// /proc/driver/nvidia/gpus/*/information (a container without nvidia-smi). Empty where neither is.
std::vector<std::string> gpu_uuids();
// The UUIDs in `nvidia-smi -L`'s lines, "GPU 0: NVIDIA H200 (UUID: GPU-...)" and
// "  MIG 1g.18gb Device 0: (UUID: MIG-...)".
std::vector<std::string> uuids_in_device_list(const std::vector<std::string>& lines);
// The values of `field` ("Model", "GPU UUID") in each <gpus_dir>/<bus id>/information, sorted.
std::vector<std::string> fields_in_driver_info(const std::filesystem::path& gpus_dir, const std::string& field);
// The "GPU UUID:" of each <gpus_dir>/<bus id>/information, sorted.
std::vector<std::string> uuids_in_driver_info(const std::filesystem::path& gpus_dir);
// GPUs visible to CUDA: CUDA_VISIBLE_DEVICES's entries when set, else the GPUs nvidia-smi lists.
int gpu_count();

// Whether the verdict may be stored (see the file comment).
bool is_cacheable(const Verdict& verdict);

// The cache file the options name: cache.path, else <cache_dir>/verdicts.sqlite.
std::filesystem::path verdict_cache_path(const EvalOptions& options, const std::filesystem::path& cache_dir);

}  // namespace kz
