// The HTTP generator against a real server on loopback (tests/fake_openai_server.py, spawned per
// test so its counters start at zero): round trips on both endpoints, n gathering, logprobs,
// bounded real concurrency, retries (5xx, 429 + Retry-After, truncated bodies), no retry on
// 400, timeouts, refused connections, the API key, the request log, and model specs.
#include "kz/llm/http_generator.h"

#include <curl/curl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"

namespace kz {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr const char* kToken = "sk-fake-secret-4242";

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

size_t append_body(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// A port nothing listens on: bound, then released (nobody else grabs it within a test).
int unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

GenerationRequest chat(const std::string& id, const std::string& text, int n = 1) {
  GenerationRequest r;
  r.id = id;
  r.messages = {{"system", "You are terse."}, {"user", text}};
  r.params.n = n;
  return r;
}

std::vector<std::string> read_lines(const fs::path& path) {
  auto text = read_file(path);
  std::vector<std::string> lines;
  if (!text.ok()) return lines;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class HttpGeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_llm_http_test");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
    ProcessSpec spec;
    spec.argv = {KZ_TEST_PYTHON3, KZ_FAKE_OPENAI_SERVER, (dir_ / "port").string(), kToken};
    spec.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONDONTWRITEBYTECODE", "1"}};
    auto process = Process::spawn(spec);
    ASSERT_TRUE(process.ok()) << process.status().to_string();
    server_.emplace(std::move(*process));
    port_ = wait_for_port();
    ASSERT_GT(port_, 0) << "fake server did not start: " << server_->stderr_tail();
  }

  void TearDown() override {
    server_.reset();  // kills the server's process group
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  int wait_for_port() {
    auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline) {
      auto text = read_file(dir_ / "port");
      if (text.ok() && !text->empty()) return std::stoi(*text);
      if (server_->wait_for(20ms)) return 0;  // exited early
    }
    return 0;
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

  HttpGeneratorOptions options(const std::string& model) const {
    HttpGeneratorOptions o;
    o.base_url = base_url();
    o.model = model;
    o.max_in_flight = 4;
    o.request_timeout_s = 30;
    o.max_retries = 3;
    o.backoff_initial_s = 0.05;
    o.backoff_max_s = 0.2;
    o.log_dir = dir_ / "logs";
    return o;
  }

  std::unique_ptr<Generator> make(const HttpGeneratorOptions& o) {
    auto g = make_http_generator(o);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(*g) : nullptr;
  }

  // Generates one request and expects success.
  std::vector<Completion> generate_ok(const HttpGeneratorOptions& o, const GenerationRequest& r) {
    auto g = make(o);
    if (!g) return {};
    auto results = g->generate({r});
    EXPECT_EQ(results.size(), 1u);
    EXPECT_TRUE(results[0].ok()) << results[0].status().to_string();
    return results[0].ok() ? *results[0] : std::vector<Completion>{};
  }

  json stats() const {
    std::string body;
    CURL* easy = curl_easy_init();
    std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/stats";
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
    CURLcode code = curl_easy_perform(easy);
    curl_easy_cleanup(easy);
    EXPECT_EQ(code, CURLE_OK);
    return json::parse(body, nullptr, false);
  }

  // Attempts the server saw for a prompt (keyed like the server: all messages' content joined).
  int attempts_for(const GenerationRequest& r) {
    std::string key;
    for (size_t i = 0; i < r.messages.size(); ++i) key += (i ? "\n" : "") + r.messages[i].content;
    if (r.messages.empty()) key = r.prompt;
    return stats()["attempts"].value(key, 0);
  }

  std::vector<std::string> log_lines() const { return read_lines(dir_ / "logs" / "requests.jsonl"); }

  fs::path dir_;
  std::optional<Process> server_;
  int port_ = 0;
};

TEST_F(HttpGeneratorTest, ChatEchoRoundTripSendsEveryParameter) {
  GenerationRequest r = chat("r1", "hello brave new world");
  r.params.temperature = 0.7;
  r.params.top_p = 0.9;
  r.params.max_tokens = 123;
  r.params.stop = {"```", "END"};
  r.params.seed = 11;
  auto completions = generate_ok(options("echo"), r);
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0].text, "hello brave new world");
  EXPECT_EQ(completions[0].finish_reason, "stop");
  EXPECT_EQ(completions[0].prompt_tokens, 7);  // "You are terse." + the 4 words
  EXPECT_EQ(completions[0].completion_tokens, 4);
  EXPECT_TRUE(completions[0].logprobs.empty());

