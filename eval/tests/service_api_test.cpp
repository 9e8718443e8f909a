// The evaluation service's HTTP API on loopback: submit, poll, job, stream, health, and the
// answers to malformed requests (400 with a message, 404 for unknown ids).
#include <httplib.h>

#include <set>
#include <thread>

#include "service_fixture.h"

namespace kz::test {
namespace {

using nlohmann::json;

// The status and the JSON body of a raw request (to send what the C++ client never would).
std::pair<int, json> raw_post(int port, const std::string& path, const std::string& body) {
  httplib::Client http("127.0.0.1", port);
  auto res = http.Post(path, body, "application/json");
  if (!res) return {0, json()};
  return {res->status, json::parse(res->body, nullptr, false)};
}

std::pair<int, json> raw_get(int port, const std::string& path) {
  httplib::Client http("127.0.0.1", port);
  auto res = http.Get(path);
  if (!res) return {0, json()};
  return {res->status, json::parse(res->body, nullptr, false)};
}

TEST_F(ServiceTest, HealthReportsTheService) {
  start();
  auto health = client().health();
  ASSERT_TRUE(health.ok()) << health.status().to_string();
  EXPECT_EQ((*health)["status"], "ok");
  EXPECT_EQ((*health)["device"], "cpu");
  EXPECT_EQ((*health)["devices"], nlohmann::json::array({"cpu"}));
  EXPECT_EQ((*health)["workers"], 2);
  EXPECT_EQ((*health)["compile_jobs"], 0) << "no `cuda` pre-builds on the CPU by default";
  EXPECT_EQ((*health)["building"], 0);
  EXPECT_EQ((*health)["cache"], (dir_ / "verdicts.sqlite").string());
}

TEST_F(ServiceTest, UnknownPrebuildSettingIsRefusedAtStart) {
  EvalOptions eval;
  eval.cache.enabled = false;
  ServiceOptions options;
  options.prebuild = "sometimes";
  auto service = EvalService::start(eval, options);
  ASSERT_FALSE(service.ok());
  EXPECT_NE(service.status().message().find("expected gpu, always or never"), std::string::npos)
      << service.status().message();
}

TEST_F(ServiceTest, SubmitPollAndFetchJobs) {
  start();
  ServiceClient c = client();
  auto submission = c.submit({item("good", correct_candidate()), item(7, kWrongCandidate),
                              item("raises", kRaisingCandidate)});
  ASSERT_TRUE(submission.ok()) << submission.status().to_string();
  ASSERT_EQ(submission->jobs.size(), 3u);
  EXPECT_EQ(submission->jobs[1].id, 7) << "integer client ids come back as integers";

  auto first = c.poll(submission->batch);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->jobs.size(), 3u);
  for (const auto& job : first->jobs) EXPECT_TRUE(job.state == "queued" || job.state == "running" || job.state == "done");

  auto results = c.wait(submission->batch, std::chrono::minutes(3));
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  ASSERT_EQ(results->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*results)[i].job, submission->jobs[i].job) << "submission order";
    EXPECT_EQ((*results)[i].state, "done");
    ASSERT_TRUE((*results)[i].verdict.has_value());
  }
  EXPECT_EQ((*results)[0].verdict->status, EvalStatus::ok) << to_json(*(*results)[0].verdict).dump(2);
  EXPECT_EQ((*results)[0].verdict->task_id, "good") << "the client id labels the verdict without a task_id";
  for (const auto& result : *results) {
    ASSERT_TRUE(result.verdict->profile.started_s.has_value()) << "from the batch's submission";
    EXPECT_GE(*result.verdict->profile.started_s, 0);
    EXPECT_FALSE(result.verdict->profile.prebuild_s.has_value()) << "torch candidates are never pre-built";
  }
  EXPECT_EQ((*results)[1].verdict->status, EvalStatus::incorrect);
  EXPECT_EQ((*results)[2].verdict->status, EvalStatus::runtime_error);

  auto job = c.job(submission->jobs[2].job);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  EXPECT_EQ(job->state, "done");
  EXPECT_EQ(job->batch, submission->batch);
  EXPECT_EQ(job->id, "raises");
  EXPECT_NE(job->verdict->message.find("kz-test: deliberate failure"), std::string::npos) << job->verdict->message;
}

