// `kz propose`: the Proposer's side of the curriculum. A model is asked n times for a
// KernelBench-format module that uses a set of PyTorch APIs (named, or sampled from the API
// catalogue); each reply's code is validated in a worker (kz/curriculum/validation.h) and checked
// against the modules already kept (kz/curriculum/dedup.h, including those an earlier run left in
// --out); one JSON line per module is appended to --out, kept or rejected with the reason.
// Kept rows are tasks: load_task_jsonl reads their py_code, ops and level.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include "commands.h"
#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/core/parallel.h"
#include "kz/core/hash.h"
#include "kz/core/terminal.h"
#include "kz/curriculum/dedup.h"
#include "kz/curriculum/validation.h"
#include "kz/llm/extract.h"
#include "kz/llm/http_generator.h"
#include "kz/llm/prompt.h"
#include "kz/task/catalogue.h"

#ifndef KZ_DEFAULT_PROMPTS_DIR
#define KZ_DEFAULT_PROMPTS_DIR "prompts"
#endif

namespace kz::cli {
namespace fs = std::filesystem;
namespace {

struct ProposeArgs {
  std::string model, out;
  std::vector<std::string> apis;
  size_t random_apis = 0;
  uint64_t seed = 0;
  int n = 8;
  int level = 1;
  double temperature = 0.8;
  int max_tokens = 4096;
  std::string prompts = KZ_DEFAULT_PROMPTS_DIR;
  std::string catalogue;
  std::string api_key_env;
  int jobs = 0;
  std::string eval_config;  // its [worker] and [sandbox] apply to the validation
  ModuleValidationOptions validation;
};

// One reply of the model and what became of it.
struct Proposal {
  std::string id;
  std::optional<std::string> code;  // nullopt: the reply held no code block
  ModuleVerdict verdict;
  bool kept = false;
  std::string reason;               // why rejected ("valid" for kept)
  std::string failed_check;         // the reason's category, for the summary
};

Result<std::vector<ApiEntry>> select_apis(const ProposeArgs& args) {
  fs::path path = args.catalogue.empty() ? default_api_catalogue_path() : fs::path(args.catalogue);
  auto catalogue = load_api_catalogue(path);
  if (!catalogue.ok()) return catalogue.status();
  if (args.random_apis == 0) return find_apis(*catalogue, args.apis);
  std::mt19937_64 rng(args.seed);
  return sample_apis(*catalogue, args.random_apis, rng);
}

Result<std::vector<ChatMessage>> proposer_messages(const ProposeArgs& args, const std::vector<ApiEntry>& apis) {
  auto prompt = load_prompt_template(fs::path(args.prompts) / "proposer.toml");
  if (!prompt.ok()) return prompt.status();
  std::string list;
  for (const auto& api : apis) list += (list.empty() ? "- " : "\n- ") + api.name;
  return build_messages(*prompt, {{"apis", list}, {"level", std::to_string(args.level)}});
}

// The logs (every HTTP request and response) go next to --out: modules.jsonl -> modules-logs/.
fs::path log_dir_for(const fs::path& out) { return out.parent_path() / (out.stem().string() + "-logs"); }

Result<std::vector<Completion>> generate_replies(const ProposeArgs& args, std::vector<ChatMessage> messages) {
  auto http = parse_model_spec(args.model);
  if (!http.ok()) return http.status();
  http->api_key_env = args.api_key_env;
  http->log_dir = log_dir_for(args.out);
  auto generator = make_http_generator(*http);
  if (!generator.ok()) return generator.status();
  GenerationRequest request;
  request.id = "propose";
  request.messages = std::move(messages);
  request.params.n = args.n;
  request.params.temperature = args.temperature;
  request.params.max_tokens = args.max_tokens;
  if (args.seed) request.params.seed = args.seed;
  auto results = (*generator)->generate({request});
  if (results.empty()) return internal_error("the generator returned no result");
  if (!results[0].ok()) return results[0].status().with_context("generating proposals with " + args.model);
  return std::move(results[0]).value();
}

// Kept modules of earlier runs join the dedup index; every id already used is reserved.
Status load_existing(const fs::path& out, NearDuplicateIndex& index, std::set<std::string>& ids) {
  auto rows = read_jsonl_log(out);
  if (!rows.ok()) return rows.status();
  for (const auto& row : *rows) {
    if (!row.contains("id") || !row["id"].is_string())
      return parse_error(fmt::format("{}: a row without a string id is not a kz propose row: {}", out.string(),
                                     row.dump().substr(0, 200)));
    ids.insert(row["id"].get<std::string>());
    if (row.value("status", "") == "kept" && row.contains("py_code") && row["py_code"].is_string())
      index.add(row["id"].get<std::string>(), row["py_code"].get<std::string>(), row.value("fingerprint", ""));
  }
  return Status::ok();
}

// A stable id from the content; a clash with an id already used (the same code twice) gets a suffix.
std::string unique_id(const std::string& content, std::set<std::string>& ids) {
  std::string base = "prop-" + content_hash({content}).substr(0, 12);
  std::string id = base;
  for (int k = 2; ids.count(id); ++k) id = fmt::format("{}-{}", base, k);
  ids.insert(id);
  return id;
}

int default_jobs(const ProposeArgs& args, size_t modules) {
  if (args.jobs > 0) return args.jobs;
  // On a GPU, validations share it through the GPU lock (their time bands run alone), as
  // evaluations do: as many at once as [timing] gpu_jobs, capped by the cores.
  if (args.validation.device != "cpu") return std::min(TimingOptions{}.gpu_jobs, cpu_cores());
  return std::clamp(cpu_cores(), 1, std::max(1, static_cast<int>(modules)));
}

// Validates every proposal that has code, `jobs` worker processes at a time.
Status validate_all(std::vector<Proposal>& proposals, const std::vector<ApiEntry>& apis, const ProposeArgs& args) {
  std::vector<Status> errors(proposals.size());
  ProgressBar progress("validating", proposals.size(), std::cerr);
  std::mutex progress_mutex;
  // Every proposal is validated; a failure is kept per module and reported after all ran.
  parallel_for(proposals.size(), default_jobs(args, proposals.size()), [&](size_t i) {
    if (proposals[i].code) {
      auto verdict = validate_module(*proposals[i].code, apis, args.validation);
      if (verdict.ok()) proposals[i].verdict = std::move(*verdict);
      else errors[i] = verdict.status().with_context("module " + proposals[i].id);
    }
    std::lock_guard lock(progress_mutex);
    progress.advance(proposals[i].id);
    return Status::ok();
  });
  progress.finish();
  for (const auto& error : errors) KZ_RETURN_IF_ERROR(error);
  return Status::ok();
}

// In reply order: no code, invalid, duplicate of a kept module, or kept (and indexed).
void decide(std::vector<Proposal>& proposals, NearDuplicateIndex& index) {
  for (auto& p : proposals) {
    if (!p.code) {
      p.failed_check = "no_code";
      p.reason = "no_code: the reply holds no code block";
    } else if (!p.verdict.valid) {
      p.failed_check = p.verdict.failed_check.empty() ? "invalid" : p.verdict.failed_check;
      p.reason = p.verdict.reason;
    } else if (auto match = index.match(*p.code, p.verdict.fingerprint)) {
      p.failed_check = "duplicate";
      p.reason = match->same_fingerprint
                     ? fmt::format("duplicate: same ATen ops and output shapes as {}", match->id)
                     : fmt::format("duplicate: {:.0f}% similar to {} (normalised source)", 100 * match->similarity,
                                   match->id);
    } else {
      p.kept = true;
      p.reason = "valid";
      index.add(p.id, *p.code, p.verdict.fingerprint);
    }
  }
}

nlohmann::json row_json(const Proposal& p, const std::vector<ApiEntry>& apis, const ProposeArgs& args) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& api : apis) ops.push_back(api.name);
  nlohmann::json runtime = p.verdict.runtime_ms > 0 ? nlohmann::json(p.verdict.runtime_ms) : nlohmann::json();
  return {{"id", p.id},
          {"py_code", p.code.value_or("")},
          {"ops", ops},
          {"level", args.level},
          {"status", p.kept ? "kept" : "rejected"},
          {"reason", p.reason},
          {"failed_check", p.kept ? "" : p.failed_check},
          {"aten_ops", p.verdict.aten_ops},
          {"fingerprint", p.verdict.fingerprint},
          {"runtime_ms", runtime},
          {"model", args.model}};
}

