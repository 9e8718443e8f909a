// The evaluation service's C++ client, over cpp-httplib.
#include "kz/eval/service_client.h"

#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <thread>

namespace kz {
namespace {

using nlohmann::json;

// How long a stream may stay silent: a verdict can take a 15-minute compile to arrive.
constexpr auto kStreamReadTimeout = std::chrono::hours(24);

// The status for an HTTP error answer, with the service's own message.
Status http_error(int status, const std::string& body, const std::string& what) {
  auto j = json::parse(body, nullptr, false);
  std::string message = j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : body;
  message = fmt::format("{}: HTTP {}: {}", what, status, message);
  if (status == 404) return not_found(message);
  if (status >= 400 && status < 500) return invalid_argument(message);
  return io_error(message);
}

Result<JobResult> job_from_json(const json& j) {
  if (!j.is_object() || !j.contains("job") || !j["job"].is_string()) return parse_error("a job without a \"job\" id");
  JobResult job;
  job.id = j.value("id", json());
  job.job = j["job"].get<std::string>();
  job.batch = j.value("batch", "");
  job.state = j.value("state", j.contains("verdict") ? "done" : "");
  if (j.contains("verdict")) {
    auto verdict = verdict_from_json(j["verdict"]);
    if (!verdict.ok()) return verdict.status().with_context("job " + job.job);
    job.verdict = std::move(*verdict);
  }
  return job;
}

Result<BatchStatus> batch_from_json(const json& j) {
  if (!j.is_object() || !j.contains("jobs") || !j["jobs"].is_array()) return parse_error("a batch without \"jobs\"");
  BatchStatus batch;
  batch.batch = j.value("batch", "");
  batch.done = j.value("done", false);
  for (const auto& item : j["jobs"]) {
    auto job = job_from_json(item);
    if (!job.ok()) return job.status();
    batch.jobs.push_back(std::move(*job));
  }
  return batch;
}

}  // namespace

struct ServiceClient::Impl {
  std::string where;  // "host:port", for messages
  httplib::Client http;
  std::chrono::seconds request_timeout;

  Impl(const std::string& host, int port, std::chrono::seconds timeout)
      : where(fmt::format("{}:{}", host, port)), http(host, port), request_timeout(timeout) {
    http.set_connection_timeout(std::chrono::seconds(10));
    http.set_read_timeout(timeout);
    http.set_write_timeout(timeout);
    http.set_keep_alive(true);
  }

  // One request; the answer's JSON, or the Status of whatever went wrong.
  Result<json> call(const std::string& method, const std::string& path, const std::string& body = "") {
    httplib::Result res = method == "POST"     ? http.Post(path, body, "application/json")
                          : method == "DELETE" ? http.Delete(path)
                                               : http.Get(path);
    std::string what = fmt::format("evaluation service {}: {} {}", where, method, path);
    if (!res) return io_error(fmt::format("{}: {}", what, httplib::to_string(res.error())));
    if (res->status >= 300) return http_error(res->status, res->body, what);
    auto j = json::parse(res->body, nullptr, false);
    if (j.is_discarded()) return parse_error(what + ": the answer is not JSON");
    return j;
  }
};

ServiceClient::ServiceClient(const std::string& host, int port, std::chrono::seconds request_timeout) {
  // Writing to a socket the service closed must give an error, not kill this process.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, nullptr);
  impl_ = std::make_unique<Impl>(host, port, request_timeout);
}
ServiceClient::ServiceClient(ServiceClient&&) noexcept = default;
ServiceClient& ServiceClient::operator=(ServiceClient&&) noexcept = default;
ServiceClient::~ServiceClient() = default;

Result<Submission> ServiceClient::submit(const std::vector<ServiceItem>& items) {
  json request = {{"items", json::array()}};
  for (const auto& item : items) request["items"].push_back(to_json(item));
  // Sources that are not UTF-8 get U+FFFD (JSON cannot carry them) rather than an exception.
  auto answer = impl_->call("POST", "/v1/evaluations", request.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!answer.ok()) return answer.status();
  if (!answer->contains("batch") || !answer->contains("jobs")) return parse_error("submission answer without a batch");
  Submission submission;
  submission.batch = (*answer)["batch"].get<std::string>();
  for (const auto& job : (*answer)["jobs"]) submission.jobs.push_back({job.value("id", json()), job.value("job", "")});
  return submission;
}

Result<BatchStatus> ServiceClient::poll(const std::string& batch) {
  auto answer = impl_->call("GET", "/v1/batches/" + batch);
  if (!answer.ok()) return answer.status();
  return batch_from_json(*answer);
}

Result<size_t> ServiceClient::cancel(const std::string& batch) {
  auto answer = impl_->call("DELETE", "/v1/batches/" + batch);
  if (!answer.ok()) return answer.status();
  if (!answer->contains("cancelled") || !(*answer)["cancelled"].is_number_unsigned())
    return parse_error("cancel answer without a count");
  return (*answer)["cancelled"].get<size_t>();
}

Result<JobResult> ServiceClient::job(const std::string& job) {
  auto answer = impl_->call("GET", "/v1/jobs/" + job);
  if (!answer.ok()) return answer.status();
  return job_from_json(*answer);
}

Result<std::vector<JobResult>> ServiceClient::wait(const std::string& batch, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    auto status = poll(batch);
    if (!status.ok()) return status.status();
    if (status->done) return std::move(status->jobs);
    if (std::chrono::steady_clock::now() + pause > deadline) {
      size_t done = std::count_if(status->jobs.begin(), status->jobs.end(), [](const auto& j) { return j.verdict; });
      return timeout_error(fmt::format("batch {}: {} of {} jobs done after {} ms", batch, done, status->jobs.size(),
                                       timeout.count()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 3 / 2, std::chrono::milliseconds(500));
  }
}

Status ServiceClient::stream(const std::string& batch, const std::function<void(const JobResult&)>& on_result) {
  std::string path = "/v1/batches/" + batch + "/stream";
  std::string what = fmt::format("evaluation service {}: GET {}", impl_->where, path);
  std::string pending;  // text after the last complete line
  Status failure;
  int http_status = 0;
  auto on_response = [&](const httplib::Response& res) {
    http_status = res.status;
    return true;
  };
  auto on_data = [&](const char* data, size_t size) {
    pending.append(data, size);
    if (http_status != 200) return true;  // an error body: read whole, reported below
    for (size_t end; failure.is_ok() && (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
      auto job = job_from_json(json::parse(pending.substr(0, end), nullptr, false));
      if (job.ok()) on_result(*job);
      else failure = job.status().with_context(what);
    }
    return failure.is_ok();
  };
  impl_->http.set_read_timeout(kStreamReadTimeout);
  httplib::Result res = impl_->http.Get(path, on_response, on_data);
  impl_->http.set_read_timeout(impl_->request_timeout);
  if (!failure.is_ok()) return failure;
  if (!res) return io_error(fmt::format("{}: {}", what, httplib::to_string(res.error())));
  if (res->status != 200) return http_error(res->status, pending, what);
  return Status::ok();
}

Result<nlohmann::json> ServiceClient::health() { return impl_->call("GET", "/v1/health"); }

}  // namespace kz