  json sent = stats()["requests"][0];
  EXPECT_EQ(sent["path"], "/v1/chat/completions");
  const json& body = sent["body"];
  EXPECT_EQ(body["model"], "echo");
  EXPECT_EQ(body["n"], 1);
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.7);
  EXPECT_DOUBLE_EQ(body["top_p"].get<double>(), 0.9);
  EXPECT_EQ(body["max_tokens"], 123);
  EXPECT_EQ(body["stop"], json({"```", "END"}));
  EXPECT_EQ(body["seed"], 11);
  EXPECT_EQ(body["messages"][0], json({{"role", "system"}, {"content", "You are terse."}}));
  EXPECT_FALSE(body.contains("logprobs"));
  EXPECT_FALSE(body.contains("prompt"));
  EXPECT_FALSE(sent["auth"].get<bool>());  // no api_key_env: no Authorization header
}

TEST_F(HttpGeneratorTest, CompletionsRoundTripWithoutOptionalFields) {
  GenerationRequest r;
  r.id = "raw";
  r.prompt = "def add(a, b):";
  auto completions = generate_ok(options("echo"), r);
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0].text, "def add(a, b):");
  EXPECT_EQ(completions[0].completion_tokens, 3);
  json sent = stats()["requests"][0];
  EXPECT_EQ(sent["path"], "/v1/completions");
  EXPECT_EQ(sent["body"]["prompt"], "def add(a, b):");
  EXPECT_FALSE(sent["body"].contains("messages"));
  EXPECT_FALSE(sent["body"].contains("stop"));
  EXPECT_FALSE(sent["body"].contains("seed"));
}

TEST_F(HttpGeneratorTest, NChoicesFromOneCall) {
  GenerationRequest r = chat("n3", "three please", 3);
  auto completions = generate_ok(options("echo"), r);
  ASSERT_EQ(completions.size(), 3u);
  for (const Completion& c : completions) EXPECT_EQ(c.text, "three please");
  EXPECT_EQ(attempts_for(r), 1);
}

TEST_F(HttpGeneratorTest, NGatheredFromAServerThatIgnoresN) {
  GenerationRequest r = chat("n4", "one at a time", 4);
  r.params.seed = 100;
  auto completions = generate_ok(options("one-choice"), r);
  ASSERT_EQ(completions.size(), 4u);
  EXPECT_EQ(attempts_for(r), 4);
  // The follow-up calls got distinct seeds, so seeded sampling still yields distinct samples.
  std::set<uint64_t> seeds;
  json sent_requests = stats()["requests"];  // named: a range-for over a temporary's member dangles
  for (const json& sent : sent_requests) seeds.insert(sent["body"]["seed"].get<uint64_t>());
  // The first call asked for 4, so follow-ups start past the seeds it could have used.
  EXPECT_EQ(seeds, (std::set<uint64_t>{100, 104, 105, 106}));
}

TEST_F(HttpGeneratorTest, ChatLogprobsParsed) {
  GenerationRequest r = chat("lp", "alpha beta gamma");
  r.params.logprobs = true;
  auto completions = generate_ok(options("echo"), r);
  ASSERT_EQ(completions.size(), 1u);
  ASSERT_EQ(completions[0].logprobs.size(), 3u);
  EXPECT_EQ(completions[0].logprobs[1].token, "beta");
  EXPECT_DOUBLE_EQ(completions[0].logprobs[1].logprob, -1.0);
  EXPECT_EQ(stats()["requests"][0]["body"]["logprobs"], true);
}

