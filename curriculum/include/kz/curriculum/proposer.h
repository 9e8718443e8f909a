// The Proposer's pipeline: API sets -> prompt -> generate -> extract -> validate -> dedup -> decision.
//
// For each API set the model is asked (one request, n completions) for KernelBench-format modules
// that use those APIs (prompts_dir/proposer.toml, {apis} and {level}); each reply's code block is
// extracted, validated in a worker (kz/curriculum/validation.h, `jobs` at a time over every reply
// of the call) and checked against the modules kept so far (kz/curriculum/dedup.h). Decisions are
// made in order, API set by API set, reply by reply: no code, invalid, duplicate of a kept module,
// or kept (and indexed, so a later reply, or a later call, duplicates it).
//
// The pipeline keeps its dedup index and the ids it has used across calls: a co-evolution loop
// holds one pipeline for its whole run; `kz propose` (cli/cmd_propose.cpp) feeds it the rows of
// earlier runs through reserve_id/add_kept, and appends to_row's rows to its JSONL file.
// Model backends enter through kz/llm/generator.h (the HTTP client or the in-process engine).
// The pipeline prints nothing; progress goes to the caller's callback.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/curriculum/dedup.h"
#include "kz/curriculum/validation.h"
#include "kz/llm/generator.h"
#include "kz/llm/prompt.h"
#include "kz/task/catalogue.h"

namespace kz {

struct ProposerOptions {
  int n = 8;                         // modules asked for per API set (completions per request); >= 1
  int level = 1;                     // KernelBench level named in the prompt (1, 2 or 3 by convention)
  double temperature = 0.8;          // sampling temperature; >= 0 (0: greedy)
  int max_tokens = 4096;             // new tokens per reply; >= 1
  // The generation seed, where the backend supports one; nullopt: none sent. Every API set's
  // request gets the same seed.
  std::optional<uint64_t> seed;
  // Ask the backend for per-token log-probs: a trained Proposer's update needs them with the
  // reply's token ids (Proposal::reply).
  bool logprobs = false;
  // Folder holding proposer.toml (the prompt template). Default: "prompts" (relative to the
  // working directory); `kz propose` passes the source tree's prompts/.
  std::filesystem::path prompts_dir = "prompts";
  // How each module is validated (device, time band, deadlines, worker, sandbox) and the dedup
  // threshold (validation.dedup_threshold).
  ModuleValidationOptions validation;
  // Validations at once; <= 0: the default: on a GPU [tuning] gpu_jobs (they share it through the
  // GPU lock), capped by the cores; on the CPU the cores, capped by the replies of the call.
  int jobs = 0;

  Status validate() const;
};

// One reply of the model and what became of it.
struct Proposal {
  std::string id;                    // "prop-<12 hex of the code's hash>", "-2", "-3"... on a clash
  std::optional<std::string> code;   // nullopt: the reply held no code block
  ModuleVerdict verdict;             // default (invalid, empty) when there was no code
  bool kept = false;
  std::string reason;                // why rejected ("valid" for kept)
  // The reason's category: no_code, duplicate, or the validation's failed_check (loads, runs,
  // apis, ...; "invalid" when it named none). Empty when kept.
  std::string failed_check;
  Completion reply;                  // the model's reply itself (text, token ids, log-probs)
};

// The replies to one API set, in reply order.
struct ProposalBatch {
  std::vector<ApiEntry> apis;
  std::vector<Proposal> proposals;
};

// Progress of the validation phase: called once with done = 0 (id empty) when it starts, then
// once per validated reply (done = 1..total, id of that reply). Calls are serialised (never two at
// once) but may come from worker threads.
using ProposerProgress = std::function<void(size_t done, size_t total, const std::string& id)>;

class ProposerPipeline {
 public:
  // Validates the options and loads the prompt template; `generator` must outlive the pipeline.
  static Result<ProposerPipeline> create(Generator& generator, ProposerOptions options);

  // One request per API set (sent together: the backend may run them concurrently), then
  // extraction, validation and decisions as the header says. A batch per API set, in order. An
  // empty API set, a failed request or a validation that could not run (the worker, not the
  // module) fails the whole call with the set's or module's context; the dedup index and the used
  // ids then keep only what earlier calls added.
  Result<std::vector<ProposalBatch>> propose(const std::vector<std::vector<ApiEntry>>& api_sets,
                                             const ProposerProgress& progress = {});

  // The generation seed of the next propose() calls (a loop gives each iteration its own).
  void set_seed(std::optional<uint64_t> seed) { options_.seed = seed; }

  // A module kept earlier (an earlier run, another pipeline): later proposals that duplicate it
  // are rejected, and its id is not given again.
  void add_kept(const std::string& id, const std::string& source, const std::string& fingerprint);
  // An id used earlier (a rejected row): not given again.
  void reserve_id(const std::string& id);

  // The JSONL row of one proposal: id, py_code, ops, level, status (kept/rejected), reason,
  // failed_check, aten_ops, fingerprint, runtime_ms (null when not measured), model. Kept rows
  // load as tasks (load_task_jsonl reads py_code, ops and level).
  nlohmann::json to_row(const Proposal& proposal, const ProposalBatch& batch, const std::string& model) const;

  const ProposerOptions& options() const { return options_; }

 private:
  ProposerPipeline(Generator& generator, ProposerOptions options, PromptTemplate prompt);
  Result<std::vector<ChatMessage>> messages_for(const std::vector<ApiEntry>& apis) const;
  std::string unique_id(const std::string& content, std::set<std::string>& ids) const;
  int jobs_for(size_t replies) const;

  Generator* generator_;
  ProposerOptions options_;
  PromptTemplate prompt_;
  NearDuplicateIndex index_;
  std::set<std::string> ids_;
};

// The Proposer's chat messages for an API set: the names as a Markdown bullet list and the level,
// rendered in `prompt` (prompts/proposer.toml). The pipeline prompts with it, and kz sft builds its
// Proposer pairs with it, so the two agree token for token.
Result<std::vector<ChatMessage>> proposer_messages(const PromptTemplate& prompt, const std::vector<std::string>& api_names,
                                                   int level);

}  // namespace kz
