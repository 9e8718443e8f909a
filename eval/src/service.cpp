// The evaluation service: a job board (queue and states), evaluation threads, HTTP routes.
#include "kz/eval/service.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "kz/core/http_server.h"
#include "kz/core/parallel.h"
#include "kz/eval/evaluator.h"
#include "kz/eval/format.h"
#include "kz/eval/suite.h"
#include "kz/task/task.h"

namespace kz {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A submission as large as this is a mistake (or an attack); a thousand-item batch is ~10 MB.
constexpr size_t kMaxRequestBytes = size_t(256) << 20;
// How long a stream waits for the next verdict before checking the connection and the service.
constexpr auto kStreamPoll = std::chrono::milliseconds(500);

// queued -> running -> done; a job to pre-build first: queued -> building -> queued (for its
// evaluation) -> running -> done, or building -> done where its build failed.
enum class JobState { queued, building, running, done };

const char* state_name(JobState state) {
  switch (state) {
    case JobState::queued: return "queued";
    case JobState::building: return "building";
    case JobState::running: return "running";
    case JobState::done: return "done";
  }
  return "?";
}

// JSON text that never throws: a crash verdict's stderr tail may hold bytes that are not UTF-8
// (or a character cut in half); they become U+FFFD instead of failing the answer.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The client's id as text (labels in verdicts).
std::string id_text(const json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

Task task_of(const ServiceItem& item) {
  Task task;
  task.id = item.task_id.empty() ? id_text(item.id) : item.task_id;
  task.source = item.reference;
  task.origin = "service item " + id_text(item.id);
  return task;
}

Candidate candidate_of(const ServiceItem& item) { return Candidate{id_text(item.id), item.candidate}; }

struct Job {
  std::string batch;
  ServiceItem item;
  Clock::time_point submitted;  // the batch's submission: the origin of the verdict's started_s
  JobState state = JobState::queued;
  std::optional<PreBuild> prebuild;  // set once its pre-build succeeded
  json verdict;                      // set once, when done
};

struct Batch {
  std::vector<std::string> jobs;      // submission order
  std::vector<std::string> finished;  // finish order: what streams send
  bool complete() const { return finished.size() == jobs.size(); }
};

// What an evaluation or build thread takes from the board.
struct Ticket {
  std::string job;
  ServiceItem item;
  Clock::time_point submitted;
  std::optional<PreBuild> prebuild;
  double since_submitted() const { return std::chrono::duration<double>(Clock::now() - submitted).count(); }
};

// A stream's next lines: the batch's jobs finished since the client's last read.
struct StreamChunk {
  std::vector<std::string> lines;
  bool complete = false;
};

// Jobs and batches, the two FIFO queues (to evaluate, to pre-build), and the one place where a
// job becomes done (exactly once).
class JobBoard {
 public:
  JobBoard(std::string id_prefix, double retention_s) : id_prefix_(std::move(id_prefix)), retention_(retention_s) {}

  // Queues every item: item i to be built first where prebuild[i], else to be evaluated.
  // Answers {"batch", "jobs": [{"id", "job"}]}.
  json submit(std::vector<ServiceItem> items, const std::vector<bool>& prebuild) {
    std::lock_guard lock(mutex_);
    forget_old_batches();
    std::string batch_id = fmt::format("{}-b{}", id_prefix_, ++next_id_);
    Batch& batch = batches_[batch_id];
    json answer = {{"batch", batch_id}, {"jobs", json::array()}};
    auto now = Clock::now();
    for (size_t i = 0; i < items.size(); ++i) {
      ServiceItem& item = items[i];
      std::string job_id = fmt::format("{}-j{}", id_prefix_, ++next_id_);
      answer["jobs"].push_back({{"id", item.id}, {"job", job_id}});
      batch.jobs.push_back(job_id);
      (prebuild[i] ? build_queue_ : queue_).push_back(job_id);
      jobs_.emplace(job_id, Job{batch_id, std::move(item), now, JobState::queued, std::nullopt, json()});
    }
    submitted_ += items.size();
    work_ready_.notify_all();
    return answer;
  }

  // The next job to evaluate, now running; nullopt once stop() was called.
  std::optional<Ticket> take() { return take_from(queue_, JobState::running, running_); }
  // The next job to pre-build, now building; nullopt once stop() was called.
  std::optional<Ticket> take_build() { return take_from(build_queue_, JobState::building, building_); }

  // A building job whose pre-build succeeded: queued for its evaluation.
  void built(const std::string& id, PreBuild prebuild) {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.state != JobState::building) return;
    it->second.state = JobState::queued;
    it->second.prebuild = prebuild;
    --building_;
    queue_.push_back(id);
    work_ready_.notify_all();
  }

  // Records the verdict of a running job, or of a building one whose pre-build is its verdict; a
  // second answer for the same job is ignored.
  void finish(const std::string& id, json verdict) {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || (it->second.state != JobState::running && it->second.state != JobState::building)) return;
    Job& job = it->second;
    --(job.state == JobState::running ? running_ : building_);
    job.state = JobState::done;
    job.verdict = std::move(verdict);
    ++done_;
    Batch& batch = batches_.at(job.batch);
    batch.finished.push_back(id);
    if (batch.complete()) finished_batches_.emplace_back(Clock::now(), job.batch);
    job_done_.notify_all();
  }