TEST_F(HttpGeneratorTest, CompletionsLogprobsParsed) {
  GenerationRequest r;
  r.id = "lp-raw";
  r.prompt = "x y";
  r.params.logprobs = true;
  auto completions = generate_ok(options("echo"), r);
  ASSERT_EQ(completions.size(), 1u);
  ASSERT_EQ(completions[0].logprobs.size(), 2u);
  EXPECT_EQ(completions[0].logprobs[0].token, "x");
  EXPECT_DOUBLE_EQ(completions[0].logprobs[0].logprob, -0.5);
  EXPECT_EQ(stats()["requests"][0]["body"]["logprobs"], 1);
}

TEST_F(HttpGeneratorTest, ConcurrencyIsRealAndBounded) {
  HttpGeneratorOptions o = options("slow-1");
  o.max_in_flight = 8;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 40; ++i) requests.push_back(chat(fmt::format("c{}", i), fmt::format("request number {}", i)));
  auto g = make(o);
  ASSERT_TRUE(g);
  auto start = Clock::now();
  auto results = g->generate(requests);
  double elapsed = seconds_since(start);
  EXPECT_LT(elapsed, 15.0);  // 5 s ideal; 40 s if serial
  ASSERT_EQ(results.size(), 40u);
  for (int i = 0; i < 40; ++i) {  // in request order
    ASSERT_TRUE(results[i].ok()) << results[i].status().to_string();
    EXPECT_EQ((*results[i])[0].text, fmt::format("request number {}", i));
  }
  int max_seen = stats()["max_in_flight"].get<int>();
  EXPECT_LE(max_seen, 8);
  EXPECT_GE(max_seen, 4);
}

TEST_F(HttpGeneratorTest, RetriesServerErrorsThenSucceeds) {
  GenerationRequest r = chat("flaky", "eventually fine");
  auto completions = generate_ok(options("fail-2"), r);
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0].text, "eventually fine");
  EXPECT_EQ(attempts_for(r), 3);

  // One log line per attempt, each with the documented fields.
  auto lines = log_lines();
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    json line = json::parse(lines[i]);
    EXPECT_EQ(line["id"], "flaky");
    EXPECT_EQ(line["attempt"], static_cast<int>(i + 1));
    EXPECT_EQ(line["url"], base_url() + "/chat/completions");
    EXPECT_EQ(line["request"]["model"], "fail-2");
    EXPECT_EQ(line["status"], i < 2 ? 500 : 200);
    EXPECT_TRUE(line["error"].is_null());
    EXPECT_TRUE(line["response"].is_object());
    EXPECT_GE(line["elapsed_s"].get<double>(), 0.0);
  }
}

TEST_F(HttpGeneratorTest, ExhaustedRetriesNameTheHttpStatus) {
  HttpGeneratorOptions o = options("fail-10");
  o.max_retries = 2;
  GenerationRequest r = chat("doomed", "never fine");
  auto results = make(o)->generate({r});
  ASSERT_FALSE(results[0].ok());
  std::string message = results[0].status().message();
  EXPECT_NE(message.find("HTTP 500"), std::string::npos) << message;
  EXPECT_NE(message.find("doomed"), std::string::npos) << message;
  EXPECT_NE(message.find(base_url() + "/chat/completions"), std::string::npos) << message;
  EXPECT_NE(message.find("scripted failure"), std::string::npos) << message;  // the body snippet
  EXPECT_EQ(attempts_for(r), 3);
}

