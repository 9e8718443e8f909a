// The supervisor side of one evaluation: request, worker process, stage deadlines, verdict.
#include "kz/eval/evaluator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <regex>

#include "kz/core/files.h"
#include "kz/core/hash.h"
#include "kz/core/parallel.h"
#include "kz/sandbox/process.h"
#include "kz/eval/kept_builds.h"
#include "kz/eval/sandbox.h"
#include "kz/eval/scratch_dirs.h"
#include "kz/eval/static_checks.h"
#include "kz/eval/worker_client.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kScratchPrefix = "kz-eval-";

uint64_t fresh_seed() {
  std::random_device device;
  return ((uint64_t{device()} << 32) ^ device()) & 0x7fffffffffffull;  // fits a Python/JSON int comfortably
}

double stage_timeout_s(const StageTimeouts& t, const std::string& stage) {
  if (stage == "load_reference") return t.load_reference_s;
  if (stage == "compile") return t.compile_s;
  if (stage == "correctness") return t.correctness_s;
  if (stage == "timing") return t.timing_s;
  if (stage == "recheck") return t.recheck_s;
  if (stage == "await_memory") return t.await_memory_s;
  return t.startup_s;
}

// The protocol options (device, trials, sizes, tolerances, timing) come from
// protocol_options_json, the same object the verdict cache key is made of. `gpu_alone`: the worker
// reserves every memory slot of its GPU (worker/kz_worker/gpu_memory.py), for a run again alone.
nlohmann::json make_request(const EvalOptions& o, const Task& task, const Candidate& candidate, Format format,
                            uint64_t seed, const fs::path& scratch, EvalMode mode, bool gpu_alone) {
  nlohmann::json request = protocol_options_json(o);
  request["task_id"] = task.id;
  request["reference_source"] = task.source;
  request["candidate_source"] = candidate.source;
  request["format"] = format_name(format);
  request["mode"] = mode == EvalMode::compile_only ? "compile" : "eval";
  request["seed"] = seed;
  request["scratch_dir"] = scratch.string();
  if (gpu_alone) request["gpu_alone"] = true;
  return request;
}

// A CUDA out-of-memory while other evaluations held memory on the same GPU: the GPU's, not the
// candidate's, and worth one run with the GPU's memory to itself.
bool ran_out_beside_others(const Verdict& verdict) {
  return verdict.status == EvalStatus::infra_error && verdict.has_check(Check::out_of_memory_shared);
}

// Seconds per stage, each stage once, where it was first entered: a worker that waits for GPU memory
// leaves load_reference for await_memory and goes back to it (worker/kz_worker/harness.py), and
// the verdict profile's stage_s (a JSON object) holds one figure per stage.
std::vector<std::pair<std::string, double>> seconds_per_stage(const std::vector<std::pair<std::string, double>>& entered) {
  std::vector<std::pair<std::string, double>> stages;
  for (const auto& [stage, seconds] : entered) {
    auto seen = std::find_if(stages.begin(), stages.end(), [&](const auto& s) { return s.first == stage; });
    if (seen == stages.end()) stages.emplace_back(stage, seconds);
    else seen->second += seconds;
  }
  return stages;
}

// The verdict for a worker run: its own verdict, or the supervisor's for a timeout, crash or
// protocol violation.
Verdict verdict_from_outcome(const WorkerOutcome& outcome) {
  using Kind = WorkerOutcome::Kind;
  if (outcome.kind == Kind::result) {
    auto verdict = verdict_from_json(outcome.result);
    if (verdict.ok()) return *verdict;
    return make_verdict(EvalStatus::infra_error, {Check::worker_protocol},
                        "worker sent an unreadable verdict: " + verdict.status().message());
  }
  if (outcome.kind == Kind::protocol_error)
    return make_verdict(EvalStatus::infra_error, {Check::worker_protocol}, outcome.message);
  Verdict v = outcome.kind == Kind::timeout
                  ? make_verdict(EvalStatus::timeout, {Check::stage_timeout}, outcome.message)
              : outcome.kind == Kind::forged
                  ? make_verdict(EvalStatus::cheat_detected, {Check::forged_message}, outcome.message)
                  : make_verdict(EvalStatus::runtime_error, {Check::worker_crashed}, outcome.message);
  v.stage = outcome.stage;
  return v;
}

}  // namespace

std::optional<Format> resolve_format(const std::string& requested, const std::string& source) {
  if (requested == "auto") return detect_format(source);
  return parse_format(requested);
}

Evaluator::Evaluator(EvalOptions options, WorkerSetup setup) : options_(std::move(options)), setup_(std::move(setup)) {}

Result<Evaluator> Evaluator::create(EvalOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  auto setup = resolve_worker_setup(options.worker, options.tuning, options.device);
  if (!setup.ok()) return setup.status();
  Evaluator evaluator(std::move(options), std::move(*setup));
  if (evaluator.options_.cache.enabled) KZ_RETURN_IF_ERROR(evaluator.open_cache());
  if (evaluator.options_.tuning.syntax_check) evaluator.syntax_checker_ = SyntaxChecker::shared(evaluator.setup_);
  return evaluator;
}

Status Evaluator::open_cache() {
  fs::path path = verdict_cache_path(options_, setup_.cache_dir);
  auto cache = VerdictCache::open(path);
  if (!cache.ok())
    return Status(cache.status().code(),
                  cache.status().message() + " (turn the cache off with --no-cache or [cache] enabled = false)");
  cache_ = std::make_shared<VerdictCache>(std::move(*cache));
  auto code = worker_code_version(setup_.worker_dir);
  if (!code.ok()) return code.status();
  // The interpreter's real path names its venv (venv-<hash of requirements.txt>): new torch, new keys.
  std::error_code ec;
  const std::string& python = setup_.python;
  fs::path interpreter = python.find('/') != std::string::npos ? fs::canonical(python, ec) : fs::path(python);
  code_version_ = content_hash({*code, ec ? python : interpreter.string(), supervisor_version()});
  if (options_.device != "cpu") gpu_name_ = gpu_model_names();
  return Status::ok();
}

Result<Evaluator> Evaluator::with_format(const std::string& format) const {
  Evaluator copy = *this;
  copy.options_.format = format;
  KZ_RETURN_IF_ERROR(copy.options_.validate());
  return copy;
}

Result<Evaluator> Evaluator::with_policy(const std::string& mode) const {
  Evaluator copy = *this;
  copy.options_.policy.mode = mode;
  KZ_RETURN_IF_ERROR(copy.options_.validate());
  return copy;
}

Result<Evaluator> Evaluator::with_device(const std::string& device) const {
  Evaluator copy = *this;
  copy.options_.device = device;
  KZ_RETURN_IF_ERROR(copy.options_.validate());
  if ((device == "cpu") != (options_.device == "cpu"))
    return invalid_argument(fmt::format("cannot mix the CPU and GPUs in one run ({} and {})", options_.device, device));
  return copy;
}

std::string Evaluator::cache_key(const Task& task, const Candidate& candidate, Format format) const {
  return verdict_cache_key(options_, {task.source, candidate.source, format, gpu_name_, code_version_});
}

bool Evaluator::has_cached_verdict(const Task& task, const Candidate& candidate) const {
  auto format = resolve_format(options_.format, candidate.source);
  if (!cache_ || !format) return false;
  auto hit = cache_->lookup(cache_key(task, candidate, *format));
  return hit.ok() && hit->has_value();
}