  // Answers every job of the batch that has not started (queued, to evaluate or to pre-build) with
  // cancelled_verdict(item) now; started ones go on. The number answered; nullopt: no such batch.
  std::optional<size_t> cancel(const std::string& batch_id, const std::function<json(const ServiceItem&)>& cancelled_verdict) {
    std::lock_guard lock(mutex_);
    auto batch = batches_.find(batch_id);
    if (batch == batches_.end()) return std::nullopt;
    size_t cancelled = 0;
    for (const auto& id : batch->second.jobs) {
      Job& job = jobs_.at(id);
      if (job.state != JobState::queued) continue;
      for (auto* queue : {&queue_, &build_queue_}) queue->erase(std::remove(queue->begin(), queue->end(), id), queue->end());
      job.state = JobState::done;
      job.verdict = cancelled_verdict(job.item);
      ++done_;
      ++cancelled;
      batch->second.finished.push_back(id);
    }
    if (cancelled > 0 && batch->second.complete()) finished_batches_.emplace_back(Clock::now(), batch_id);
    job_done_.notify_all();
    return cancelled;
  }

  std::optional<json> job(const std::string& id) const {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return std::nullopt;
    return job_json(id, it->second);
  }

  std::optional<json> batch(const std::string& id) const {
    std::lock_guard lock(mutex_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return std::nullopt;
    json jobs = json::array();
    std::map<std::string, int> counts = {{"queued", 0}, {"building", 0}, {"running", 0}, {"done", 0}};
    for (const auto& job_id : it->second.jobs) {
      const Job& job = jobs_.at(job_id);
      ++counts[state_name(job.state)];
      jobs.push_back(job_json(job_id, job));
    }
    return json{{"batch", id}, {"done", it->second.complete()}, {"counts", counts}, {"jobs", jobs}};
  }

  // The batch's jobs finished after the first `from`, waiting up to `wait` for one when there are
  // none yet. nullopt: no such batch, or the service is stopping.
  std::optional<StreamChunk> finished_since(const std::string& id, size_t from, std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    auto ready = [&] {
      auto it = batches_.find(id);
      return stopping_ || it == batches_.end() || it->second.finished.size() > from || it->second.complete();
    };
    job_done_.wait_for(lock, wait, ready);
    auto it = batches_.find(id);
    if (stopping_ || it == batches_.end()) return std::nullopt;
    StreamChunk chunk;
    for (size_t i = from; i < it->second.finished.size(); ++i) {
      const std::string& job_id = it->second.finished[i];
      const Job& job = jobs_.at(job_id);
      chunk.lines.push_back(dump(json{{"id", job.item.id}, {"job", job_id}, {"verdict", job.verdict}}));
    }
    chunk.complete = it->second.complete();
    return chunk;
  }

  EvalService::Counts counts() const {
    std::lock_guard lock(mutex_);
    return {queue_.size() + build_queue_.size(), building_, running_, done_, submitted_};
  }

  // take() and take_build() return nullopt from now on; queued jobs are dropped with the service.
  void stop() {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    work_ready_.notify_all();
    job_done_.notify_all();
  }

 private:
  std::optional<Ticket> take_from(std::deque<std::string>& queue, JobState state, size_t& count) {
    std::unique_lock lock(mutex_);
    work_ready_.wait(lock, [&] { return stopping_ || !queue.empty(); });
    if (stopping_) return std::nullopt;
    std::string id = queue.front();
    queue.pop_front();
    Job& job = jobs_.at(id);
    job.state = state;
    ++count;
    return Ticket{id, job.item, job.submitted, job.prebuild};
  }

  static json job_json(const std::string& id, const Job& job) {
    json j = {{"job", id}, {"id", job.item.id}, {"batch", job.batch}, {"state", state_name(job.state)}};
    if (job.state == JobState::done) j["verdict"] = job.verdict;
    return j;
  }

  // Drops batches finished longer than the retention ago, so a long-running service stays small.
  void forget_old_batches() {
    auto now = Clock::now();
    while (!finished_batches_.empty() && now - finished_batches_.front().first > retention_) {
      auto it = batches_.find(finished_batches_.front().second);
      for (const auto& job_id : it->second.jobs) jobs_.erase(job_id);
      batches_.erase(it);
      finished_batches_.pop_front();
    }
  }

  std::string id_prefix_;
  std::chrono::duration<double> retention_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_, job_done_;
  std::map<std::string, Job> jobs_;
  std::map<std::string, Batch> batches_;
  std::deque<std::string> queue_;        // to evaluate
  std::deque<std::string> build_queue_;  // to pre-build, then evaluate
  std::deque<std::pair<Clock::time_point, std::string>> finished_batches_;  // oldest first
  size_t building_ = 0, running_ = 0, done_ = 0, submitted_ = 0;
  uint64_t next_id_ = 0;
  bool stopping_ = false;
};

// A random prefix for ids, so a job id from an earlier run of the service is unknown, not wrong.
std::string random_prefix() {
  std::random_device device;
  return fmt::format("{:08x}", device());
}

// The key of an item's Evaluator among a device's: one per format and policy.
std::string evaluator_key(const std::string& format, const std::string& policy) { return format + "/" + policy; }

Result<std::vector<ServiceItem>> parse_submission(const std::string& body, const EvalOptions& defaults) {
  json request;
  try {
    request = json::parse(body);
  } catch (const json::parse_error& error) {
    return invalid_argument(fmt::format("request body is not valid JSON: {}", error.what()));
  }
  if (!request.is_object() || !request.contains("items") || !request["items"].is_array())
    return invalid_argument("expected a JSON object with an \"items\" array");
  if (request["items"].empty()) return invalid_argument("\"items\" is empty");
  std::vector<ServiceItem> items;
  for (size_t i = 0; i < request["items"].size(); ++i) {
    auto item = service_item_from_json(request["items"][i]);
    if (!item.ok()) return item.status().with_context(fmt::format("items[{}]", i));
    if (item->format.empty()) item->format = defaults.format;
    if (item->policy.empty()) item->policy = defaults.policy.mode;
    items.push_back(std::move(*item));
  }
  return items;
}

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, json{{"error", message}});
}

}  // namespace