std::string shorten(const std::string& text, size_t max_chars) {
  std::string line = text.substr(0, text.find('\n'));
  return line.size() <= max_chars ? line : line.substr(0, max_chars - 3) + "...";
}

void print_report(const std::vector<Proposal>& proposals, const ProposeArgs& args) {
  Table table({"id", "status", "runtime ms", "aten ops", "reason"});
  std::map<std::string, int> rejected;
  int kept = 0;
  for (const auto& p : proposals) {
    table.add_row({p.id, p.kept ? "kept" : "rejected",
                   p.verdict.runtime_ms > 0 ? fmt::format("{:.3f}", p.verdict.runtime_ms) : "-",
                   std::to_string(p.verdict.aten_ops.size()), shorten(p.reason, 90)});
    if (p.kept) ++kept;
    else ++rejected[p.failed_check];
  }
  std::cout << table.render() << "\n";
  std::string by_reason;
  for (const auto& [check, count] : rejected) by_reason += fmt::format("{}{} {}", by_reason.empty() ? "" : ", ", check, count);
  std::cout << fmt::format("proposed {}: kept {}, rejected {}{}  ->  {}\n", proposals.size(), kept,
                           proposals.size() - kept, by_reason.empty() ? "" : " (" + by_reason + ")", args.out);
}

