// The Proposer's pipeline (kz/curriculum/proposer.h): prompt, generate, extract, validate, decide.
#include "kz/curriculum/proposer.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "kz/core/hash.h"
#include "kz/core/parallel.h"
#include "kz/eval/options.h"
#include "kz/llm/extract.h"

namespace kz {
namespace fs = std::filesystem;

Status ProposerOptions::validate() const {
  if (n < 1) return invalid_argument(fmt::format("proposer n must be >= 1, got {}", n));
  if (temperature < 0) return invalid_argument(fmt::format("proposer temperature must be >= 0, got {}", temperature));
  if (max_tokens < 1) return invalid_argument(fmt::format("proposer max_tokens must be >= 1, got {}", max_tokens));
  if (prompts_dir.empty()) return invalid_argument("proposer prompts_dir is empty");
  return validation.validate();
}

ProposerPipeline::ProposerPipeline(Generator& generator, ProposerOptions options, PromptTemplate prompt)
    : generator_(&generator),
      options_(std::move(options)),
      prompt_(std::move(prompt)),
      index_(options_.validation.dedup_threshold) {}

Result<ProposerPipeline> ProposerPipeline::create(Generator& generator, ProposerOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  auto prompt = load_prompt_template(options.prompts_dir / "proposer.toml");
  if (!prompt.ok()) return prompt.status();
  ProposerPipeline pipeline(generator, std::move(options), std::move(*prompt));
  // A template that cannot render (an unknown placeholder) fails here, not after a call began.
  ApiEntry probe_api;
  probe_api.name = "torch.add";
  auto probe = pipeline.messages_for({probe_api});
  if (!probe.ok()) return probe.status();
  return pipeline;
}

Result<std::vector<ChatMessage>> proposer_messages(const PromptTemplate& prompt, const std::vector<std::string>& api_names,
                                                   int level) {
  std::string list;
  for (const auto& name : api_names) list += (list.empty() ? "- " : "\n- ") + name;
  return build_messages(prompt, {{"apis", list}, {"level", std::to_string(level)}});
}

Result<std::vector<ChatMessage>> ProposerPipeline::messages_for(const std::vector<ApiEntry>& apis) const {
  std::vector<std::string> names;
  for (const auto& api : apis) names.push_back(api.name);
  return proposer_messages(prompt_, names, options_.level);
}

// A stable id from the content; a clash with an id already used (the same code twice) gets a suffix.
std::string ProposerPipeline::unique_id(const std::string& content, std::set<std::string>& ids) const {
  std::string base = "prop-" + content_hash({content}).substr(0, 12);
  std::string id = base;
  for (int k = 2; ids.count(id); ++k) id = fmt::format("{}-{}", base, k);
  ids.insert(id);
  return id;
}

int ProposerPipeline::jobs_for(size_t replies) const {
  if (options_.jobs > 0) return options_.jobs;
  // On a GPU, validations share it through the GPU lock (their time bands run alone), as
  // evaluations do: as many at once as [tuning] gpu_jobs, capped by the cores.
  if (options_.validation.device != "cpu") return std::min(TuningOptions{}.gpu_jobs, cpu_cores());
  return std::clamp(cpu_cores(), 1, std::max(1, static_cast<int>(replies)));
}

void ProposerPipeline::add_kept(const std::string& id, const std::string& source, const std::string& fingerprint) {
  ids_.insert(id);
  index_.add(id, source, fingerprint);
}

void ProposerPipeline::reserve_id(const std::string& id) { ids_.insert(id); }

Result<std::vector<ProposalBatch>> ProposerPipeline::propose(const std::vector<std::vector<ApiEntry>>& api_sets,
                                                             const ProposerProgress& progress) {
  // 1. Prompt: one request per API set.
  std::vector<GenerationRequest> requests;
  for (size_t s = 0; s < api_sets.size(); ++s) {
    if (api_sets[s].empty()) return invalid_argument(fmt::format("API set {} is empty", s));
    auto messages = messages_for(api_sets[s]);
    if (!messages.ok()) return messages.status();
    GenerationRequest request;
    request.id = api_sets.size() == 1 ? "propose" : fmt::format("propose-{}", s);
    request.messages = std::move(*messages);
    request.params.n = options_.n;
    request.params.temperature = options_.temperature;
    request.params.max_tokens = options_.max_tokens;
    request.params.seed = options_.seed;
    request.params.logprobs = options_.logprobs;
    requests.push_back(std::move(request));
  }
  if (requests.empty()) return std::vector<ProposalBatch>{};

  // 2. Generate.
  auto results = generator_->generate(requests);
  if (results.size() != requests.size())
    return internal_error(fmt::format("the generator returned {} results for {} requests", results.size(),
                                      requests.size()));

  // 3. Extract, and name each reply (ids are committed only when the call succeeds).
  std::set<std::string> ids = ids_;
  std::vector<ProposalBatch> batches(api_sets.size());
  std::vector<Proposal*> all;
  for (size_t s = 0; s < api_sets.size(); ++s) {
    if (!results[s].ok())
      return results[s].status().with_context("generating proposals with " + generator_->describe());
    batches[s].apis = api_sets[s];
    for (const auto& reply : *results[s]) {
      Proposal p;
      p.code = extract_code(reply.text);
      p.id = unique_id(p.code.value_or(reply.text), ids);
      p.reply = reply;
      batches[s].proposals.push_back(std::move(p));
    }
  }
  std::vector<const std::vector<ApiEntry>*> apis_of;
  for (auto& batch : batches)
    for (auto& p : batch.proposals) {
      all.push_back(&p);
      apis_of.push_back(&batch.apis);
    }

  // 4. Validate every proposal that has code, `jobs` worker processes at a time. A failure to run
  // the worker is kept per module and reported after all ran.
  std::vector<Status> errors(all.size());
  std::mutex progress_mutex;
  size_t done = 0;
  if (progress) progress(0, all.size(), "");
  parallel_for(all.size(), jobs_for(all.size()), [&](size_t i) {
    Proposal& p = *all[i];
    if (p.code) {
      auto verdict = validate_module(*p.code, *apis_of[i], options_.validation);
      if (verdict.ok()) p.verdict = std::move(*verdict);
      else errors[i] = verdict.status().with_context("module " + p.id);
    }
    std::lock_guard lock(progress_mutex);
    ++done;
    if (progress) progress(done, all.size(), p.id);
    return Status::ok();
  });
  for (const auto& error : errors) KZ_RETURN_IF_ERROR(error);

  // 5. Decide, in order: no code, invalid, duplicate of a kept module, or kept (and indexed).
  for (Proposal* p : all) {
    if (!p->code) {
      p->failed_check = "no_code";
      p->reason = "no_code: the reply holds no code block";
    } else if (!p->verdict.valid) {
      p->failed_check = p->verdict.failed_check.empty() ? "invalid" : p->verdict.failed_check;
      p->reason = p->verdict.reason;
    } else if (auto match = index_.match(*p->code, p->verdict.fingerprint)) {
      p->failed_check = "duplicate";
      p->reason = match->same_fingerprint
                      ? fmt::format("duplicate: same ATen ops and output shapes as {}", match->id)
                      : fmt::format("duplicate: {:.0f}% similar to {} (normalised source)", 100 * match->similarity,
                                    match->id);
    } else {
      p->kept = true;
      p->reason = "valid";
      index_.add(p->id, *p->code, p->verdict.fingerprint);
    }
  }
  ids_ = std::move(ids);
  return batches;
}

nlohmann::json ProposerPipeline::to_row(const Proposal& p, const ProposalBatch& batch, const std::string& model) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& api : batch.apis) ops.push_back(api.name);
  nlohmann::json runtime = p.verdict.runtime_ms > 0 ? nlohmann::json(p.verdict.runtime_ms) : nlohmann::json();
  return {{"id", p.id},
          {"py_code", p.code.value_or("")},
          {"ops", ops},
          {"level", options_.level},
          {"status", p.kept ? "kept" : "rejected"},
          {"reason", p.reason},
          {"failed_check", p.kept ? "" : p.failed_check},
          {"aten_ops", p.verdict.aten_ops},
          {"fingerprint", p.verdict.fingerprint},
          {"runtime_ms", runtime},
          {"model", model}};
}

}  // namespace kz