TEST_F(HttpGeneratorTest, RateLimitHonoursRetryAfter) {
  GenerationRequest r = chat("rl", "patience");
  auto start = Clock::now();
  auto completions = generate_ok(options("ratelimit"), r);
  EXPECT_GE(seconds_since(start), 1.0);  // backoff alone would be <= 0.2 s
  EXPECT_EQ(completions.size(), 1u);
  EXPECT_EQ(attempts_for(r), 2);
}

TEST_F(HttpGeneratorTest, TruncatedBodyIsRetried) {
  GenerationRequest r = chat("cut", "half a reply");
  auto completions = generate_ok(options("truncated"), r);
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0].text, "half a reply");
  EXPECT_EQ(attempts_for(r), 2);
  json first = json::parse(log_lines().at(0));
  EXPECT_TRUE(first["response"].is_string());  // not JSON: logged as raw text
}

TEST_F(HttpGeneratorTest, BadRequestIsNotRetried) {
  GenerationRequest r = chat("bad", "unsupported");
  auto results = make(options("bad-request"))->generate({r});
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), StatusCode::invalid_argument);
  std::string message = results[0].status().message();
  EXPECT_NE(message.find("HTTP 400"), std::string::npos) << message;
  EXPECT_NE(message.find("scripted 400"), std::string::npos) << message;
  EXPECT_EQ(attempts_for(r), 1);
}

TEST_F(HttpGeneratorTest, OneFailedRequestDoesNotFailTheOthers) {
  std::vector<GenerationRequest> requests = {chat("a", "first"), chat("b", "[mode:bad-request] second"),
                                             chat("c", "[mode:fail-1] third")};
  auto results = make(options("echo"))->generate(requests);
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ((*results[0])[0].text, "first");
  EXPECT_FALSE(results[1].ok());
  EXPECT_NE(results[1].status().message().find("request b"), std::string::npos);
  ASSERT_TRUE(results[2].ok()) << results[2].status().to_string();
  EXPECT_EQ((*results[2])[0].text, "[mode:fail-1] third");
}

TEST_F(HttpGeneratorTest, RequestTimeoutFailsQuickly) {
  HttpGeneratorOptions o = options("slow-30");
  o.request_timeout_s = 1;
  o.max_retries = 1;
  auto start = Clock::now();
  auto results = make(o)->generate({chat("late", "too slow")});
  // Two 1 s timeouts and a backoff (~2.1 s), not the server's 30 s; room for a loaded machine.
  EXPECT_LT(seconds_since(start), 15.0);
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), StatusCode::timeout) << results[0].status().to_string();
  EXPECT_EQ(log_lines().size(), 2u);
}

TEST_F(HttpGeneratorTest, ConnectionRefusedFailsAfterRetries) {
  HttpGeneratorOptions o = options("echo");
  o.base_url = "http://127.0.0.1:" + std::to_string(unused_port()) + "/v1";
  o.max_retries = 2;
  auto start = Clock::now();
  auto results = make(o)->generate({chat("nobody", "hello?")});
  EXPECT_LT(seconds_since(start), 5.0);
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), StatusCode::io_error);
  EXPECT_NE(results[0].status().message().find("3 attempts"), std::string::npos) << results[0].status().message();
  auto lines = log_lines();
  ASSERT_EQ(lines.size(), 3u);
  json line = json::parse(lines[0]);
  EXPECT_TRUE(line["status"].is_null());
  EXPECT_TRUE(line["error"].is_string());
}

TEST_F(HttpGeneratorTest, MissingApiKeyIsAnError) {
  HttpGeneratorOptions o = options("auth");
  o.api_key_env = "KZ_TEST_MISSING_KEY";
  ::unsetenv("KZ_TEST_MISSING_KEY");
  auto g = make_http_generator(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("KZ_TEST_MISSING_KEY"), std::string::npos);
  ::setenv("KZ_TEST_MISSING_KEY", "", 1);
  EXPECT_FALSE(make_http_generator(o).ok());
  ::unsetenv("KZ_TEST_MISSING_KEY");
}

