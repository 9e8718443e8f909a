// The supervisor side of one evaluation: request, worker process, stage deadlines, verdict.
#include "kz/eval/evaluator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <regex>

#include "kz/core/files.h"
#include "kz/core/subprocess.h"

#ifndef KZ_DEFAULT_PYTHON
#define KZ_DEFAULT_PYTHON "python3"
#endif
#ifndef KZ_DEFAULT_WORKER_DIR
#define KZ_DEFAULT_WORKER_DIR "worker"
#endif

namespace kz {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

fs::path default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "kernelzero";
  return fs::path(env_or("HOME", "/tmp")) / ".cache" / "kernelzero";
}

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
  return t.startup_s;
}

// The worker's environment: nothing inherited but what it needs (no API keys, no tokens).
std::map<std::string, std::string> worker_environment(const std::string& python, const fs::path& worker_dir,
                                                      const fs::path& cache_dir, const fs::path& scratch) {
  auto parent = current_environment();
  std::map<std::string, std::string> env;
  std::string path = env_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  if (python.find('/') != std::string::npos) path = fs::path(python).parent_path().string() + ":" + path;
  std::string cuda_home = env_or("CUDA_HOME", fs::exists("/usr/local/cuda") ? "/usr/local/cuda" : "");
  if (!cuda_home.empty()) path += ":" + cuda_home + "/bin";
  env["PATH"] = path;
  env["HOME"] = scratch.string();
  env["TMPDIR"] = scratch.string();
  env["PYTHONPATH"] = worker_dir.string();
  env["PYTHONUNBUFFERED"] = "1";
  env["PYTHONDONTWRITEBYTECODE"] = "1";
  env["PYTHONNOUSERSITE"] = "1";
  env["TORCH_EXTENSIONS_DIR"] = (cache_dir / "torch_extensions").string();
  env["TRITON_CACHE_DIR"] = (cache_dir / "triton").string();
  env["MAX_JOBS"] = std::to_string(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  if (!cuda_home.empty()) env["CUDA_HOME"] = cuda_home;
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "KZ_NVRTC_LIB", "KZ_RTC_ARCH",
                           "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                           "LANG", "LC_ALL"}) {
    if (auto it = parent.find(name); it != parent.end()) env[name] = it->second;
  }
  return env;
}

nlohmann::json make_request(const EvalOptions& o, const Task& task, const Candidate& candidate, Format format,
                            uint64_t seed, const fs::path& scratch, EvalMode mode) {
  const auto& t = o.tolerance;
  return {
      {"task_id", task.id},
      {"reference_source", task.source},
      {"candidate_source", candidate.source},
      {"format", format_name(format)},
      {"device", o.device},
      {"mode", mode == EvalMode::compile_only ? "compile" : "eval"},
      {"seed", seed},
      {"trials", o.trials},
      {"scratch_dir", scratch.string()},
      {"use_cpu_sizes", o.use_cpu_sizes},
      {"size_overrides", o.size_overrides},
      {"tolerance",
       {{"atol_fp32", t.atol_fp32}, {"rtol_fp32", t.rtol_fp32}, {"norm_tol_fp32", t.norm_tol_fp32},
        {"atol_half", t.atol_half}, {"rtol_half", t.rtol_half}, {"norm_tol_half", t.norm_tol_half}}},
      {"timing",
       {{"enabled", o.timing.enabled}, {"warmup_runs", o.timing.warmup_runs}, {"runs", o.timing.runs},
        {"input_sets", o.timing.input_sets}, {"l2_flush_mb", o.timing.l2_flush_mb}}},
  };
}

std::string tail(const std::string& text, size_t max_chars = 3000) {
  return text.size() <= max_chars ? text : "..." + text.substr(text.size() - max_chars);
}