nlohmann::json to_json(const ServiceItem& item) {
  json j = {{"id", item.id}, {"reference", item.reference}, {"candidate", item.candidate}};
  if (!item.format.empty()) j["format"] = item.format;
  if (!item.task_id.empty()) j["task_id"] = item.task_id;
  if (!item.policy.empty()) j["policy"] = item.policy;
  return j;
}

Result<ServiceItem> service_item_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("an item must be a JSON object");
  for (const auto& [key, value] : j.items())
    if (key != "id" && key != "reference" && key != "candidate" && key != "format" && key != "task_id" &&
        key != "policy")
      return invalid_argument(fmt::format("unknown key \"{}\"", key));
  if (!j.contains("id") || !(j["id"].is_string() || j["id"].is_number_integer()))
    return invalid_argument("\"id\" must be a string or an integer");
  ServiceItem item;
  item.id = j["id"];
  for (auto [key, field] : {std::pair{"reference", &item.reference}, std::pair{"candidate", &item.candidate}}) {
    if (!j.contains(key) || !j[key].is_string()) return invalid_argument(fmt::format("\"{}\" must be a string (Python source)", key));
    *field = j[key].get<std::string>();
  }
  for (auto [key, field] :
       {std::pair{"format", &item.format}, std::pair{"task_id", &item.task_id}, std::pair{"policy", &item.policy}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string()) return invalid_argument(fmt::format("\"{}\" must be a string", key));
    *field = j[key].get<std::string>();
  }
  if (!item.format.empty() && item.format != "auto" && !parse_format(item.format))
    return invalid_argument(fmt::format("format \"{}\" is not one of auto, cuda, triton, cuda-rtc, torch", item.format));
  if (!item.policy.empty() && item.policy != "strict" && item.policy != "kernelbench")
    return invalid_argument(fmt::format("policy \"{}\" is neither strict nor kernelbench", item.policy));
  return item;
}