// The evaluations' config: a module is validated with the worker and sandbox settings its
// evaluations will get.
Status apply_eval_config(ProposeArgs& args) {
  if (args.eval_config.empty()) return Status::ok();
  EvalOptions eval;
  KZ_RETURN_IF_ERROR(apply_toml_file(args.eval_config, eval));
  KZ_RETURN_IF_ERROR(eval.validate());
  args.validation.worker = eval.worker;
  args.validation.sandbox = eval.sandbox;
  return Status::ok();
}

int run(ProposeArgs args) {
  if (auto status = apply_eval_config(args); !status.is_ok()) return report_error(status);
  if (args.apis.empty() == (args.random_apis == 0))
    return report_error(invalid_argument("give either --apis or --random-apis K"));
  if (args.n < 1) return report_error(invalid_argument("--n must be >= 1"));
  if (auto status = args.validation.validate(); !status.is_ok()) return report_error(status);
  auto apis = select_apis(args);
  if (!apis.ok()) return report_error(apis.status());
  if (apis->empty()) return report_error(invalid_argument("no APIs selected"));
  auto messages = proposer_messages(args, *apis);
  if (!messages.ok()) return report_error(messages.status());

  fs::path out(args.out);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  NearDuplicateIndex index(args.validation.dedup_threshold);
  std::set<std::string> ids;
  if (auto status = load_existing(out, index, ids); !status.is_ok()) return report_error(status);

  std::string api_names;
  for (const auto& api : *apis) api_names += (api_names.empty() ? "" : ", ") + api.name;
  std::cerr << fmt::format("kz: proposing {} level-{} modules with {} from {}\n", args.n, args.level, api_names,
                           args.model);
  auto replies = generate_replies(args, std::move(*messages));
  if (!replies.ok()) return report_error(replies.status());

  std::vector<Proposal> proposals;
  for (const auto& reply : *replies) {
    Proposal p;
    p.code = extract_code(reply.text);
    p.id = unique_id(p.code.value_or(reply.text), ids);
    proposals.push_back(std::move(p));
  }
  if (auto status = validate_all(proposals, *apis, args); !status.is_ok()) return report_error(status);
  decide(proposals, index);
  for (const auto& p : proposals)
    if (auto status = append_line(out, row_json(p, *apis, args).dump()); !status.is_ok()) return report_error(status);
  print_report(proposals, args);
  return kExitOk;
}

}  // namespace

Action add_propose_command(CLI::App& app) {
  auto args = std::make_shared<ProposeArgs>();
  auto* command = app.add_subcommand("propose", "Ask a model for reference modules that use given PyTorch APIs; "
                                                "validate, deduplicate, append to a JSONL task file");
  command->add_option("--model", args->model, "openai:<base-url>:<model>")->required();
  auto* apis = command->add_option("--apis", args->apis, "APIs to use, comma-separated (see task/data/api_catalogue.toml)")
                   ->delimiter(',');
  auto* random = command->add_option("--random-apis", args->random_apis, "sample K APIs from the catalogue instead");
  apis->excludes(random);
  command->add_option("--seed", args->seed, "seed for --random-apis (and the generation seed when non-zero)");
  command->add_option("--n", args->n, "modules to ask for (default 8)");
  command->add_option("--out", args->out, "JSONL file the rows are appended to (kept rows load as tasks)")->required();
  command->add_option("--config", args->eval_config,
                      "evaluation TOML (configs/eval.toml): its [worker] and [sandbox] apply to the validation");
  command->add_option("--device", args->validation.device, "validate on cpu or cuda:N (default cpu)");
  command->add_option("--level", args->level, "KernelBench level asked for: 1, 2 or 3 (default 1)");
  command->add_option("--temperature", args->temperature, "sampling temperature (default 0.8)");
  command->add_option("--max-tokens", args->max_tokens, "new tokens per reply (default 4096)");
  command->add_option("--prompts", args->prompts, "folder of prompt templates (default: the source tree's prompts/)");
  command->add_option("--catalogue", args->catalogue, "API catalogue TOML (default: task/data/api_catalogue.toml)");
  command->add_option("--api-key-env", args->api_key_env, "environment variable holding the API key");
  command->add_option("--jobs", args->jobs, "validations at once (default: cores on cpu, 8 on a GPU, capped by the cores)");
  command->add_option("--cpu-max-ms", args->validation.cpu_max_ms, "CPU: maximum median forward time (default 2000)");
  command->add_option("--min-ms", args->validation.time_band_min_ms, "CUDA: minimum median forward time (default 0.05)");
  command->add_option("--max-ms", args->validation.time_band_max_ms, "CUDA: maximum median forward time (default 50)");
  command->add_option("--dedup-threshold", args->validation.dedup_threshold,
                      "source similarity at which a module duplicates a kept one (default 0.8)");
  return [args] { return run(*args); };
}

}  // namespace kz::cli