TEST_F(ServiceTest, RepeatedCandidateIsACacheHit) {
  start();
  ServiceClient c = client();
  auto first = c.submit({item("a", correct_candidate(1))});
  ASSERT_TRUE(first.ok());
  auto a = c.wait(first->batch, std::chrono::minutes(2));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_FALSE(a->front().verdict->cached);
  auto second = c.submit({ServiceItem{"b", kTinyReference, correct_candidate(1), "torch", "tiny", ""}});
  auto b = c.wait(second->batch, std::chrono::minutes(2));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE(b->front().verdict->cached);
  EXPECT_EQ(b->front().verdict->task_id, "tiny");
  EXPECT_EQ(b->front().verdict->policy, "strict") << "the server's policy";
  // Another policy is another evaluation (the verdict cache's key holds it), and its verdict says so.
  auto third = c.submit({ServiceItem{"c", kTinyReference, correct_candidate(1), "torch", "tiny", "kernelbench"}});
  auto kb = c.wait(third->batch, std::chrono::minutes(2));
  ASSERT_TRUE(kb.ok()) << kb.status().to_string();
  EXPECT_FALSE(kb->front().verdict->cached);
  EXPECT_EQ(kb->front().verdict->policy, "kernelbench");
  EXPECT_EQ(kb->front().verdict->status, EvalStatus::ok);
}

TEST_F(ServiceTest, StreamSendsEachVerdictOnceAndEnds) {
  start();
  ServiceClient c = client();
  auto submission = c.submit({item("s1", correct_candidate(2)), item("s2", kWrongCandidate),
                              item("s3", correct_candidate(3))});
  ASSERT_TRUE(submission.ok()) << submission.status().to_string();
  std::multiset<std::string> streamed;
  Status status = c.stream(submission->batch, [&](const JobResult& r) {
    EXPECT_TRUE(r.verdict.has_value());
    streamed.insert(r.job);
  });
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  std::multiset<std::string> submitted;
  for (const auto& job : submission->jobs) submitted.insert(job.job);
  EXPECT_EQ(streamed, submitted);

  // Once the batch is done, a new stream replays every verdict at once and ends.
  size_t replayed = 0;
  ASSERT_TRUE(c.stream(submission->batch, [&](const JobResult&) { ++replayed; }).is_ok());
  EXPECT_EQ(replayed, 3u);
}

TEST_F(ServiceTest, BadJsonIs400WithAMessage) {
  start();
  auto [status, body] = raw_post(service_->port(), "/v1/evaluations", "{\"items\": [");
  EXPECT_EQ(status, 400);
  ASSERT_TRUE(body.is_object()) << "errors are JSON too";
  EXPECT_NE(body["error"].get<std::string>().find("not valid JSON"), std::string::npos) << body.dump();
}

TEST_F(ServiceTest, MalformedItemsAre400NamingTheProblem) {
  start();
  int port = service_->port();
  struct Case {
    std::string body, expected;
  };
  const std::vector<Case> cases = {
      {R"({"things": []})", "\"items\" array"},
      {R"({"items": []})", "empty"},
      {R"({"items": [{"id": "a", "reference": "r"}]})", "items[0]: \"candidate\" must be a string"},
      {R"({"items": [{"id": [1], "reference": "r", "candidate": "c"}]})", "\"id\""},
      {R"({"items": [{"id": "a", "reference": "r", "candidate": "c", "format": "fortran"}]})", "fortran"},
      {R"({"items": [{"id": "a", "reference": "r", "candidate": "c", "trails": 3}]})", "unknown key \"trails\""},
      {R"({"items": [{"id": "a", "reference": "r", "candidate": "c", "policy": "lenient"}]})", "lenient"},
  };
  for (const auto& c : cases) {
    auto [status, body] = raw_post(port, "/v1/evaluations", c.body);
    EXPECT_EQ(status, 400) << c.body;
    ASSERT_TRUE(body.is_object() && body.contains("error")) << c.body;
    EXPECT_NE(body["error"].get<std::string>().find(c.expected), std::string::npos)
        << c.body << " -> " << body.dump();
  }
  EXPECT_EQ(service_->counts().submitted, 0u) << "a refused request queues nothing";

  // The C++ client reports the service's message.
  auto refused = client().submit({});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(refused.status().message().find("empty"), std::string::npos) << refused.status().message();
}