Result<Verdict> Evaluator::evaluate(const Task& task, const Candidate& candidate, EvalMode mode) const {
  auto started = Clock::now();
  auto finish = [&](Verdict v, const std::string& format, uint64_t seed) {
    v.task_id = task.id;
    v.candidate = candidate.label;
    v.format = format;
    v.device = options_.device;
    v.policy = options_.policy.mode;
    v.seed = seed;
    if (v.trials == 0) v.trials = options_.trials;
    v.profile.wall_s = std::chrono::duration<double>(Clock::now() - started).count();
    return v;
  };
  auto format = resolve_format(options_.format, candidate.source);
  if (!format)
    return finish(make_verdict(EvalStatus::format_error, {Check::format_unrecognised},
                               options_.format == "auto"
                                   ? "no kernel format recognised (expected load_inline, kz_rtc or @triton.jit)"
                                   : "unknown format " + options_.format),
                  options_.format, 0);
  if (*format != Format::torch && !std::regex_search(candidate.source, std::regex(R"((^|\n)class\s+ModelNew\b)")))
    return finish(make_verdict(EvalStatus::format_error, {Check::no_model_new}, "candidate defines no class ModelNew"),
                  format_name(*format), 0);
  // Static anti-cheating checks on the source (static_checks.h): cheap, so before the cache and any worker.
  if (auto findings = static_checks(candidate.source, *format, task.source); !findings.empty())
    return finish(static_checks_verdict(findings), format_name(*format), 0);
  // Python's own compiler, in a long-lived interpreter (syntax_check.h): a millisecond, not a worker.
  if (syntax_checker_)
    if (auto error = syntax_checker_->error(candidate.source)) return finish(syntax_error_verdict(*error), format_name(*format), 0);

  bool use_cache = cache_ && mode == EvalMode::full;  // pre-build verdicts say nothing about correctness
  std::string key = use_cache ? cache_key(task, candidate, *format) : "";
  if (use_cache) {
    auto hit = cache_->lookup(key);  // a failing lookup is a miss: the cache only saves time
    if (hit.ok() && hit->has_value()) return finish(**hit, format_name(*format), (*hit)->seed);
  }
  uint64_t seed = options_.seed ? options_.seed : fresh_seed();
  auto verdict = run_worker(task, candidate, *format, seed, mode, /*gpu_alone=*/false);
  // Once more, with the same seed, once no other evaluation holds memory on the GPU; its verdict
  // stands, whatever it is (a second out_of_memory_shared included: no third run). Its profile's wall_s, from
  // `started`, counts both runs.
  bool retried_alone = verdict.ok() && mode == EvalMode::full && ran_out_beside_others(*verdict);
  if (retried_alone) verdict = run_worker(task, candidate, *format, seed, mode, /*gpu_alone=*/true);
  if (!verdict.ok())  // reaches serve-eval's clients too: no scratch path (below)
    return Status(verdict.status().code(), scrub_scratch_paths(verdict.status().message()));
  verdict->retried_alone = retried_alone;
  Verdict done = finish(std::move(*verdict), format_name(*format), seed);
  // A traceback names the request's scratch dir; a fork server's next request (a GRPO sibling's)
  // runs in that server's dir, so the path must reach neither the cache, which workers can read,
  // nor the model.
  done.message = scrub_scratch_paths(done.message);
  // is_cacheable keeps out_of_memory_shared out: the GPU's other evaluations, not the candidate.
  if (use_cache && is_cacheable(done)) (void)cache_->store(key, done);  // a failed store costs a re-run later
  return done;
}

WorkerSetup Evaluator::worker_setup(EvalMode mode) const {
  WorkerSetup setup = setup_;
  setup.fork_server = uses_fork_server(options_.tuning, options_.device);  // with_device may have changed it
  setup.require_isolation = options_.sandbox.enabled && options_.sandbox.require_isolation;
  setup.timing_niceness = mode == EvalMode::full ? options_.tuning.timing_niceness : 0;  // builds never time
  setup.compile_niceness = mode == EvalMode::full ? options_.tuning.compile_niceness : 0;  // builds: prebuild_niceness
  setup.prepare_niceness = mode == EvalMode::full ? options_.tuning.prepare_niceness : 0;  // builds: prebuild_niceness throughout
  setup.scratch_bound = scratch_bound(options_.sandbox);
  // As many idle servers of a kind as run at once: evaluations on this device (and [tuning]
  // spare_servers more, whose next child is ready when a short evaluation hands its server back), or
  // `cuda` pre-builds (one per core), so that the next batch's first wave finds them all prepared.
  setup.max_idle_servers = mode == EvalMode::compile_only ? cpu_cores() : default_jobs(options_) + spare_servers(options_);
  return setup;
}

void Evaluator::customize_worker(ProcessSpec& spec, EvalMode mode) const {
  set_worker_device(options_.device, spec);
  if (mode == EvalMode::compile_only) {
    spec.env["KZ_WORKER_ROLE"] = "build";  // worker/kz_worker/process.py
    spec.nice_increment = options_.tuning.prebuild_niceness;
  }
  apply_sandbox(options_.sandbox, options_.device, spec);
}