struct EvalService::Impl {
  EvalOptions eval;
  ServiceOptions options;
  // Per device (pool): one Evaluator per format and policy (evaluator_key), all sharing the verdict
  // cache. Pre-builds use pool 0's.
  std::vector<std::map<std::string, Evaluator>> evaluators;
  DevicePools pools;  // which device the next evaluation goes to
  JobBoard board;
  HttpServer http;
  std::vector<std::thread> threads;
  std::thread listener;
  int port = 0;
  int workers = 1;       // evaluation threads per device
  int compile_jobs = 0;  // pre-build threads; 0 where nothing is pre-built
  // [tuning] exclusive_timing = false: one evaluation at a time on each GPU.
  std::unique_ptr<std::mutex[]> gpu_mutexes;
  std::atomic<bool> stopped{false};

  Impl(const EvalOptions& e, const ServiceOptions& o, std::vector<std::map<std::string, Evaluator>> by_device,
       DevicePools device_pools)
      : eval(e),
        options(o),
        evaluators(std::move(by_device)),
        pools(std::move(device_pools)),
        board(random_prefix(), o.retention_s),
        gpu_mutexes(std::make_unique<std::mutex[]>(evaluators.size())) {
    workers = options.workers > 0 ? options.workers : default_jobs(eval);
    if (options.prebuild == "always" || (options.prebuild == "gpu" && eval.device != "cpu"))
      compile_jobs = options.compile_jobs > 0 ? options.compile_jobs : cpu_cores();
  }

  const Evaluator& evaluator_for(size_t pool, const ServiceItem& item) const {
    return evaluators[pool].at(evaluator_key(item.format, item.policy));
  }
  // Any of a device's evaluators: they share its device and the cache.
  const Evaluator& any_evaluator(size_t pool) const { return evaluators[pool].begin()->second; }

  Status listen();
  void start_threads();
  void stop();
  void work();
  void build();
  bool needs_prebuild(const ServiceItem& item) const;
  Verdict evaluate(const Ticket& ticket, EvalMode mode);
  // An infra_error verdict for an item that was not evaluated (a bad reference, a failure, a cancel).
  Verdict not_evaluated(const ServiceItem& item, std::vector<Check> checks, std::string message) const;
  Verdict cancelled_verdict(const ServiceItem& item) const;
  void add_routes();
  void on_submit(const httplib::Request& req, httplib::Response& res);
  void on_stream(const std::string& batch, httplib::Response& res);
  json health() const;
};

Status EvalService::Impl::listen() {
  add_routes();
  auto bound = http.bind(options.host, options.port, options.http_threads, kMaxRequestBytes);
  if (!bound.ok()) return bound.status();
  port = *bound;
  return Status::ok();
}

void EvalService::Impl::start_threads() {
  listener = http.serve_in_background();
  for (size_t i = 0; i < workers * pools.size(); ++i) threads.emplace_back([this] { work(); });
  for (int i = 0; i < compile_jobs; ++i) threads.emplace_back([this] { build(); });
}

void EvalService::Impl::stop() {
  if (stopped.exchange(true)) return;
  http.stop();
  board.stop();  // before joining the server: open streams end once the board stops
  if (listener.joinable()) listener.join();
  for (auto& thread : threads) thread.join();
}

void EvalService::Impl::work() {
  while (auto ticket = board.take()) {
    double started_s = ticket->since_submitted();
    Verdict verdict = evaluate(*ticket, EvalMode::full);
    verdict.profile.started_s = started_s;
    if (ticket->prebuild) attach_prebuild(verdict, *ticket->prebuild);  // started_s from its batch's submission
    board.finish(ticket->job, to_json(verdict));
  }
}

// The `cuda` pre-builds, as in kz eval-suite (suite.h): compile-only, beside the evaluations, so a
// slow load_inline build holds a CPU core and not an evaluation's turn. A failed build is the
// job's verdict; any other pre-build result sends the job on to its evaluation, which decides.
void EvalService::Impl::build() {
  while (auto ticket = board.take_build()) {
    double started_s = ticket->since_submitted();
    Verdict verdict = evaluate(*ticket, EvalMode::compile_only);
    if (verdict.status == EvalStatus::compile_error) {
      verdict.profile.started_s = started_s;
      board.finish(ticket->job, to_json(verdict));
    } else {
      board.built(ticket->job, prebuild_of(verdict, started_s));
    }
  }
}

// Only `cuda` candidates (their nvcc builds take seconds of CPU each), and not one whose verdict
// is cached: its evaluation is a lookup.
bool EvalService::Impl::needs_prebuild(const ServiceItem& item) const {
  if (compile_jobs == 0 || resolve_format(item.format, item.candidate) != Format::cuda) return false;
  return !evaluator_for(0, item).has_cached_verdict(task_of(item), candidate_of(item));
}

Verdict EvalService::Impl::not_evaluated(const ServiceItem& item, std::vector<Check> checks, std::string message) const {
  Verdict v = make_verdict(EvalStatus::infra_error, std::move(checks), std::move(message));
  v.task_id = task_of(item).id;
  v.candidate = candidate_of(item).label;
  v.format = item.format;
  v.policy = item.policy;
  v.device = eval.device;
  return v;
}

Verdict EvalService::Impl::cancelled_verdict(const ServiceItem& item) const {
  return not_evaluated(item, {}, "cancelled by the client (DELETE /v1/batches/B) before its evaluation started");
}

// Always a verdict: the job must be answered whatever happens here.
Verdict EvalService::Impl::evaluate(const Ticket& ticket, EvalMode mode) {
  const ServiceItem& item = ticket.item;
  Task task = task_of(item);
  Candidate candidate = candidate_of(item);
  auto failed = [&](std::vector<Check> checks, std::string message) {
    return not_evaluated(item, std::move(checks), std::move(message));
  };
  if (Status reference = check_reference_source(task); !reference.is_ok())
    return failed({Check::reference_failed}, reference.message());
  // An evaluation takes the device with the fewest in flight; a pre-build needs none (pool 0's options).
  std::optional<DevicePools::Lease> lease;
  if (mode == EvalMode::full) lease.emplace(pools);
  size_t pool = lease ? lease->pool() : 0;
  const Evaluator& evaluator = evaluator_for(pool, item);
  std::unique_lock<std::mutex> gpu_turn;
  if (mode == EvalMode::full && eval.device != "cpu" && !eval.tuning.exclusive_timing)
    gpu_turn = std::unique_lock(gpu_mutexes[pool]);
  if (stopped) return failed({}, "the evaluation service stopped before this evaluation started");
  try {
    auto verdict = evaluator.evaluate(task, candidate, mode);
    if (verdict.ok()) return *verdict;
    return failed({}, verdict.status().message());
  } catch (const std::exception& error) {
    return failed({}, fmt::format("the evaluation failed: {}", error.what()));
  }
}

void EvalService::Impl::add_routes() {
  using httplib::Request, httplib::Response;
  http.Post("/v1/evaluations", [this](const Request& req, Response& res) { on_submit(req, res); });
  http.Get(R"(/v1/jobs/([^/]+))", [this](const Request& req, Response& res) {
    auto job = board.job(req.matches[1]);
    job ? reply(res, 200, *job) : reply_error(res, 404, fmt::format("no job \"{}\"", req.matches[1].str()));
  });
  http.Get(R"(/v1/batches/([^/]+))", [this](const Request& req, Response& res) {
    auto batch = board.batch(req.matches[1]);
    batch ? reply(res, 200, *batch) : reply_error(res, 404, fmt::format("no batch \"{}\"", req.matches[1].str()));
  });
  http.Delete(R"(/v1/batches/([^/]+))", [this](const Request& req, Response& res) {
    auto cancelled = board.cancel(req.matches[1], [this](const ServiceItem& item) { return to_json(cancelled_verdict(item)); });
    cancelled ? reply(res, 200, json{{"batch", req.matches[1].str()}, {"cancelled", *cancelled}})
              : reply_error(res, 404, fmt::format("no batch \"{}\"", req.matches[1].str()));
  });
  http.Get(R"(/v1/batches/([^/]+)/stream)",
           [this](const Request& req, Response& res) { on_stream(req.matches[1], res); });
  http.Get("/v1/health", [this](const Request&, Response& res) { reply(res, 200, health()); });
  // Answers httplib's own errors (unknown path, oversized body) in JSON like the handlers' ones.
  http.set_error_handler([](const Request& req, Response& res) {
    if (!res.body.empty()) return;
    reply_error(res, res.status,
                res.status == 404 ? fmt::format("no route {} {}", req.method, req.path)
                                  : fmt::format("HTTP {} for {} {}", res.status, req.method, req.path));
  });
  http.set_exception_handler([](const Request&, Response& res, std::exception_ptr error) {
    reply_error(res, 500, "internal error: " + exception_message(error));
  });
}

void EvalService::Impl::on_submit(const httplib::Request& req, httplib::Response& res) {
  auto items = parse_submission(req.body, eval);
  if (!items.ok()) return reply_error(res, 400, items.status().message());
  std::vector<bool> prebuild;  // decided before the board's lock: a cache lookup per `cuda` item
  for (const auto& item : *items) prebuild.push_back(needs_prebuild(item));
  reply(res, 202, board.submit(std::move(*items), prebuild));
}

void EvalService::Impl::on_stream(const std::string& batch, httplib::Response& res) {
  if (!board.finished_since(batch, 0, std::chrono::milliseconds(0)))
    return reply_error(res, 404, fmt::format("no batch \"{}\"", batch));
  auto sent = std::make_shared<size_t>(0);
  res.set_chunked_content_provider("application/x-ndjson", [this, batch, sent](size_t, httplib::DataSink& sink) {
    auto chunk = board.finished_since(batch, *sent, kStreamPoll);
    if (!chunk) return false;  // the service is stopping: end the response
    for (const auto& line : chunk->lines) {
      std::string text = line + "\n";
      if (!sink.write(text.data(), text.size())) return false;  // the client left
    }
    *sent += chunk->lines.size();
    if (chunk->complete) sink.done();
    return true;
  });
}