TEST_F(HttpGeneratorTest, ApiKeySentAsBearerAndNeverLogged) {
  HttpGeneratorOptions o = options("auth");
  o.api_key_env = "KZ_TEST_API_KEY";
  ::setenv("KZ_TEST_API_KEY", kToken, 1);
  auto completions = generate_ok(o, chat("authed", "let me in"));
  EXPECT_EQ(completions.size(), 1u);
  ::setenv("KZ_TEST_API_KEY", "sk-wrong-key-9999", 1);
  auto rejected = make(o)->generate({chat("wrong", "let me in too")});
  ::unsetenv("KZ_TEST_API_KEY");
  ASSERT_FALSE(rejected[0].ok());
  EXPECT_NE(rejected[0].status().message().find("HTTP 401"), std::string::npos);
  auto log = read_file(dir_ / "logs" / "requests.jsonl");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log_lines().size(), 2u);  // 401 is not retried
  EXPECT_EQ(log->find(kToken), std::string::npos);
  EXPECT_EQ(log->find("sk-wrong-key-9999"), std::string::npos);
}

TEST_F(HttpGeneratorTest, DescribeNamesBackendUrlAndModel) {
  HttpGeneratorOptions o = options("echo");
  o.base_url += "/";  // a trailing slash is dropped, so URLs never get "//"
  EXPECT_EQ(make(o)->describe(), "openai:" + base_url() + ":echo");
}

TEST(ParseModelSpec, SplitsAtTheLastColon) {
  auto o = parse_model_spec("openai:http://127.0.0.1:8000/v1:my-model");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->base_url, "http://127.0.0.1:8000/v1");
  EXPECT_EQ(o->model, "my-model");
  auto hosted = parse_model_spec("openai:https://api.example.com/v1:Qwen/Qwen2.5-Coder-7B-Instruct");
  ASSERT_TRUE(hosted.ok()) << hosted.status().to_string();
  EXPECT_EQ(hosted->base_url, "https://api.example.com/v1");
  EXPECT_EQ(hosted->model, "Qwen/Qwen2.5-Coder-7B-Instruct");
}

TEST(ParseModelSpec, ErrorsNameTheSpec) {
  for (const std::string spec : {"vllm:http://h:1/v1:m", "openai:http://h:8000/v1", "openai:http://h:8000/v1:",
                                 "openai:ftp://h/v1:m", "openai:nocolon", "http://h:1/v1:m"}) {
    auto o = parse_model_spec(spec);
    EXPECT_FALSE(o.ok()) << spec;
    EXPECT_NE(o.status().message().find(spec), std::string::npos) << o.status().message();
  }
}

TEST(HttpGeneratorOptions, ValidateRejectsBadLimits) {
  HttpGeneratorOptions o;
  o.base_url = "http://h/v1";
  o.model = "m";
  EXPECT_TRUE(o.validate().is_ok());
  auto rejects = [&](auto mutate, const std::string& field) {
    HttpGeneratorOptions bad = o;
    mutate(bad);
    Status s = bad.validate();
    EXPECT_FALSE(s.is_ok()) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  rejects([](auto& b) { b.max_in_flight = 0; }, "max_in_flight");
  rejects([](auto& b) { b.request_timeout_s = 0; }, "request_timeout_s");
  rejects([](auto& b) { b.connect_timeout_s = -1; }, "connect_timeout_s");
  rejects([](auto& b) { b.max_retries = -1; }, "max_retries");
  rejects([](auto& b) { b.backoff_max_s = 0.5; }, "backoff_max_s");
  rejects([](auto& b) { b.model = ""; }, "model");
  rejects([](auto& b) { b.base_url = "127.0.0.1:8000/v1"; }, "base_url");
  EXPECT_FALSE(make_http_generator(HttpGeneratorOptions{}).ok());
}

}  // namespace
}  // namespace kz