Status Evaluator::start_fork_servers(int count, EvalMode mode) const {
  return kz::start_fork_servers(worker_setup(mode), kScratchPrefix,
                                [this, mode](ProcessSpec& spec) { customize_worker(spec, mode); }, count);
}

// Every 64th build kept by this process (the first included) looks at the size of them all: a scan of
// the directory, which an RL run fills at ~1 MB per `cuda` candidate.
void Evaluator::prune_now_and_then() const {
  static std::atomic<unsigned> kept{0};
  static std::mutex pruning;
  if (kept++ % 64 != 0) return;
  std::lock_guard lock(pruning);
  prune_kept_builds(extension_builds_dir(setup_.cache_dir), uint64_t(options_.worker.kept_builds_max_mb) << 20);
}

std::string Evaluator::extension_build_key(const Candidate& candidate) const {
  const char* arch = std::getenv("TORCH_CUDA_ARCH_LIST");  // passed on to the workers (worker_client.cpp)
  return content_hash({"extension-build-v1", candidate.source, code_version_, gpu_name_,
                       options_.device == "cpu" ? "cpu" : "cuda", arch ? arch : ""});
}

Result<Verdict> Evaluator::run_worker(const Task& task, const Candidate& candidate, Format format, uint64_t seed,
                                      EvalMode mode, bool gpu_alone) const {
  // A `cuda` candidate builds in its own scratch dir; the supervisor keeps the build, by the
  // candidate's bytes, where no worker can write, and hands it to the candidate's later requests
  // (the evaluation after its pre-build): no candidate can reach another's build (docs/evaluation.md).
  fs::path kept_builds;
  if (format == Format::cuda) kept_builds = extension_builds_dir(setup_.cache_dir) / extension_build_key(candidate);
  auto outcome = run_worker_request(
      worker_setup(mode), kScratchPrefix,
      [&](const fs::path& scratch) {
        auto request = make_request(options_, task, candidate, format, seed, scratch, mode, gpu_alone);
        request["sandbox"] = sandbox_request_json(options_.sandbox);
        if (options_.device != "cpu") {
          std::string lock_dir = prepared_gpu_lock_dir(setup_.cache_dir).string();
          if (options_.tuning.exclusive_timing) request["gpu_lock_dir"] = lock_dir;  // worker/kz_worker/gpu_lock.py
          // Memory is reserved whether or not timings are exclusive (worker/kz_worker/gpu_memory.py):
          // its slot files, and how many processes may hold a CUDA context on the GPU beside it.
          request["gpu_memory_dir"] = lock_dir;
          request["gpu_memory_processes"] = options_.worker.gpu_memory_processes;
          request["device_memory_wait_s"] = options_.timeouts.device_memory_wait_s;
        }
        if (!kept_builds.empty()) {
          std::error_code error;
          request["extensions"] = {{"dir", (scratch / "torch_extensions").string()},
                                   {"prebuilt", fs::is_directory(kept_builds, error) ? nlohmann::json(kept_builds.string())
                                                                                     : nlohmann::json()}};
        }
        return request;
      },
      [&](const std::string& stage) { return stage_timeout_s(options_.timeouts, stage); },
      [this, mode](ProcessSpec& spec) { customize_worker(spec, mode); },
      [&](const fs::path& scratch) {
        if (!kept_builds.empty() && keep_extension_builds(scratch, kept_builds)) prune_now_and_then();
      });
  if (!outcome.ok()) return outcome.status().with_context(fmt::format("task {}: starting the worker", task.id));
  warn_sandbox_gaps(outcome->sandbox);
  Verdict verdict = verdict_from_outcome(*outcome);
  // A limit only the supervisor sees (SIGXCPU, SIGXFSZ, the process cap) overrides the rest.
  if (auto violation = limit_verdict(outcome->limit_hit, options_.sandbox, verdict)) verdict = std::move(*violation);
  verdict.profile.stage_s = seconds_per_stage(outcome->stage_s);
  // The worker reports its device wait; the server wait is ours alone.
  auto& startup = verdict.profile.startup_s;
  std::erase_if(startup, [](const auto& part) { return part.first == "server"; });
  if (outcome->server_wait_s) startup.insert(startup.begin(), {"server", *outcome->server_wait_s});
  return verdict;
}

}  // namespace kz