json EvalService::Impl::health() const {
  Counts c = board.counts();
  const VerdictCache* cache = any_evaluator(0).cache();
  json devices = json::array();
  for (size_t pool = 0; pool < evaluators.size(); ++pool) devices.push_back(any_evaluator(pool).options().device);
  return {{"status", "ok"},       {"device", devices[0]},       {"devices", devices}, {"workers", workers},
          {"compile_jobs", compile_jobs}, {"queued", c.queued},     {"building", c.building},
          {"running", c.running},  {"done", c.done},             {"submitted", c.submitted},
          {"cache", cache ? json(cache->path().string()) : json(nullptr)}};
}

EvalService::EvalService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EvalService::~EvalService() { stop(); }

Result<std::unique_ptr<EvalService>> EvalService::start(const EvalOptions& requested, const ServiceOptions& options) {
  if (options.prebuild != "gpu" && options.prebuild != "always" && options.prebuild != "never")
    return invalid_argument(fmt::format("service prebuild \"{}\": expected gpu, always or never", options.prebuild));
  // The evaluation threads on each device (Impl's workers) and the spare servers: each may hold a
  // CUDA context on its GPU, which every worker's memory reservation leaves room for.
  EvalOptions eval = requested;
  set_gpu_memory_processes(eval, options.workers > 0 ? options.workers : default_jobs(eval));
  auto base = Evaluator::create(eval);
  if (!base.ok()) return base.status();
  auto pools = DevicePools::create(*base, options.devices);
  if (!pools.ok()) return pools.status();
  std::vector<std::map<std::string, Evaluator>> evaluators(pools->size());
  for (size_t pool = 0; pool < pools->size(); ++pool)
    for (const char* format : {"auto", "cuda", "triton", "cuda-rtc", "torch"})
      for (const char* policy : {"strict", "kernelbench"}) {
        auto evaluator = pools->at(pool).with_format(format);
        if (evaluator.ok()) evaluator = evaluator->with_policy(policy);
        if (!evaluator.ok()) return evaluator.status();
        evaluators[pool].emplace(evaluator_key(format, policy), std::move(*evaluator));
      }
  ignore_sigpipe();
  auto impl = std::make_unique<Impl>(eval, options, std::move(evaluators), std::move(*pools));
  // The first evaluations find prepared fork servers (every format's evaluator makes the same kind):
  // a service is long-lived, so its first batch need not pay their imports. Build servers start as
  // pre-builds need them, as in eval-suite, and stay idle after (one per core), so a service that is
  // sent no `cuda` work holds none: a first batch's first wave waits for the evaluation servers, not
  // for build servers. [tuning] spare_servers more per GPU: with only as many servers as evaluation
  // threads, a thread done with a short evaluation takes back the server it just gave, whose next
  // child is still preparing; with spares it takes one idle longer, its child ready.
  int servers = impl->workers + spare_servers(eval);
  for (size_t pool = 0; pool < impl->pools.size(); ++pool)
    if (auto started = impl->pools.at(pool).start_fork_servers(servers); !started.is_ok())
      std::fprintf(stderr, "kz: %s (evaluations start their own workers)\n", started.to_string().c_str());
  KZ_RETURN_IF_ERROR(impl->listen());
  impl->start_threads();
  return std::unique_ptr<EvalService>(new EvalService(std::move(impl)));
}

int EvalService::port() const { return impl_->port; }
int EvalService::workers() const { return impl_->workers; }
int EvalService::compile_jobs() const { return impl_->compile_jobs; }
const VerdictCache* EvalService::cache() const { return impl_->any_evaluator(0).cache(); }
void EvalService::stop() { impl_->stop(); }
EvalService::Counts EvalService::counts() const { return impl_->board.counts(); }

}  // namespace kz