// Follows the worker's stage messages until a verdict, a deadline or the worker's death.
Verdict supervise(Process& worker, const StageTimeouts& timeouts) {
  std::string stage = "startup";
  auto deadline = Clock::now() + std::chrono::duration<double>(timeouts.startup_s);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::string line;
    auto event = worker.read_message(line, std::max(left, std::chrono::milliseconds(0)));
    if (event == Process::ReadEvent::timeout) {
      worker.kill_and_reap();
      Verdict v = make_verdict(EvalStatus::timeout, {Check::stage_timeout},
                               fmt::format("stage '{}' ran past its {:g} s limit; the worker was killed", stage,
                                           stage_timeout_s(timeouts, stage)));
      v.stage = stage;
      return v;
    }
    if (event == Process::ReadEvent::eof) {
      auto exit = worker.wait_for(std::chrono::seconds(10));
      std::string how = exit ? exit->describe() : "no exit after closing its pipe";
      worker.kill_and_reap();  // the group may still hold the worker's orphans
      Verdict v = make_verdict(EvalStatus::runtime_error, {Check::worker_crashed},
                               fmt::format("worker died during stage '{}' ({}) without a verdict; stderr:\n{}", stage,
                                           how, tail(worker.stderr_tail())));
      v.stage = stage;
      return v;
    }
    auto message = nlohmann::json::parse(line, nullptr, false);
    std::string type = message.is_object() ? message.value("type", "") : "";
    if (type == "stage") {
      stage = message.value("name", "?");
      deadline = Clock::now() + std::chrono::duration<double>(stage_timeout_s(timeouts, stage));
    } else if (type == "result") {
      auto verdict = verdict_from_json(message);
      worker.wait_for(std::chrono::seconds(10));
      worker.kill_and_reap();  // nothing the candidate started may outlive its evaluation
      if (verdict.ok()) return *verdict;
      return make_verdict(EvalStatus::infra_error, {Check::worker_protocol},
                          "worker sent an unreadable verdict: " + verdict.status().message());
    } else {
      worker.kill_and_reap();
      return make_verdict(EvalStatus::infra_error, {Check::worker_protocol},
                          "worker sent an unknown message: " + tail(line, 300));
    }
  }
}

}  // namespace

std::optional<Format> resolve_format(const std::string& requested, const std::string& source) {
  if (requested == "auto") return detect_format(source);
  return parse_format(requested);
}

Evaluator::Evaluator(EvalOptions options, std::string python, fs::path worker_dir, fs::path cache_dir)
    : options_(std::move(options)), python_(std::move(python)), worker_dir_(std::move(worker_dir)),
      cache_dir_(std::move(cache_dir)) {}

Result<Evaluator> Evaluator::create(EvalOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  std::string python = !options.worker.python.empty() ? options.worker.python : env_or("KZ_PYTHON", KZ_DEFAULT_PYTHON);
  fs::path worker_dir = !options.worker.worker_dir.empty() ? options.worker.worker_dir
                                                            : fs::path(env_or("KZ_WORKER_DIR", KZ_DEFAULT_WORKER_DIR));
  if (!fs::exists(worker_dir / "kz_worker" / "__main__.py"))
    return not_found(fmt::format("evaluation worker not found: {} (set KZ_WORKER_DIR or [worker] worker_dir)",
                                 (worker_dir / "kz_worker").string()));
  if (python.find('/') != std::string::npos && !fs::exists(python))
    return not_found(fmt::format("worker Python '{}' does not exist (run scripts/setup.sh, or set KZ_PYTHON)", python));
  fs::path cache_dir = !options.worker.cache_dir.empty() ? options.worker.cache_dir : default_cache_dir();
  return Evaluator(std::move(options), std::move(python), fs::absolute(worker_dir), std::move(cache_dir));
}

Result<Verdict> Evaluator::evaluate(const Task& task, const Candidate& candidate, EvalMode mode) const {
  auto started = Clock::now();
  auto finish = [&](Verdict v, const std::string& format, uint64_t seed) {
    v.task_id = task.id;
    v.candidate = candidate.label;
    v.format = format;
    v.device = options_.device;
    v.seed = seed;
    if (v.trials == 0) v.trials = options_.trials;
    v.wall_s = std::chrono::duration<double>(Clock::now() - started).count();
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

  uint64_t seed = options_.seed ? options_.seed : fresh_seed();
  fs::path scratch_root = !options_.worker.scratch_root.empty() ? options_.worker.scratch_root
                                                                 : fs::path(env_or("TMPDIR", "/tmp"));
  auto scratch = make_unique_dir(scratch_root, "kz-eval-");
  if (!scratch.ok()) return scratch.status().with_context("creating the scratch dir");

  ProcessSpec spec;
  spec.argv = {python_, "-m", "kz_worker"};
  spec.env = worker_environment(python_, worker_dir_, cache_dir_, *scratch);
  spec.cwd = *scratch;
  spec.stdin_data = make_request(options_, task, candidate, *format, seed, *scratch, mode).dump();
  spec.message_pipe = true;
  auto worker = Process::spawn(spec);
  if (!worker.ok()) return worker.status().with_context(fmt::format("task {}: starting the worker", task.id));

  Verdict verdict = supervise(*worker, options_.timeouts);
  if (!options_.worker.keep_scratch) {
    std::error_code ignored;
    fs::remove_all(*scratch, ignored);
  }
  return finish(std::move(verdict), format_name(*format), seed);
}

}  // namespace kz