TEST_F(ServiceTest, UnknownIdsAndPathsAre404) {
  start();
  int port = service_->port();
  for (const char* path : {"/v1/jobs/nope", "/v1/batches/nope", "/v1/batches/nope/stream", "/v2/anything"}) {
    auto [status, body] = raw_get(port, path);
    EXPECT_EQ(status, 404) << path;
    EXPECT_TRUE(body.is_object() && body.contains("error")) << path << " -> " << body.dump();
  }
  auto missing = client().job("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
}

TEST_F(ServiceTest, BadReferenceIsAnsweredNotRefused) {
  start();
  ServiceClient c = client();
  auto submission = c.submit({ServiceItem{"r", "x = 1\n", correct_candidate(), "torch", "", ""}});
  ASSERT_TRUE(submission.ok());
  auto results = c.wait(submission->batch, std::chrono::seconds(30));
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  const Verdict& v = *results->front().verdict;
  EXPECT_EQ(v.status, EvalStatus::infra_error);
  EXPECT_TRUE(v.has_check(Check::reference_failed)) << to_json(v).dump(2);
}

// stop() ends open streams instead of waiting for their batches (here: a sleeper that only its
// 3 s correctness deadline ends).
// One worker: the sleeper runs (until its 3 s deadline), the three behind it are cancelled and
// answered at once; the batch then completes when the sleeper's verdict comes.
TEST_F(ServiceTest, CancelAnswersTheJobsNotStartedAndLetsTheRunningOneFinish) {
  start(1, [](EvalOptions& o) { o.timeouts.correctness_s = 3; });
  ServiceClient c = client();
  auto submission = c.submit({item("sleeper", kSleeperCandidate), item("a", correct_candidate(11)),
                              item("b", correct_candidate(12)), item("c", correct_candidate(13))});
  ASSERT_TRUE(submission.ok()) << submission.status().to_string();
  for (int i = 0; i < 200; ++i) {  // until the sleeper has started
    auto job = c.job(submission->jobs[0].job);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    if (job->state == "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto cancelled = c.cancel(submission->batch);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().to_string();
  EXPECT_EQ(*cancelled, 3u);
  auto again = c.cancel(submission->batch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u) << "nothing is answered twice";
  auto results = c.wait(submission->batch, std::chrono::minutes(2));
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  ASSERT_EQ(results->size(), 4u);
  EXPECT_EQ((*results)[0].verdict->status, EvalStatus::timeout) << to_json(*(*results)[0].verdict).dump(2);
  for (size_t i = 1; i < 4; ++i) {
    const Verdict& v = *(*results)[i].verdict;
    EXPECT_EQ(v.status, EvalStatus::infra_error) << to_json(v).dump(2);
    EXPECT_NE(v.message.find("cancelled by the client"), std::string::npos) << v.message;
    EXPECT_EQ(v.task_id, (*results)[i].id.get<std::string>());
  }
  EXPECT_EQ(service_->counts().done, 4u);
  EXPECT_EQ(service_->counts().queued, 0u);
  auto unknown = c.cancel("no-such-batch");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("404"), std::string::npos) << unknown.status().message();
}

TEST_F(ServiceTest, StopEndsOpenStreams) {
  start(1, [](EvalOptions& o) { o.timeouts.correctness_s = 3; });
  ServiceClient c = client();
  auto submission = c.submit({item("sleeper", kSleeperCandidate), item("next", correct_candidate(9))});
  ASSERT_TRUE(submission.ok());
  Status streamed;
  std::thread reader([&] { streamed = ServiceClient("127.0.0.1", service_->port()).stream(submission->batch, [](const JobResult&) {}); });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto started = std::chrono::steady_clock::now();
  service_->stop();
  reader.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_FALSE(streamed.is_ok()) << "the batch never finished, so the stream cannot end cleanly";
  EXPECT_LT(seconds, 30) << "stop() waits only for the running evaluation (its deadline)";
  EXPECT_EQ(service_->counts().queued, 1u) << "the queued job is dropped, not run";
}

TEST_F(ServiceTest, ClientReportsAnUnreachableService) {
  start();
  int port = service_->port();
  service_->stop();
  auto health = ServiceClient("127.0.0.1", port).health();
  ASSERT_FALSE(health.ok());
  EXPECT_EQ(health.status().code(), StatusCode::io_error);
}

}  // namespace
}  // namespace kz::test
