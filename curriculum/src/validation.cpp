// Module validation: the request to the worker, the worker run, the verdict.
#include "kz/curriculum/validation.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kz/eval/sandbox.h"
#include "kz/eval/syntax_check.h"
#include "kz/eval/worker_client.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

double stage_deadline_s(const ModuleValidationOptions& o, const std::string& stage) {
  if (stage == "startup") return o.startup_s;
  if (stage == "load") return o.load_s;
  if (stage == "runtime") return o.runtime_s;
  return o.check_s;  // build, determinism, outputs, inputs, apis (and any stage added later)
}

nlohmann::json make_request(const std::string& source, const std::vector<ApiEntry>& apis,
                            const ModuleValidationOptions& o, const fs::path& scratch, const fs::path& cache_dir) {
  nlohmann::json requested = nlohmann::json::array();
  for (const auto& api : apis) requested.push_back({{"name", api.name}, {"aten", api.aten}});
  nlohmann::json request = {{"mode", "validate_module"},
          {"module_source", source},
          {"apis", requested},
          {"device", o.device},
          {"seed", o.seed},
          {"scratch_dir", scratch.string()},
          {"use_cpu_sizes", o.use_cpu_sizes},
          {"time_band_ms", {o.time_band_min_ms, o.time_band_max_ms}},
          {"cpu_max_ms", o.cpu_max_ms},
          {"timing_runs", o.timing_runs}};
  request["sandbox"] = sandbox_request_json(o.sandbox);
  // Its GPU work takes the GPU lock shared and its time-band runs exclusive, like an evaluation:
  // evaluations sharing the GPU neither disturb it nor are disturbed by it (worker/kz_worker/gpu_lock.py).
  if (o.device != "cpu") request["gpu_lock_dir"] = prepared_gpu_lock_dir(cache_dir).string();
  return request;
}

Result<ModuleVerdict> verdict_from_result(const nlohmann::json& result) {
  try {
    ModuleVerdict verdict;
    verdict.valid = result.at("valid").get<bool>();
    verdict.reason = result.value("reason", "");
    verdict.failed_check = result.value("failed_check", "");
    verdict.aten_ops = result.value("aten_ops", std::vector<std::string>{});
    verdict.output_shapes = result.value("output_shapes", std::vector<std::vector<int64_t>>{});
    verdict.fingerprint = result.value("fingerprint", "");
    const auto& runtime = result.contains("runtime_ms") ? result["runtime_ms"] : nlohmann::json();
    verdict.runtime_ms = runtime.is_number() ? runtime.get<double>() : 0.0;
    return verdict;
  } catch (const nlohmann::json::exception& error) {
    return parse_error(std::string("unreadable validation result: ") + error.what());
  }
}

ModuleVerdict supervisor_verdict(const std::string& check, const std::string& message) {
  ModuleVerdict verdict;
  verdict.failed_check = check;
  verdict.reason = check + ": " + message;
  return verdict;
}

}  // namespace

Status ModuleValidationOptions::validate() const {
  if (device != "cpu" && device.rfind("cuda", 0) != 0)
    return invalid_argument(fmt::format("device '{}': expected cpu or cuda:N", device));
  if (time_band_min_ms < 0 || time_band_max_ms <= time_band_min_ms)
    return invalid_argument(fmt::format("time band [{}, {}] ms: expected 0 <= min < max", time_band_min_ms,
                                        time_band_max_ms));
  if (cpu_max_ms <= 0) return invalid_argument("cpu_max_ms must be positive");
  if (timing_runs < 1) return invalid_argument("timing_runs must be >= 1");
  if (dedup_threshold <= 0 || dedup_threshold > 1) return invalid_argument("dedup_threshold must be in (0, 1]");
  for (double s : {startup_s, load_s, check_s, runtime_s})
    if (s <= 0) return invalid_argument("validation stage deadlines must be positive");
  return Status::ok();
}

Result<ModuleVerdict> validate_module(const std::string& source, const std::vector<ApiEntry>& apis,
                                      const ModuleValidationOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  auto setup = resolve_worker_setup(options.worker, options.tuning, options.device);
  if (!setup.ok()) return setup.status();
  setup->scratch_bound = scratch_bound(options.sandbox);
  // Python's own compiler first, in a long-lived interpreter (kz/eval/syntax_check.h): a module
  // that is not valid Python costs a millisecond, not a worker. The worker's check says the same.
  if (options.tuning.syntax_check)
    if (auto error = SyntaxChecker::shared(*setup)->error(source, "module.py"))
      return supervisor_verdict("loads", "not valid Python: " + *error);  // worker/kz_worker/validate.py's words
  auto outcome = run_worker_request(
      *setup, "kz-validate-",
      [&](const fs::path& scratch) { return make_request(source, apis, options, scratch, setup->cache_dir); },
      [&](const std::string& stage) { return stage_deadline_s(options, stage); },
      [&](ProcessSpec& spec) {
        set_worker_device(options.device, spec);
        apply_sandbox(options.sandbox, options.device, spec);
      });
  if (!outcome.ok()) return outcome.status().with_context("module validation: starting the worker");
  warn_sandbox_gaps(outcome->sandbox);
  switch (outcome->kind) {
    case WorkerOutcome::Kind::result: {
      // The machine could not run it (worker/kz_worker/validate.py): an error, no verdict on the module.
      if (outcome->result.contains("infra_error"))
        return internal_error("module validation: " + outcome->result.value("infra_error", std::string("?")));
      auto verdict = verdict_from_result(outcome->result);
      // The module runs inside the worker and could write to its message pipe: an unreadable
      // result is the module's fault, not an infrastructure failure.
      if (!verdict.ok()) return supervisor_verdict("worker_protocol", verdict.status().message());
      return verdict;
    }
    case WorkerOutcome::Kind::timeout: return supervisor_verdict("stage_timeout", outcome->message);
    case WorkerOutcome::Kind::crashed: return supervisor_verdict("worker_crashed", outcome->message);
    case WorkerOutcome::Kind::protocol_error: return supervisor_verdict("worker_protocol", outcome->message);
    // The module wrote a message of its own on the worker's pipe: rejected, like a candidate that does.
    case WorkerOutcome::Kind::forged: return supervisor_verdict("forged_message", outcome->message);
  }
  return internal_error("module validation: unknown worker outcome");
}

}  // namespace kz
