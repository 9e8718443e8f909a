// A C++ client of the evaluation service (kz/eval/service.h): submit items, then poll, wait for or
// stream their verdicts.
//
// One request at a time per client object (it keeps one connection alive); give each thread its
// own client. Errors: io_error when the service cannot be reached, invalid_argument for a request
// the service refused (its message), not_found for an unknown batch or job.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/eval/service.h"
#include "kz/eval/verdict.h"

namespace kz {

struct SubmittedJob {
  nlohmann::json id;  // the client id given with the item
  std::string job;    // the service's job id
};

struct Submission {
  std::string batch;
  std::vector<SubmittedJob> jobs;  // in item order
};

struct JobResult {
  nlohmann::json id;               // the client id given with the item
  std::string job;
  std::string batch;               // empty in stream lines
  std::string state;               // queued | building | running | done
  std::optional<Verdict> verdict;  // when done
};

struct BatchStatus {
  std::string batch;
  bool done = false;               // every job has its verdict
  std::vector<JobResult> jobs;     // in submission order
};

class ServiceClient {
 public:
  // `request_timeout`: how long one request may wait for the service's answer.
  ServiceClient(const std::string& host, int port, std::chrono::seconds request_timeout = std::chrono::seconds(60));
  ServiceClient(ServiceClient&&) noexcept;
  ServiceClient& operator=(ServiceClient&&) noexcept;
  ~ServiceClient();

  Result<Submission> submit(const std::vector<ServiceItem>& items);
  Result<BatchStatus> poll(const std::string& batch);
  Result<JobResult> job(const std::string& job);
  // Answers the batch's jobs that have not started with a cancellation (infra_error); started ones
  // finish. The number cancelled.
  Result<size_t> cancel(const std::string& batch);
  // Polls (every 20 ms at first, backing off to 500 ms) until every job of the batch is done, and
  // returns them in submission order; a timeout Status when `timeout` passes first.
  Result<std::vector<JobResult>> wait(const std::string& batch, std::chrono::milliseconds timeout);
  // Follows the batch's stream, calling `on_result` for each verdict as it finishes (no polling);
  // ok once the batch is done.
  Status stream(const std::string& batch, const std::function<void(const JobResult&)>& on_result);
  Result<nlohmann::json> health();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz
