// The evaluation service (`kz serve-eval`): evaluations over HTTP/JSON, for many clients at once.
//
// Clients submit batches of (reference, candidate) items; each item becomes a job in one FIFO
// queue; N evaluation threads take jobs and run them through an Evaluator (one worker process per
// evaluation, the verdict cache in front). On a GPU, `cuda` jobs are pre-built first, as kz
// eval-suite does: compile-only, by `compile_jobs` build threads beside the evaluations, so the
// nvcc builds use the CPU's cores while the GPU evaluates other jobs; a failed build is the job's
// verdict. Every accepted item is answered exactly once: a worker that crashes or is killed (by
// anyone) becomes that job's runtime_error/worker_crashed verdict, a failure to start one becomes
// infra_error, and the service goes on.
//
// API (JSON bodies; an error is {"error": message} with status 400, or 404 for unknown ids/paths):
//   POST /v1/evaluations   {"items": [{"id": client id (string or integer), "reference": source,
//                          "candidate": source, "format": "auto"|"cuda"|"triton"|"cuda-rtc"|"torch"
//                          (optional: the server's --format), "task_id": optional label,
//                          "policy": "strict"|"kernelbench" (optional: the server's --policy)}]}
//                          -> 202 {"batch": B, "jobs": [{"id": client id, "job": J}, ...]}
//   GET /v1/jobs/J         -> {"job", "id", "batch", "state": "queued"|"building"|"running"|"done",
//                          "verdict" when done}
//   GET /v1/batches/B      -> {"batch", "done": bool, "counts": {"queued", "building", "running", "done"},
//                          "jobs": [job, ...]}
//   GET /v1/batches/B/stream -> chunked application/x-ndjson: one {"id", "job", "verdict"} line per job
//                          as it finishes (those already finished first); ends when the batch is done
//   DELETE /v1/batches/B   -> {"batch", "cancelled": N}: the batch's jobs not yet started are answered
//                          now (infra_error, "cancelled by the client"); started ones finish. For a
//                          trainer that gives up on a step's stragglers, or restarts.
//   GET /v1/health         -> {"status": "ok", "device" (the first), "devices", "workers" (per device),
//                          "compile_jobs", "queued", "building",
//                          "running", "done", "submitted", "cache": path or null}
// Verdicts are kz eval --json objects (to_json(Verdict)), `cached` true for cache hits; their profile's
// started_s (and a pre-built job's prebuild_started_s, prebuild_s) count from the batch's submission.
//
// On a GPU, timings never overlap on a device: each holds the device's GPU lock alone ([tuning]
// exclusive_timing), or, without it, one evaluation at a time runs on each device. With several devices
// each evaluation goes to the one with the fewest in flight. Finished batches are forgotten
// `retention_s` after their last verdict.
// The process ignores SIGPIPE from the first EvalService on (a client that disconnects must not
// kill the server; cpp-httplib writes to sockets without MSG_NOSIGNAL); worker processes reset it.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/eval/cache.h"
#include "kz/eval/options.h"

namespace kz {

struct ServiceItem {
  nlohmann::json id;       // the client's id (string or integer), echoed back with the answer
  std::string reference;   // reference module source (KernelBench format)
  std::string candidate;   // candidate module source defining ModelNew
  std::string format;      // empty: the server's configured format (EvalOptions::format)
  std::string task_id;     // the verdict's task_id; empty: the client id
  std::string policy;      // strict | kernelbench; empty: the server's ([policy] mode, --policy)
};

nlohmann::json to_json(const ServiceItem& item);
// Validates one item; the message names the offending key.
Result<ServiceItem> service_item_from_json(const nlohmann::json& json);

struct ServiceOptions {
  std::string host = "127.0.0.1";  // loopback: the service runs any code it is sent
  int port = 0;                    // 0: any free port (port() says which)
  int workers = 0;                 // evaluation threads per device; 0: default_jobs (cores on cpu, [tuning] gpu_jobs on a GPU)
  // Several GPUs of one model (parse_devices): a pool of `workers` evaluations on each, every
  // evaluation on the one with the fewest in flight. Empty: the evaluation options' device alone.
  std::vector<std::string> devices;
  // The `cuda` pre-builds (as in kz eval-suite): "gpu" on a GPU only; "always", on the CPU too, where
  // a `cuda` evaluation is a build anyway and the pre-build only moves it ahead (for tests);
  // "never": every build in its evaluation, holding an evaluation's turn.
  std::string prebuild = "gpu";
  int compile_jobs = 0;            // pre-builds at once, beside the evaluations; 0: the CPU's cores
  int http_threads = 64;           // connections served at once (a client waiting on a stream holds one)
  double retention_s = 3600;       // finished batches are forgotten this long after their last verdict
};

class EvalService {
 public:
  // Opens the evaluator (and its cache), binds host:port and starts serving in the background.
  static Result<std::unique_ptr<EvalService>> start(const EvalOptions& eval, const ServiceOptions& options);
  ~EvalService();  // stop()

  int port() const;
  int workers() const;       // per device
  int compile_jobs() const;  // cuda pre-builds at once; 0 where nothing is pre-built
  const VerdictCache* cache() const;  // null when disabled
  // Stops accepting requests, drops queued jobs, and waits for running evaluations to finish
  // (each has its stage deadlines). Idempotent.
  void stop();

  struct Counts {
    size_t queued = 0, building = 0, running = 0, done = 0, submitted = 0;
  };
  Counts counts() const;

 private:
  struct Impl;
  explicit EvalService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz
