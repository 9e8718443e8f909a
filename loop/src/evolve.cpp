// The co-evolution loop (evolve.h). Evolution::run_iteration is one iteration, top to bottom;
// the functions after it are its steps.
#include "kz/loop/evolve.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <future>
#include <regex>
#include <map>
#include <numeric>
#include <random>

#include "kz/core/hash.h"
#include "kz/core/jsonl.h"
#include "kz/core/parallel.h"
#include "kz/core/terminal.h"
#include "kz/curriculum/proposer.h"
#include "kz/dist/process_group.h"
#include "kz/dist/world.h"
#include "kz/eval/evaluator.h"
#include "kz/eval/options.h"
#include "kz/eval/suite.h"
#ifdef KZ_LOOP_WITH_SERVICE
#include "kz/eval/service_client.h"
#endif
#include "kz/llm/extract.h"
#include "kz/llm/prompt.h"
#include "kz/loop/evolve_config.h"
#include "kz/loop/run_dir.h"
#include "kz/suite_bench/bench.h"
#include "kz/suite_bench/report.h"
#include "kz/rl/advantage.h"
#include "kz/task/catalogue.h"
#include "kz/task/task.h"

namespace kz::loop {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds of one phase by stage.
struct StageSeconds {
  double generate = 0, evaluate = 0, train = 0;
  json to_json() const { return {{"generate", generate}, {"evaluate", evaluate}, {"train", train}}; }
};

// Every seed of the run derives from the run's seed, the iteration, the phase and an index: a
// resumed iteration samples exactly what the interrupted one did.
uint64_t derive_seed(uint64_t run_seed, int64_t iteration, std::string_view what, size_t index = 0) {
  return hash64(fmt::format("{}:{}:{}:{}", run_seed, iteration, what, index)) >> 1;
}

std::string now_utc() {
  std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buffer;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// One Coder sample (a judge attempt or a Coder-phase sample): the reply, its code and verdict.
struct CoderSample {
  size_t task = 0;   // index into the phase's tasks
  int index = 0;     // within the task's group
  Completion completion;
  std::string file;  // the kernel, relative to the run dir; empty when the reply held no code
  std::string code;  // the kernel itself, evaluated when `file` is set
  std::string prompt_hash;
  Verdict verdict;
};

// ---- what ranks exchange (data parallel): JSON, sent as CBOR (the texts need not be UTF-8) ----

std::string to_bytes(const json& j) {
  std::vector<uint8_t> bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

Result<json> from_bytes(const std::string& bytes, const std::string& what) {
  json j = json::from_cbor(bytes, /*strict=*/true, /*allow_exceptions=*/false);
  if (j.is_discarded()) return parse_error(what + ": not readable CBOR");
  return j;
}

json completion_json(const Completion& c) {
  json logprobs = json::array();
  for (const TokenLogprob& lp : c.logprobs) logprobs.push_back({lp.token, lp.logprob});
  return {{"text", c.text}, {"finish_reason", c.finish_reason}, {"prompt_tokens", c.prompt_tokens},
          {"completion_tokens", c.completion_tokens}, {"logprobs", logprobs}, {"token_ids", c.token_ids},
          {"prompt_token_ids", c.prompt_token_ids}};
}

Completion completion_from_json(const json& j) {
  Completion c{j.at("text").get<std::string>(), j.at("finish_reason").get<std::string>(),
               j.at("prompt_tokens").get<int>(), j.at("completion_tokens").get<int>(), {},
               j.at("token_ids").get<std::vector<int64_t>>(), j.at("prompt_token_ids").get<std::vector<int64_t>>()};
  for (const json& lp : j.at("logprobs")) c.logprobs.push_back({lp.at(0).get<std::string>(), lp.at(1).get<double>()});
  return c;
}

json sample_json(const CoderSample& s) {
  return {{"task", s.task}, {"index", s.index}, {"completion", completion_json(s.completion)}, {"file", s.file},
          {"code", s.code}, {"prompt_hash", s.prompt_hash}, {"verdict", to_json(s.verdict)}};
}

Result<CoderSample> sample_from_json(const json& j) {
  try {
    auto verdict = verdict_from_json(j.at("verdict"));
    if (!verdict.ok()) return verdict.status();
    return CoderSample{j.at("task").get<size_t>(), j.at("index").get<int>(), completion_from_json(j.at("completion")),
                       j.at("file").get<std::string>(), j.at("code").get<std::string>(),
                       j.at("prompt_hash").get<std::string>(), std::move(*verdict)};
  } catch (const json::exception& e) {
    return parse_error(std::string("a sample from another rank: ") + e.what());
  }
}

json proposal_batches_json(const std::vector<ProposalBatch>& batches) {
  json out = json::array();
  for (const ProposalBatch& b : batches) {
    json apis = json::array(), proposals = json::array();
    for (const ApiEntry& api : b.apis)
      apis.push_back({{"name", api.name}, {"category", api.category}, {"aten", api.aten}});
    for (const Proposal& p : b.proposals) {
      const ModuleVerdict& v = p.verdict;
      proposals.push_back({{"id", p.id}, {"code", p.code ? json(*p.code) : json()}, {"kept", p.kept},
                           {"reason", p.reason}, {"failed_check", p.failed_check}, {"reply", completion_json(p.reply)},
                           {"verdict", {{"valid", v.valid}, {"reason", v.reason}, {"failed_check", v.failed_check},
                                        {"aten_ops", v.aten_ops}, {"output_shapes", v.output_shapes},
                                        {"fingerprint", v.fingerprint}, {"runtime_ms", v.runtime_ms}}}});
    }
    out.push_back({{"apis", apis}, {"proposals", proposals}});
  }
  return out;
}

Result<std::vector<ProposalBatch>> proposal_batches_from_json(const json& j) {
  try {
    std::vector<ProposalBatch> out;
    for (const json& b : j) {
      ProposalBatch batch;
      for (const json& api : b.at("apis"))
        batch.apis.push_back({api.at("name").get<std::string>(), api.at("category").get<std::string>(),
                              api.at("aten").get<std::vector<std::string>>()});
      for (const json& p : b.at("proposals")) {
        const json& v = p.at("verdict");
        Proposal proposal;
        proposal.id = p.at("id").get<std::string>();
        if (!p.at("code").is_null()) proposal.code = p.at("code").get<std::string>();
        proposal.verdict = {v.at("valid").get<bool>(), v.at("reason").get<std::string>(),
                            v.at("failed_check").get<std::string>(), v.at("aten_ops").get<std::vector<std::string>>(),
                            v.at("output_shapes").get<std::vector<std::vector<int64_t>>>(),
                            v.at("fingerprint").get<std::string>(), v.at("runtime_ms").get<double>()};
        proposal.kept = p.at("kept").get<bool>();
        proposal.reason = p.at("reason").get<std::string>();
        proposal.failed_check = p.at("failed_check").get<std::string>();
        proposal.reply = completion_from_json(p.at("reply"));
        batch.proposals.push_back(std::move(proposal));
      }
      out.push_back(std::move(batch));
    }
    return out;
  } catch (const json::exception& e) {
    return parse_error(std::string("rank 0's proposals: ") + e.what());
  }
}

rl::SampleVerdict sample_verdict(const Verdict& v) {
  auto status = rl::parse_sample_status(status_name(v.status));
  return {status.ok() ? *status : rl::SampleStatus::infra_error, v.correct, v.speedup};
}

// One proposal with what the judge and the rewards made of it.
struct JudgedProposal {
  const Proposal* proposal = nullptr;
  size_t batch = 0;                  // its API set
  std::string file;                  // the module, relative to the run dir ("" without code)
  std::optional<double> pass_rate;   // p̂: kept modules whose judge samples reached a verdict
  int attempts = 0;                  // judge samples with a verdict
  std::optional<double> reward, advantage;
  std::string frontier;              // the frontier's decision ("" when not offered)
};

// The policy update's statistics as metrics fields (null when no update ran).
json update_json(const std::optional<rl::PolicyUpdateStats>& stats) {
  if (!stats) return {{"kl", nullptr}, {"entropy", nullptr}, {"clip_fraction", nullptr}, {"loss", nullptr},
                      {"grad_norm", nullptr}, {"optimizer_steps", 0}};
  return {{"kl", stats->approx_kl},       {"entropy", stats->entropy},     {"clip_fraction", stats->clip_fraction},
          {"loss", stats->loss},          {"grad_norm", stats->grad_norm}, {"optimizer_steps", stats->steps}};
}

// Where the Coder's samples are evaluated: the verdicts of `entries` in their order, each also
// appended to `results` as it arrives.
using EvaluateEntries = std::function<Result<std::vector<Verdict>>(
    const std::vector<Task>& tasks, const std::vector<SuiteEntry>& entries, const fs::path& results)>;

#ifdef KZ_LOOP_WITH_SERVICE
// "http://host:port" (a trailing "/v1" or "/" allowed) -> host, port.
Result<std::pair<std::string, int>> parse_service_url(const std::string& url) {
  static const std::regex form(R"(http://([^/:]+):([0-9]{1,5})(/v1)?/?)");
  std::smatch m;
  if (!std::regex_match(url, m, form))
    return invalid_argument(fmt::format("[eval] url '{}' is not http://HOST:PORT (a kz serve-eval)", url));
  return std::pair{m[1].str(), std::stoi(m[2].str())};
}

// A kz serve-eval service's verdicts for `entries`: one batch, streamed back as they finish.
Result<std::vector<Verdict>> evaluate_remotely(ServiceClient& client, const std::string& format,
                                               const std::vector<Task>& tasks, const std::vector<SuiteEntry>& entries,
                                               const fs::path& results) {
  std::vector<ServiceItem> items;
  for (size_t e = 0; e < entries.size(); ++e) {
    const Task& task = tasks[entries[e].task_index];
    items.push_back({json(e), task.source, entries[e].candidate.source, format, task.id});
  }
  auto submission = client.submit(items);
  if (!submission.ok()) return submission.status();
  std::vector<std::optional<Verdict>> verdicts(entries.size());
  Status written;
  KZ_RETURN_IF_ERROR(client.stream(submission->batch, [&](const JobResult& job) {
    if (!job.verdict || !job.id.is_number_unsigned() || job.id.get<size_t>() >= entries.size()) return;
    size_t e = job.id.get<size_t>();
    verdicts[e] = *job.verdict;
    verdicts[e]->candidate = entries[e].candidate.label;
    if (written.is_ok() && !results.empty()) written = append_line(results, dump(to_json(*verdicts[e])));
  }));
  KZ_RETURN_IF_ERROR(written);
  std::vector<Verdict> out;
  for (size_t e = 0; e < entries.size(); ++e) {
    if (!verdicts[e]) return internal_error(fmt::format("the evaluation service sent no verdict for {}",
                                                        entries[e].candidate.label));
    out.push_back(std::move(*verdicts[e]));
  }
  return out;
}
#endif

class Evolution {
 public:
  static Result<std::unique_ptr<Evolution>> open(const EvolveOptions& options, const dist::World& world,
                                                 std::ostream& out);
  // Iterations up to `target` (nullopt: the config's run.iterations).
  Result<EvolveResult> run(std::optional<int64_t> target);

 private:
  Evolution(EvolveConfig config, fs::path run_dir, std::ostream& out, dist::World world)
      : config_(std::move(config)), run_dir_(std::move(run_dir)), out_(out),
        metrics_(run_dir_ / "metrics.jsonl"), provenance_(run_dir_ / "provenance.jsonl"), world_(std::move(world)) {}

  Status run_iteration(int64_t i, int64_t target);
  // 1. Proposer phase (with 2, the frontier; not run with a static curriculum)
  Status proposer_phase(int64_t i);
  Result<std::vector<JudgedProposal>> propose_and_judge(int64_t i, StageSeconds& seconds);
  Result<std::vector<ProposalBatch>> share_proposals(Result<std::vector<ProposalBatch>> batches);
  Result<std::optional<rl::PolicyUpdateStats>> update_proposer(std::vector<JudgedProposal>& judged,
                                                               StageSeconds& seconds);
  // 2. Frontier
  Status offer_to_frontier(std::vector<JudgedProposal>& judged);
  // 3. Coder phase
  Status coder_phase(int64_t i);
  std::vector<Task> frontier_tasks();
  std::vector<Task> static_tasks_for(int64_t i) const;
  // 4. Held-out evaluation and checkpoint
  Status heldout(int64_t i);
  bool budget_spent() const {
    return config_.max_evaluations > 0 && training_evaluations_ >= config_.max_evaluations;
  }
  Status checkpoint(int64_t i);

  // The Coder's samples at its sampling temperature, or at `temperature` where given (held-out).
  Result<std::vector<CoderSample>> sample_coder(int64_t i, const std::string& phase, const std::vector<Task>& tasks,
                                                int attempts, StageSeconds& seconds,
                                                std::optional<double> temperature = std::nullopt);
  Result<std::optional<SuiteEntry>> take_sample(int64_t i, const std::string& phase, const Task& task, size_t t,
                                                int k, const Result<std::vector<Completion>>& result, CoderSample& s);
  Status gather_samples(const std::string& phase, std::vector<CoderSample>& samples, int attempts,
                        const fs::path& results_path);
  bool mine(size_t task) const { return task % static_cast<size_t>(world_.size) == static_cast<size_t>(world_.rank); }
  Status write_run_file(const fs::path& path, std::string_view text) const;
  void count_api_outcomes(const std::vector<CoderSample>& samples, const std::vector<Task>& tasks);
  Status log_metrics(int64_t i, const std::string& phase, json row, const StageSeconds& seconds);
  Status log_module(int64_t i, const JudgedProposal& j);
  Status log_kernel(int64_t i, const std::string& phase, const Task& task, const CoderSample& s,
                    std::optional<double> reward, std::optional<double> advantage);
  fs::path iteration_dir(int64_t i) const { return run_dir_ / "iterations" / checkpoint_name(i); }

  Status open_models();
  Status open_evaluation(int jobs);
  Status open_engine();
  Status open_process_group();
  Status load_static_tasks();
  Status start_fresh();
  Status restore(const fs::path& checkpoint);
  Status write_run_info(int64_t iterations_done) const;

  EvolveConfig config_;
  fs::path run_dir_;
  std::ostream& out_;
  fs::path prompts_dir_;
  AppendLog metrics_, provenance_;
  // Data parallel: this process's rank. Rank 0 alone writes the run dir; every rank holds the
  // loop's whole state, kept identical by sharing what one rank made (samples, proposals).
  dist::World world_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::string eval_device_;  // the evaluations' device on this rank (cuda:<LOCAL_RANK> for a CUDA one)

  std::unique_ptr<Policy> proposer_, coder_own_;
  Policy* coder_ = nullptr;  // coder_own_, or proposer_ with shared_policy
  EvalOptions eval_options_;
  std::optional<Evaluator> evaluator_;  // the held-out suite's, and the Coder's without [eval] url
  EvaluateEntries evaluate_;
  std::vector<Task> heldout_tasks_;
  std::vector<Task> static_tasks_;   // curriculum = "static": the fixed suite, in its seeded order
  std::vector<ApiEntry> catalogue_;
  PromptTemplate coder_prompt_;
  std::optional<ProposerPipeline> pipeline_;
  std::vector<ProposalBatch> batches_;  // this iteration's proposals (JudgedProposal points into them)

  // The loop's state (checkpointed with the models).
  int64_t iterations_done_ = 0;
  int64_t evaluations_ = 0;  // Coder samples evaluated so far (judge, Coder phase, held-out)
  int64_t training_evaluations_ = 0;  // of them, the judge's and the Coder phase's ([run] max_evaluations)
  std::optional<curriculum::ApiStats> api_stats_;
  std::optional<curriculum::ApiSampler> sampler_;
  std::optional<curriculum::FrontierBuffer> frontier_;
  rl::GateMemory gates_;
  json kept_modules_ = json::array();  // [{"id", "source", "fingerprint"}]: the Proposer's dedup index
  json used_ids_ = json::array();      // every proposal id given
};

// ---- one iteration ---------------------------------------------------------------------------

Status Evolution::run_iteration(int64_t i, int64_t target) {
  out_ << fmt::format("== iteration {}/{} ==\n", i, target);
  std::error_code ignored;
  if (world_.is_main()) fs::remove_all(iteration_dir(i), ignored);  // what an interrupted attempt at it left
  KZ_RETURN_IF_ERROR(frontier_->begin_iteration(i));

  // 1-2. The Proposer's modules, judged, rewarded, and offered to the frontier.
  if (config_.curriculum == "frontier") KZ_RETURN_IF_ERROR(proposer_phase(i));
  // 3. Coder phase: frontier (or static) tasks, G samples each, CA-GRPO, update.
  KZ_RETURN_IF_ERROR(coder_phase(i));

  // 4. Every K iterations and at the last (the budget's included): the held-out suite, then a checkpoint.
  if (i % config_.heldout_every == 0 || i == target || budget_spent()) {
    KZ_RETURN_IF_ERROR(heldout(i));
    KZ_RETURN_IF_ERROR(checkpoint(i));
  }
  iterations_done_ = i;
  return Status::ok();
}

// Steps 1 and 2: the Proposer's modules, judged and rewarded, and those in the band offered to the
// frontier.
Status Evolution::proposer_phase(int64_t i) {
  // 1. Proposer phase: modules, the judge's attempts, rewards, update.
  StageSeconds proposer_seconds;
  auto judged = propose_and_judge(i, proposer_seconds);
  if (!judged.ok()) return judged.status().with_context(fmt::format("iteration {}, proposer phase", i));
  auto proposer_update = update_proposer(*judged, proposer_seconds);
  if (!proposer_update.ok()) return proposer_update.status().with_context(fmt::format("iteration {}, proposer update", i));

  // 2. Frontier: kept modules in the band join the buffer.
  KZ_RETURN_IF_ERROR(offer_to_frontier(*judged));
  int joined = 0, judged_modules = 0, valid = 0;
  double reward_sum = 0, pass_sum = 0;
  int rewarded = 0;
  for (auto& j : *judged) {
    KZ_RETURN_IF_ERROR(log_module(i, j));
    if (j.proposal->verdict.valid) ++valid;
    if (j.pass_rate) ++judged_modules, pass_sum += *j.pass_rate;
    if (j.reward) ++rewarded, reward_sum += *j.reward;
    if (j.frontier == "joined") ++joined;
  }
  json row = update_json(*proposer_update);
  row.update({{"samples", judged->size()},
              {"valid_rate", judged->empty() ? 0.0 : double(valid) / judged->size()},
              {"judged", judged_modules},
              {"pass_rate_mean", judged_modules ? json(pass_sum / judged_modules) : json()},
              {"reward_mean", rewarded ? json(reward_sum / rewarded) : json()},
              {"joined_frontier", joined}});
  return log_metrics(i, "proposer", std::move(row), proposer_seconds);
}

// ---- 1. Proposer phase -------------------------------------------------------------------------

Result<std::vector<JudgedProposal>> Evolution::propose_and_judge(int64_t i, StageSeconds& seconds) {
  // API sets, weighted towards what the Coder fails; the Proposer writes modules_per_set each.
  std::vector<std::vector<ApiEntry>> sets;
  for (int s = 0; s < config_.api_sets; ++s) sets.push_back(sampler_->draw(*api_stats_).apis);
  pipeline_->set_seed(derive_seed(config_.seed, i, "proposer"));
  auto started = Clock::now();
  std::optional<Clock::time_point> validating;
  std::optional<ProgressBar> bar;
  auto propose = [&] {
    auto batches = pipeline_->propose(sets, [&](size_t done, size_t total, const std::string& id) {
      if (done == 0) {
        validating = Clock::now();
        bar.emplace("proposer: validate", total, out_);
      } else {
        bar->advance(id);
      }
    });
    if (bar) bar->finish();
    return batches;
  };
  // A failed call (a request, or a validation worker that could not run) leaves the pipeline as it
  // was: tried once more with the same seed, it writes the same replies. Rank 0 alone proposes.
  Result<std::vector<ProposalBatch>> batches = std::vector<ProposalBatch>();
  if (world_.is_main()) {
    batches = propose();
    if (!batches.ok()) {
      out_ << fmt::format("proposer: {}; trying once more\n", batches.status().message());
      batches = propose();
    }
  }
  batches = share_proposals(std::move(batches));
  if (!batches.ok()) return batches.status();
  seconds.generate += std::chrono::duration<double>(validating.value_or(Clock::now()) - started).count();
  if (validating) seconds.evaluate += seconds_since(*validating);
  batches_ = std::move(*batches);

  // Every proposal is kept on disk; kept modules join the dedup state a resume rebuilds.
  std::vector<JudgedProposal> judged;
  std::vector<Task> modules;
  std::vector<size_t> module_of;  // judge task -> judged index
  for (size_t b = 0; b < batches_.size(); ++b)
    for (const auto& p : batches_[b].proposals) {
      JudgedProposal j{&p, b};
      used_ids_.push_back(p.id);
      if (p.code) {
        j.file = (fs::path("iterations") / checkpoint_name(i) / "modules" / (p.id + ".py")).string();
        KZ_RETURN_IF_ERROR(write_run_file(run_dir_ / j.file, *p.code));
      }
      if (p.kept) {
        kept_modules_.push_back({{"id", p.id}, {"source", *p.code}, {"fingerprint", p.verdict.fingerprint}});
        Task task{p.id, *p.code, j.file, config_.level, {}};
        for (const auto& api : batches_[b].apis) task.ops.push_back(api.name);
        modules.push_back(std::move(task));
        module_of.push_back(judged.size());
      }
      judged.push_back(std::move(j));
    }

  // The judge: m Coder attempts per kept module; p̂ over those that reached a verdict.
  auto samples = sample_coder(i, "judge", modules, config_.judge_attempts, seconds);
  if (!samples.ok()) return samples.status();
  count_api_outcomes(*samples, modules);
  std::vector<int> correct(modules.size(), 0), counted(modules.size(), 0);
  for (const auto& s : *samples) {
    KZ_RETURN_IF_ERROR(log_kernel(i, "judge", modules[s.task], s, std::nullopt, std::nullopt));
    auto v = sample_verdict(s.verdict);
    if (rl::is_dropped(v)) continue;
    ++counted[s.task];
    correct[s.task] += static_cast<int>(rl::correctness(v));
  }
  for (size_t t = 0; t < modules.size(); ++t) {
    JudgedProposal& j = judged[module_of[t]];
    j.attempts = counted[t];
    if (counted[t] > 0) j.pass_rate = static_cast<double>(correct[t]) / counted[t];
  }
  return judged;
}

// Rank 0's proposals (or its error) on every rank, so that each judges and trains on the same
// modules. A world of one: as they are.
Result<std::vector<ProposalBatch>> Evolution::share_proposals(Result<std::vector<ProposalBatch>> batches) {
  if (!world_.distributed()) return batches;
  std::string message;
  if (world_.is_main())
    message = to_bytes(batches.ok() ? json{{"batches", proposal_batches_json(*batches)}}
                                    : json{{"error", batches.status().to_string()}});
  auto all = group_->all_gather(message);
  if (!all.ok()) return all.status().with_context(fmt::format("rank {}: sharing rank 0's proposals", world_.rank));
  if (world_.is_main()) return batches;
  auto got = from_bytes((*all)[0], "rank 0's proposals");
  if (!got.ok()) return got.status();
  if (got->contains("error"))
    return internal_error(fmt::format("rank 0's proposer phase failed: {}", (*got)["error"].dump()));
  return proposal_batches_from_json(got->value("batches", json::array()));
}

// Rewards (rl/proposer_reward.h) over each API set's replies: the repetition penalty among that
// set's valid modules, the advantages normalised within the set (the Proposer's GRPO group); then
// one update. A module the judge could not measure (every attempt an infra_error) gets no reward; a
// duplicate of a module kept earlier is valid but adds nothing: 0.
Result<std::optional<rl::PolicyUpdateStats>> Evolution::update_proposer(std::vector<JudgedProposal>& judged,
                                                                        StageSeconds& seconds) {
  for (size_t b = 0; b < batches_.size(); ++b) {
    std::vector<rl::ProposedModule> rewarded;
    std::vector<size_t> index_of;
    for (size_t k = 0; k < judged.size(); ++k) {
      const JudgedProposal& j = judged[k];
      if (j.batch != b) continue;
      if (j.proposal->failed_check == "duplicate") {
        judged[k].reward = 0.0;
        continue;
      }
      if (j.proposal->kept && !j.pass_rate) continue;
      rewarded.push_back({j.proposal->kept, j.pass_rate.value_or(0), j.proposal->verdict.fingerprint,
                          j.proposal->code.value_or("")});
      index_of.push_back(k);
    }
    auto rewards = rl::proposer_rewards(rewarded, config_.proposer_reward);
    if (!rewards.ok()) return rewards.status().with_context(fmt::format("API set {}'s rewards", b));
    for (size_t r = 0; r < rewards->size(); ++r) judged[index_of[r]].reward = (*rewards)[r].reward;
  }

  std::vector<rl::Rollout> rollouts;
  for (size_t b = 0; b < batches_.size(); ++b) {
    std::vector<size_t> members;
    std::vector<std::optional<double>> group;
    for (size_t k = 0; k < judged.size(); ++k)
      if (judged[k].batch == b) members.push_back(k), group.push_back(judged[k].reward);
    auto advantages = rl::normalize_group(group, config_.reward.epsilon, config_.reward.scale_by_std);
    for (size_t m = 0; m < members.size(); ++m) {
      JudgedProposal& j = judged[members[m]];
      j.advantage = advantages[m];
      auto tokens = Policy::token_sample(j.proposal->reply);
      if (j.advantage && tokens)
        rollouts.push_back({tokens->prompt_ids, tokens->completion_ids, tokens->logprobs, *j.advantage, {},
                            static_cast<int64_t>(b)});
    }
  }
  if (!proposer_->learns_from(rollouts)) return std::optional<rl::PolicyUpdateStats>();
  auto started = Clock::now();
  auto stats = proposer_->update(std::move(rollouts));
  seconds.train += seconds_since(started);
  if (!stats.ok()) return stats.status();
  return std::optional<rl::PolicyUpdateStats>(std::move(*stats));
}

// ---- 2. Frontier -------------------------------------------------------------------------------

Status Evolution::offer_to_frontier(std::vector<JudgedProposal>& judged) {
  for (auto& j : judged) {
    if (!j.proposal->kept || !j.pass_rate) continue;
    curriculum::FrontierTask task{j.proposal->id, *j.proposal->code, {}, *j.pass_rate, j.attempts};
    for (const auto& api : batches_[j.batch].apis) task.apis.push_back(api.name);
    auto offer = frontier_->offer(std::move(task));
    if (!offer.ok()) return offer.status().with_context("module " + j.proposal->id);
    j.frontier = offer->reason;
  }
  return Status::ok();
}

// ---- 3. Coder phase ----------------------------------------------------------------------------

Status Evolution::coder_phase(int64_t i) {
  StageSeconds seconds;
  std::vector<Task> tasks = config_.curriculum == "static" ? static_tasks_for(i) : frontier_tasks();
  auto samples = sample_coder(i, "coder", tasks, config_.group_size, seconds);
  if (!samples.ok()) return samples.status().with_context(fmt::format("iteration {}, coder phase", i));
  count_api_outcomes(*samples, tasks);

  // CA-GRPO: one group per task, its gate ρ remembered across visits (gate_ema).
  std::vector<std::vector<const CoderSample*>> members(tasks.size());
  for (const auto& s : *samples) members[s.task].push_back(&s);
  std::vector<rl::GroupResult> groups;
  std::vector<rl::Rollout> rollouts;
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<rl::SampleVerdict> verdicts;
    for (const CoderSample* s : members[t]) verdicts.push_back(sample_verdict(s->verdict));
    groups.push_back(gates_.visit(tasks[t].id, verdicts, config_.reward));
    for (size_t k = 0; k < members[t].size(); ++k) {
      const CoderSample& s = *members[t][k];
      auto advantage = groups.back().advantages[k];
      KZ_RETURN_IF_ERROR(log_kernel(i, "coder", tasks[t], s, groups.back().rewards[k], advantage));
      auto tokens = Policy::token_sample(s.completion);
      if (advantage && tokens)
        rollouts.push_back({tokens->prompt_ids, tokens->completion_ids, tokens->logprobs, *advantage, {},
                            static_cast<int64_t>(t)});
    }
  }
  std::optional<rl::PolicyUpdateStats> update;
  if (coder_->learns_from(rollouts)) {
    auto started = Clock::now();
    auto stats = coder_->update(std::move(rollouts));
    seconds.train += seconds_since(started);
    if (!stats.ok()) return stats.status().with_context(fmt::format("iteration {}, coder update", i));
    update = std::move(*stats);
  }
  json row = update_json(update);
  row.update(rl::to_json(rl::summarize(groups)));
  row["samples"] = samples->size();
  row["tasks"] = tasks.size();
  return log_metrics(i, "coder", std::move(row), seconds);
}

// The Coder's `attempts` samples of every task (one request per task, seeded by the iteration,
// the phase and the task), their code extracted and written under the iteration's dir, and every
// sample with code evaluated; a reply without code is a format_error, a failed request an
// infra_error for each of its samples (no reward). Data parallel: rank r samples and evaluates
// tasks r, r + W, ... (a task's whole group on one rank, seeded by the task's index, so its
// samples do not depend on the world size), then every rank receives the others' samples.
Result<std::vector<CoderSample>> Evolution::sample_coder(int64_t i, const std::string& phase,
                                                         const std::vector<Task>& tasks, int attempts,
                                                         StageSeconds& seconds, std::optional<double> temperature) {
  if (tasks.empty()) return std::vector<CoderSample>();
  fs::path dir = iteration_dir(i);
  std::vector<GenerationRequest> requests;  // this rank's tasks'
  std::vector<size_t> request_task;
  std::vector<std::string> prompt_hashes;
  for (size_t t = 0; t < tasks.size(); ++t) {
    auto messages = build_messages(coder_prompt_, {{"reference_source", tasks[t].source}});
    if (!messages.ok()) return messages.status().with_context("task " + tasks[t].id);
    json prompt = json::array();
    for (const auto& m : *messages) prompt.push_back({{"role", m.role}, {"content", m.content}});
    std::string hash = content_hash({dump(prompt)});
    KZ_RETURN_IF_ERROR(write_run_file(dir / "prompts" / (hash + ".json"), dump(prompt) + "\n"));
    prompt_hashes.push_back(hash);
    if (!mine(t)) continue;
    GenerationRequest request;
    request.id = fmt::format("{}/{}", phase, tasks[t].id);
    request.messages = std::move(*messages);
    request.params.n = attempts;
    request.params.temperature = temperature.value_or(config_.coder.temperature);
    request.params.top_p = config_.coder.top_p;
    request.params.max_tokens = config_.coder.max_tokens;
    request.params.seed = derive_seed(config_.seed, i, phase, t);
    request.params.logprobs = coder_->trainable();
    requests.push_back(std::move(request));
    request_task.push_back(t);
  }
  out_ << fmt::format("{}: generating {} x {} samples with {}{}\n", phase, tasks.size(), attempts, coder_->describe(),
                      world_.distributed() ? fmt::format(" ({} ranks)", world_.size) : "");
  // generation_batch tasks per generate() call; each batch is evaluated while the next one is
  // generated (one evaluation batch at a time). Sized up front: the evaluating thread writes into it.
  std::vector<CoderSample> samples(tasks.size() * attempts);
  const size_t batch = config_.generation_batch > 0 ? static_cast<size_t>(config_.generation_batch) : requests.size();
  const fs::path results_path = dir / (phase + "-results.jsonl");
  std::future<Status> evaluating;
  for (size_t first = 0; first < requests.size(); first += batch) {
    const size_t last = std::min(requests.size(), first + batch);
    auto started = Clock::now();
    auto results = coder_->generator().generate({requests.begin() + first, requests.begin() + last});
    seconds.generate += seconds_since(started);
    std::vector<SuiteEntry> entries;
    std::vector<size_t> entry_sample;
    for (size_t r = first; r < last; ++r)
      for (int k = 0; k < attempts; ++k) {
        const size_t t = request_task[r], index = t * attempts + k;
        samples[index].prompt_hash = prompt_hashes[t];
        auto entry = take_sample(i, phase, tasks[t], t, k, results[r - first], samples[index]);
        if (!entry.ok()) return entry.status();
        if (*entry) entries.push_back(std::move(**entry)), entry_sample.push_back(index);
      }
    if (evaluating.valid()) KZ_RETURN_IF_ERROR(evaluating.get());
    if (entries.empty()) continue;
    evaluating = std::async(std::launch::async, [&, entries = std::move(entries),
                                                 entry_sample = std::move(entry_sample)]() -> Status {
      auto started = Clock::now();
      auto verdicts = evaluate_(tasks, entries, world_.is_main() ? results_path : fs::path());
      seconds.evaluate += seconds_since(started);
      if (!verdicts.ok()) return verdicts.status();
      for (size_t e = 0; e < entries.size(); ++e) samples[entry_sample[e]].verdict = std::move((*verdicts)[e]);
      return Status::ok();
    });
  }
  if (evaluating.valid()) KZ_RETURN_IF_ERROR(evaluating.get());
  KZ_RETURN_IF_ERROR(gather_samples(phase, samples, attempts, results_path));
  for (const CoderSample& s : samples) {
    if (s.file.empty()) continue;  // no code: nothing was evaluated
    KZ_RETURN_IF_ERROR(write_run_file(run_dir_ / s.file, s.code));
    ++evaluations_;
    if (phase != "heldout") ++training_evaluations_;
  }
  return samples;
}

// Data parallel: every rank's samples of the phase on every rank, each in its place; rank 0 then
// appends the other ranks' verdicts to the phase's results (its own went there as they came). A
// world of one: nothing.
Status Evolution::gather_samples(const std::string& phase, std::vector<CoderSample>& samples, int attempts,
                                 const fs::path& results_path) {
  if (!world_.distributed()) return Status::ok();
  const auto per_task = static_cast<size_t>(attempts);
  json own = json::array();
  for (size_t index = 0; index < samples.size(); ++index)
    if (mine(index / per_task)) own.push_back(sample_json(samples[index]));
  const std::string where = fmt::format("{} phase, rank {}", phase, world_.rank);
  auto all = group_->all_gather(to_bytes(own));
  if (!all.ok()) return all.status().with_context(where + ": sharing the samples");
  for (int r = 0; r < world_.size; ++r) {
    if (r == world_.rank) continue;
    auto theirs = from_bytes((*all)[static_cast<size_t>(r)], fmt::format("rank {}'s samples", r));
    if (!theirs.ok()) return theirs.status().with_context(where);
    for (const json& j : *theirs) {
      auto s = sample_from_json(j);
      if (!s.ok()) return s.status().with_context(fmt::format("{}: rank {}'s samples", where, r));
      const size_t index = s->task * per_task + static_cast<size_t>(s->index);
      if (index >= samples.size())
        return internal_error(fmt::format("{}: rank {} sent sample {} of task {}, beyond the phase's {} samples",
                                          where, r, s->index, s->task, samples.size()));
      samples[index] = std::move(*s);
    }
  }
  if (!world_.is_main()) return Status::ok();
  for (const CoderSample& s : samples)
    if (!mine(s.task) && !s.file.empty()) KZ_RETURN_IF_ERROR(append_line(results_path, dump(to_json(s.verdict))));
  return Status::ok();
}

// Sample k of task t from its request's result: the reply, its code (written under the iteration's
// dir once the phase's samples are in), and the entry to evaluate (nullopt when there is nothing
// to run: a reply without code is a format_error, a failed request an infra_error).
Result<std::optional<SuiteEntry>> Evolution::take_sample(int64_t i, const std::string& phase, const Task& task,
                                                         size_t t, int k,
                                                         const Result<std::vector<Completion>>& result,
                                                         CoderSample& s) {
  s.task = t;
  s.index = k;
  std::string label = fmt::format("{}/{}", task.id, k);
  if (!result.ok() || k >= static_cast<int>(result->size())) {
    std::string why = result.ok() ? "the generator returned fewer samples" : result.status().message();
    s.verdict = make_verdict(EvalStatus::infra_error, {}, "generation failed: " + why);
    s.verdict.task_id = task.id;
    s.verdict.candidate = label;
    return std::optional<SuiteEntry>();
  }
  s.completion = (*result)[k];
  auto code = extract_code(s.completion.text);
  if (!code) {
    s.verdict = no_code_verdict(task, label, s.completion.finish_reason, config_.format, eval_device_);
    return std::optional<SuiteEntry>();
  }
  s.file = (fs::path("iterations") / checkpoint_name(i) / "kernels" / phase / task.id / fmt::format("{}.py", k)).string();
  s.code = *code;
  return std::optional<SuiteEntry>(SuiteEntry{t, Candidate{label, *code}});
}

// Every Coder sample that reached a verdict is evidence on the APIs of its task.
void Evolution::count_api_outcomes(const std::vector<CoderSample>& samples, const std::vector<Task>& tasks) {
  for (const auto& s : samples) {
    auto v = sample_verdict(s.verdict);
    if (rl::is_dropped(v) || tasks[s.task].ops.empty()) continue;
    (void)api_stats_->update(tasks[s.task].ops, rl::correctness(v) > 0);  // names are never empty here
  }
}

std::vector<Task> Evolution::frontier_tasks() {
  std::vector<Task> tasks;
  for (const auto& entry : frontier_->select(config_.tasks_per_iteration))
    tasks.push_back({entry.task.module_id, entry.task.source, entry.task.module_id, config_.level, entry.task.apis});
  return tasks;
}

// Iteration i's share of the static suite: the next tasks_per_iteration of its seeded order, which
// cycles, so every task comes back as often as the others (a function of i alone: resuming needs
// no state).
std::vector<Task> Evolution::static_tasks_for(int64_t i) const {
  const size_t n = static_tasks_.size(), per = std::min<size_t>(config_.tasks_per_iteration, n);
  std::vector<Task> tasks;
  for (size_t j = 0; j < per; ++j) tasks.push_back(static_tasks_[((i - 1) * per + j) % n]);
  return tasks;
}

// ---- 4. Held-out evaluation and checkpoint -----------------------------------------------------

// The Coder on the held-out suite, sampled and evaluated as in the Coder phase (its kernels in the
// provenance log), summarised and reported as `kz bench` does (heldout/iter-N/summary.json and
// report.html: pass@k, fast_p, per level).
Status Evolution::heldout(int64_t i) {
  out_ << fmt::format("heldout: {} tasks x {} samples\n", heldout_tasks_.size(), config_.heldout_samples);
  StageSeconds seconds;
  auto samples = sample_coder(i, "heldout", heldout_tasks_, config_.heldout_samples, seconds,
                              config_.heldout_temperature);
  if (!samples.ok()) return samples.status().with_context(fmt::format("iteration {}, held-out evaluation", i));
  std::vector<Verdict> verdicts;
  for (const auto& s : *samples) {
    KZ_RETURN_IF_ERROR(log_kernel(i, "heldout", heldout_tasks_[s.task], s, std::nullopt, std::nullopt));
    verdicts.push_back(s.verdict);
  }
  RunInfo info{coder_->describe(), config_.heldout_suite.string(), config_.format, eval_options_.device, now_utc(),
               config_.heldout_samples};
  json summary = bench_summary(info, heldout_tasks_, verdicts);
  fs::path dir = run_dir_ / "heldout" / checkpoint_name(i);
  KZ_RETURN_IF_ERROR(write_run_file(dir / "summary.json", summary.dump(2) + "\n"));
  KZ_RETURN_IF_ERROR(write_run_file(dir / "report.html", render_bench_html(info, summary, heldout_tasks_, verdicts)));
  const json& overall = summary["overall"];
  json row = {{"pass_at_1", overall["pass_at_k"].value("1", json())},
              {"fast_1", overall["geomean_speedup"].is_number() ? overall["fast_p"].value("1", json()) : json()},
              {"geomean_speedup", overall.value("geomean_speedup", json())},
              {"compile_rate", overall.value("compile_rate", json())},
              {"samples", verdicts.size()},
              {"tasks", heldout_tasks_.size()},
              {"report", (fs::path("heldout") / checkpoint_name(i) / "report.html").string()}};
  return log_metrics(i, "heldout", std::move(row), seconds);
}

// By rank 0: the whole run's state (every rank holds the same).
Status Evolution::checkpoint(int64_t i) {
  if (!world_.is_main()) return Status::ok();
  auto metrics_bytes = metrics_.size();
  if (!metrics_bytes.ok()) return metrics_bytes.status();
  auto provenance_bytes = provenance_.size();
  if (!provenance_bytes.ok()) return provenance_bytes.status();
  json state = {{"iteration", i},
                {"evaluations", evaluations_},
                {"training_evaluations", training_evaluations_},
                {"api_stats", api_stats_->to_json()},
                {"api_sampler", sampler_->to_json()},
                {"frontier", frontier_->to_json()},
                {"gates", gates_.to_json()},
                {"kept_modules", kept_modules_},
                {"used_ids", used_ids_},
                {"logs", {{"metrics", *metrics_bytes}, {"provenance", *provenance_bytes}}}};
  auto started = Clock::now();
  KZ_RETURN_IF_ERROR(write_checkpoint(run_dir_, i, config_.checkpoint_keep, [&](const fs::path& dir) -> Status {
    KZ_RETURN_IF_ERROR(proposer_->save(dir / "proposer"));
    if (coder_own_) KZ_RETURN_IF_ERROR(coder_own_->save(dir / "coder"));
    return write_file_atomic(dir / "state.json", state.dump(1) + "\n");
  }));
  out_ << fmt::format("checkpoint {} ({:.1f} s)\n", checkpoint_name(i), seconds_since(started));
  return write_run_info(i);
}

// ---- logs --------------------------------------------------------------------------------------

Status Evolution::log_metrics(int64_t i, const std::string& phase, json row, const StageSeconds& seconds) {
  row["iteration"] = i;
  row["phase"] = phase;
  row["frontier_size"] = frontier_->stats().size;
  row["evaluations"] = evaluations_;
  row["training_evaluations"] = training_evaluations_;
  row["seconds"] = seconds.to_json();
  row["proposer_steps"] = proposer_->steps();
  row["coder_steps"] = coder_->steps();
  auto show = [&](const char* key) {
    return row.contains(key) && row[key].is_number() ? fmt::format("{:.3f}", row[key].get<double>()) : "-";
  };
  out_ << fmt::format("iteration {} {}: reward {}  correct {}  pass@1 {}  frontier {}  kl {}  ({:.1f}/{:.1f}/{:.1f} s "
                      "generate/evaluate/train)\n",
                      i, phase, show("reward_mean"), show("correct_rate"), show("pass_at_1"),
                      row["frontier_size"].get<size_t>(), show("kl"), seconds.generate, seconds.evaluate, seconds.train);
  return world_.is_main() ? metrics_.append(dump(row)) : Status::ok();
}

// A file of the run dir (its folders made first), written atomically by rank 0; other ranks write
// nothing.
Status Evolution::write_run_file(const fs::path& path, std::string_view text) const {
  if (!world_.is_main()) return Status::ok();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return io_error(fmt::format("cannot create {}: {}", path.parent_path().string(), ec.message()));
  return write_file_atomic(path, text);
}

Status Evolution::log_module(int64_t i, const JudgedProposal& j) {
  const Proposal& p = *j.proposal;
  json apis = json::array();
  for (const auto& api : batches_[j.batch].apis) apis.push_back(api.name);
  json row = {{"kind", "module"},
              {"iteration", i},
              {"phase", "proposer"},
              {"id", p.id},
              {"apis", apis},
              {"model", proposer_->describe()},
              {"model_steps", proposer_->steps()},
              {"file", j.file.empty() ? json() : json(j.file)},
              {"status", p.kept ? "kept" : "rejected"},
              {"reason", p.reason},
              {"failed_check", p.failed_check},
              {"fingerprint", p.verdict.fingerprint},
              {"pass_rate", j.pass_rate ? json(*j.pass_rate) : json()},
              {"judge_attempts", j.attempts},
              {"reward", j.reward ? json(*j.reward) : json()},
              {"advantage", j.advantage ? json(*j.advantage) : json()},
              {"frontier", j.frontier}};
  return world_.is_main() ? provenance_.append(dump(row)) : Status::ok();
}

Status Evolution::log_kernel(int64_t i, const std::string& phase, const Task& task, const CoderSample& s,
                             std::optional<double> reward, std::optional<double> advantage) {
  json row = {{"kind", "kernel"},
              {"iteration", i},
              {"phase", phase},
              {"task_id", task.id},
              {"sample", s.index},
              {"model", coder_->describe()},
              {"model_steps", coder_->steps()},
              {"prompt", (fs::path("iterations") / checkpoint_name(i) / "prompts" / (s.prompt_hash + ".json")).string()},
              {"file", s.file.empty() ? json() : json(s.file)},
              {"status", status_name(s.verdict.status)},
              {"correct", s.verdict.correct},
              {"speedup", s.verdict.speedup ? json(*s.verdict.speedup) : json()},
              {"message", s.verdict.message.substr(0, 300)},
              {"reward", reward ? json(*reward) : json()},
              {"advantage", advantage ? json(*advantage) : json()}};
  return world_.is_main() ? provenance_.append(dump(row)) : Status::ok();
}

Status Evolution::write_run_info(int64_t iterations_done) const {
  if (!world_.is_main()) return Status::ok();
  json info = {{"proposer", proposer_->describe()},
               {"coder", coder_->describe()},
               {"format", config_.format},
               {"heldout_suite", config_.heldout_suite.string()},
               {"seed", config_.seed},
               {"reward_mode", config_.reward_mode},
               {"iterations", iterations_done},
               {"evaluations", evaluations_},
               {"updated", now_utc()}};
  return write_file_atomic(run_dir_ / "run.json", info.dump(2) + "\n");
}

// ---- opening a run -----------------------------------------------------------------------------

Result<std::unique_ptr<Evolution>> Evolution::open(const EvolveOptions& options, const dist::World& world,
                                                   std::ostream& out) {
  const fs::path& dir = options.run_dir;
  if (dir.empty()) return invalid_argument("evolve: the run dir (--out or --resume) is required");
  const fs::path saved = dir / "config.toml";
  if (options.resume && !fs::exists(saved))
    return not_found(fmt::format("{} holds no run to resume (no config.toml)", dir.string()));
  if (!options.resume && fs::exists(saved))
    return invalid_argument(fmt::format("{} already holds a run: resume it with --resume {}, or give another --out",
                                        dir.string(), dir.string()));
  // A resumed run reads the configs it started with, never the original files again.
  if (options.resume && !options.overrides.empty())
    return invalid_argument("a resumed run keeps the config it started with: --set is for a new run");
  auto config = options.resume ? load_evolve_config(saved) : load_evolve_config(options.config_path, options.overrides);
  if (!config.ok()) return config.status();
  std::unique_ptr<Evolution> run(new Evolution(std::move(*config), dir, out, world));
  run->prompts_dir_ = run->config_.prompts_dir.empty() ? options.default_prompts_dir : run->config_.prompts_dir;

  // A new run's evaluation options come from its config; a resumed one's from the run dir.
  if (options.resume) {
    KZ_RETURN_IF_ERROR(apply_toml_file(dir / "eval.toml", run->eval_options_));
  } else {
    if (!run->config_.eval_config.empty())
      KZ_RETURN_IF_ERROR(apply_toml_file(run->config_.eval_config, run->eval_options_));
    run->eval_options_.device = run->config_.eval_device;
  }
  // Joining the ranks also waits for every rank's checks above, before rank 0 writes the run dir.
  KZ_RETURN_IF_ERROR(run->open_process_group());
  KZ_RETURN_IF_ERROR(run->open_engine());
  KZ_RETURN_IF_ERROR(run->open_models());
  // Written once everything opened: a config whose models fail to load leaves no run behind.
  if (!options.resume && world.is_main()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return io_error(fmt::format("cannot create the run dir {}: {}", dir.string(), ec.message()));
    KZ_RETURN_IF_ERROR(write_file_atomic(dir / "eval.toml", to_toml(run->eval_options_)));
    KZ_RETURN_IF_ERROR(write_file_atomic(saved, evolve_config_to_toml(run->config_)));
  }

  auto checkpoint = latest_checkpoint(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  if (*checkpoint) KZ_RETURN_IF_ERROR(run->restore(**checkpoint));
  else KZ_RETURN_IF_ERROR(run->start_fresh());
  // Every rank restored the same checkpoint (or started from the same models); the trainable
  // roles' gradients are averaged over the ranks from here on.
  KZ_RETURN_IF_ERROR(run->proposer_->make_data_parallel(run->group_));
  if (run->coder_own_) KZ_RETURN_IF_ERROR(run->coder_own_->make_data_parallel(run->group_));
  if (world.distributed())
    out << fmt::format("data parallel: {} ranks over {}; each samples and evaluates its share of every phase's "
                       "tasks, rank 0 proposes and writes the run dir\n",
                       world.size, run->group_->backend_name());
  return run;
}

// The ranks' process group, on the trained roles' device (each rank's own GPU, or the CPU): the
// trained roles must share one kind of device. A world of one: a group without a backend.
Status Evolution::open_process_group() {
  std::vector<std::pair<std::string, std::string>> trained;  // (section, configured device)
  if (config_.proposer.policy.trainable) trained.push_back({"[proposer]", config_.proposer.policy.device});
  if (!config_.shared_policy && config_.coder.policy.trainable)
    trained.push_back({"[coder]", config_.coder.policy.device});
  const std::string device = trained.empty() ? "cpu" : dist::rank_device(trained.front().second, world_);
  for (const auto& [section, configured] : trained)
    if (dist::rank_device(configured, world_).starts_with("cuda") != device.starts_with("cuda"))
      return invalid_argument(fmt::format("data parallel: {} device \"{}\" and {} device \"{}\" must both be CPU or "
                                          "both CUDA (one process group)",
                                          trained.front().first, trained.front().second, section, configured));
  try {
    auto group = dist::ProcessGroup::connect(world_, at::Device(device));
    if (!group.ok()) return group.status();
    group_ = std::move(*group);
  } catch (const std::exception& e) {
    return invalid_argument(fmt::format("data parallel: device \"{}\": {}", device, e.what()));
  }
  return Status::ok();
}

// The evaluator, the held-out tasks, the API catalogue and the Coder's prompt.
Status Evolution::open_engine() {
  int jobs = config_.eval_jobs > 0 ? config_.eval_jobs : default_jobs(eval_options_);
  // Every core is the CPU's default; the ranks of a host share them.
  if (config_.eval_jobs <= 0 && eval_options_.device == "cpu") jobs = std::max(1, jobs / world_.local_size);
  set_gpu_memory_processes(eval_options_, jobs);
  KZ_RETURN_IF_ERROR(eval_options_.validate());
  // Each rank evaluates on its own GPU's pool; the run's eval.toml keeps the configured device.
  EvalOptions on_this_rank = eval_options_;
  on_this_rank.device = eval_device_ = dist::rank_device(eval_options_.device, world_);
  auto evaluator = Evaluator::create(on_this_rank);
  if (!evaluator.ok()) return evaluator.status().with_context("evaluator");
  evaluator_.emplace(std::move(*evaluator));
  auto format = evaluator_->with_format(config_.format);
  if (!format.ok()) return format.status();
  evaluator_.emplace(std::move(*format));
  KZ_RETURN_IF_ERROR(open_evaluation(jobs));

  auto tasks = load_tasks(config_.heldout_suite);
  if (!tasks.ok()) return tasks.status().with_context("[heldout] suite");
  heldout_tasks_ = std::move(*tasks);
  if (config_.heldout_tasks > 0 && heldout_tasks_.size() > static_cast<size_t>(config_.heldout_tasks))
    heldout_tasks_.resize(config_.heldout_tasks);
  if (config_.curriculum == "static") KZ_RETURN_IF_ERROR(load_static_tasks());

  auto catalogue = load_api_catalogue(config_.catalogue.empty() ? default_api_catalogue_path() : config_.catalogue);
  if (!catalogue.ok()) return catalogue.status();
  catalogue_ = std::move(*catalogue);
  if (!config_.apis.empty()) {
    auto chosen = find_apis(catalogue_, config_.apis);
    if (!chosen.ok()) return chosen.status().with_context("[run] apis");
    catalogue_ = std::move(*chosen);
  }

  auto prompt_path = coder_prompt_path(prompts_dir_, config_.format);
  if (!prompt_path.ok()) return prompt_path.status();
  auto prompt = load_prompt_template(*prompt_path);
  if (!prompt.ok()) return prompt.status();
  coder_prompt_ = std::move(*prompt);
  return Status::ok();
}

Status Evolution::load_static_tasks() {
  auto tasks = load_tasks(config_.static_suite);
  if (!tasks.ok()) return tasks.status().with_context("[coder] static_suite");
  if (tasks->empty()) return invalid_argument(fmt::format("[coder] static_suite {} holds no task", config_.static_suite.string()));
  static_tasks_ = std::move(*tasks);
  std::mt19937_64 order(config_.seed + 202);
  std::shuffle(static_tasks_.begin(), static_tasks_.end(), order);
  return Status::ok();
}

// Where the Coder's samples go: the evaluator's worker pool here, or a kz serve-eval ([eval] url).
Status Evolution::open_evaluation(int jobs) {
  if (config_.eval_url.empty()) {
    evaluate_ = [this, jobs](const std::vector<Task>& tasks, const std::vector<SuiteEntry>& entries,
                             const fs::path& results) {
      return run_suite(*evaluator_, tasks, entries, SuiteRunOptions{jobs, cpu_cores(), results, {}}, out_);
    };
    return Status::ok();
  }
#ifdef KZ_LOOP_WITH_SERVICE
  auto where = parse_service_url(config_.eval_url);
  if (!where.ok()) return where.status();
  auto client = std::make_shared<ServiceClient>(where->first, where->second, std::chrono::seconds(600));
  auto health = client->health();
  if (!health.ok()) return health.status().with_context("[eval] url");
  evaluate_ = [client, format = config_.format](const std::vector<Task>& tasks, const std::vector<SuiteEntry>& entries,
                                                 const fs::path& results) {
    return evaluate_remotely(*client, format, tasks, entries, results);
  };
  return Status::ok();
#else
  return invalid_argument("[eval] url: this kz was built without the evaluation service's client (cpp-httplib)");
#endif
}

// The roles' models and the Proposer's pipeline over its generator.
Status Evolution::open_models() {
  auto open_role = [&](RoleConfig& role, std::string_view name) {
    role.policy.update.shuffle_seed = derive_seed(config_.seed, 0, name);
    PolicyOptions on_this_rank = role.policy;  // the run's config.toml keeps the configured device
    on_this_rank.device = dist::rank_device(role.policy.device, world_);
    on_this_rank.update.loss.temperature = role.temperature;  // the distribution its samples come from
    return Policy::open(on_this_rank);
  };
  auto proposer = open_role(config_.proposer, "proposer");
  if (!proposer.ok()) return proposer.status().with_context("[proposer]");
  proposer_ = std::move(*proposer);
  if (config_.shared_policy) {
    coder_ = proposer_.get();
  } else {
    auto coder = open_role(config_.coder, "coder");
    if (!coder.ok()) return coder.status().with_context("[coder]");
    coder_own_ = std::move(*coder);
    coder_ = coder_own_.get();
  }
  out_ << fmt::format("proposer: {}\ncoder: {}\n", proposer_->describe(),
                      config_.shared_policy ? "the proposer's model" : coder_->describe());

  ProposerOptions options;
  options.n = config_.modules_per_set;
  options.level = config_.level;
  options.temperature = config_.proposer.temperature;
  options.max_tokens = config_.proposer.max_tokens;
  options.prompts_dir = prompts_dir_;
  options.logprobs = proposer_->trainable();
  options.validation.device = eval_device_;
  options.validation.dedup_threshold = config_.dedup_threshold;
  options.validation.worker = eval_options_.worker;
  options.validation.tuning = eval_options_.tuning;
  options.validation.sandbox = eval_options_.sandbox;
  options.jobs = config_.eval_jobs;
  auto pipeline = ProposerPipeline::create(proposer_->generator(), options);
  if (!pipeline.ok()) return pipeline.status().with_context("[proposer]");
  pipeline_.emplace(std::move(*pipeline));
  return Status::ok();
}

Status Evolution::start_fresh() {
  // A run killed before its first checkpoint starts over: its logs hold nothing a checkpoint counts.
  std::error_code ignored;
  if (world_.is_main()) {
    fs::remove(metrics_.path(), ignored);
    fs::remove(provenance_.path(), ignored);
  }
  auto stats = curriculum::ApiStats::create(config_.api_stats);
  if (!stats.ok()) return stats.status();
  api_stats_.emplace(std::move(*stats));
  auto sampler = curriculum::ApiSampler::create(catalogue_, config_.api_sampler);
  if (!sampler.ok()) return sampler.status().with_context("[api_sampler]");
  sampler_.emplace(std::move(*sampler));
  auto frontier = curriculum::FrontierBuffer::create(config_.frontier);
  if (!frontier.ok()) return frontier.status().with_context("[frontier]");
  frontier_.emplace(std::move(*frontier));
  frontier_->add_held_out(heldout_tasks_);
  return write_run_info(0);
}

// The loop's state and the models of `dir`; the logs cut back to what the checkpoint counted.
Status Evolution::restore(const fs::path& dir) {
  auto text = read_file(dir / "state.json");
  if (!text.ok()) return text.status();
  json state = json::parse(*text, nullptr, false);
  if (state.is_discarded() || !state.is_object()) return parse_error((dir / "state.json").string() + ": not a JSON object");
  auto context = [&](const Status& s) { return s.with_context((dir / "state.json").string()); };
  try {
    iterations_done_ = state.at("iteration").get<int64_t>();
    evaluations_ = state.at("evaluations").get<int64_t>();
    training_evaluations_ = state.at("training_evaluations").get<int64_t>();
    kept_modules_ = state.at("kept_modules");
    used_ids_ = state.at("used_ids");
    auto stats = curriculum::ApiStats::from_json(state.at("api_stats"));
    if (!stats.ok()) return context(stats.status());
    api_stats_.emplace(std::move(*stats));
    auto sampler = curriculum::ApiSampler::from_json(state.at("api_sampler"), catalogue_, config_.api_sampler);
    if (!sampler.ok()) return context(sampler.status());
    sampler_.emplace(std::move(*sampler));
    auto frontier = curriculum::FrontierBuffer::from_json(state.at("frontier"), config_.frontier);
    if (!frontier.ok()) return context(frontier.status());
    frontier_.emplace(std::move(*frontier));
    frontier_->add_held_out(heldout_tasks_);
    auto gates = rl::GateMemory::from_json(state.at("gates"));
    if (!gates.ok()) return context(gates.status());
    gates_ = std::move(*gates);
    for (const auto& m : kept_modules_)
      pipeline_->add_kept(m.at("id").get<std::string>(), m.at("source").get<std::string>(),
                          m.at("fingerprint").get<std::string>());
    for (const auto& id : used_ids_) pipeline_->reserve_id(id.get<std::string>());
    if (world_.is_main()) {
      KZ_RETURN_IF_ERROR(metrics_.truncate_to(state.at("logs").at("metrics").get<uint64_t>()));
      KZ_RETURN_IF_ERROR(provenance_.truncate_to(state.at("logs").at("provenance").get<uint64_t>()));
    }
  } catch (const json::exception& e) {
    return parse_error(fmt::format("{}: {}", (dir / "state.json").string(), e.what()));
  }
  KZ_RETURN_IF_ERROR(proposer_->restore(dir / "proposer"));
  if (coder_own_) KZ_RETURN_IF_ERROR(coder_own_->restore(dir / "coder"));
  out_ << fmt::format("resumed from {} (iteration {})\n", dir.string(), iterations_done_);
  return Status::ok();
}

Result<EvolveResult> Evolution::run(std::optional<int64_t> wanted) {
  const int64_t target = wanted.value_or(config_.iterations);
  if (target < 1) return invalid_argument(fmt::format("--iterations must be at least 1, got {}", target));
  EvolveResult result;
  int64_t first = iterations_done_ + 1;
  if (first > target)
    out_ << fmt::format("the run has done {} iterations already (asked for {})\n", iterations_done_, target);
  // Where training starts from, measured as every later held-out point is (heldout/iter-000000).
  // A run killed before its first checkpoint starts over, and measures it again.
  if (first == 1 && first <= target && config_.heldout_at_start) KZ_RETURN_IF_ERROR(heldout(0));
  for (int64_t i = first; i <= target && !budget_spent(); ++i) {
    KZ_RETURN_IF_ERROR(run_iteration(i, target));
    ++result.iterations_run;
  }
  if (budget_spent())
    out_ << fmt::format("the training budget is spent: {} evaluations of {} ([run] max_evaluations)\n",
                        training_evaluations_, config_.max_evaluations);
  result.iterations_done = iterations_done_;
  return result;
}

}  // namespace

Result<EvolveResult> run_evolve(const EvolveOptions& options, std::ostream& progress) {
  auto world = dist::current_world();
  if (!world.ok()) return world.status();
  std::ostream silent(nullptr);  // ranks other than 0 print nothing; their errors still come back
  auto evolution = Evolution::open(options, *world, world->is_main() ? progress : silent);
  auto result = evolution.ok() ? (*evolution)->run(options.iterations) : Result<EvolveResult>(evolution.status());
  if (!result.ok() && world->distributed())
    return result.status().with_context(fmt::format("rank {} of {}", world->rank, world->size));
  return result;
}

}  // namespace kz::loop
