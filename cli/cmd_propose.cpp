// `kz propose`: the Proposer's side of the curriculum, as a command. The pipeline (prompt,
// generate, extract, validate, dedup, decision) is kz/curriculum/proposer.h; this file parses the
// flags, applies the evaluation config, picks the API set (named, or sampled from the API
// catalogue), makes the HTTP generator, feeds the pipeline the rows an earlier run left in --out
// (so dedup sees them), appends one JSON line per module to --out, kept or rejected with the
// reason, and prints the table. Kept rows are tasks: load_task_jsonl reads their py_code, ops and level.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "commands.h"
#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/core/terminal.h"
#include "kz/curriculum/proposer.h"
#include "kz/llm/http_generator.h"
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
  std::string eval_config;  // its [worker], [tuning] and [sandbox] apply to the validation
  ModuleValidationOptions validation;
};

Result<std::vector<ApiEntry>> select_apis(const ProposeArgs& args) {
  fs::path path = args.catalogue.empty() ? default_api_catalogue_path() : fs::path(args.catalogue);
  auto catalogue = load_api_catalogue(path);
  if (!catalogue.ok()) return catalogue.status();
  if (args.random_apis == 0) return find_apis(*catalogue, args.apis);
  std::mt19937_64 rng(args.seed);
  return sample_apis(*catalogue, args.random_apis, rng);
}

// The logs (every HTTP request and response) go next to --out: modules.jsonl -> modules-logs/.
fs::path log_dir_for(const fs::path& out) { return out.parent_path() / (out.stem().string() + "-logs"); }

Result<std::unique_ptr<Generator>> make_generator(const ProposeArgs& args) {
  auto http = parse_model_spec(args.model);
  if (!http.ok()) return http.status();
  http->api_key_env = args.api_key_env;
  http->log_dir = log_dir_for(args.out);
  return make_http_generator(*http);
}

ProposerOptions proposer_options(const ProposeArgs& args) {
  ProposerOptions options;
  options.n = args.n;
  options.level = args.level;
  options.temperature = args.temperature;
  options.max_tokens = args.max_tokens;
  if (args.seed) options.seed = args.seed;
  options.prompts_dir = args.prompts;
  options.validation = args.validation;
  options.jobs = args.jobs;
  return options;
}

// Kept modules of earlier runs join the dedup index; every id already used is reserved.
Status load_existing(const fs::path& out, ProposerPipeline& pipeline) {
  auto rows = read_jsonl_log(out);
  if (!rows.ok()) return rows.status();
  for (const auto& row : *rows) {
    if (!row.contains("id") || !row["id"].is_string())
      return parse_error(fmt::format("{}: a row without a string id is not a kz propose row: {}", out.string(),
                                     row.dump().substr(0, 200)));
    pipeline.reserve_id(row["id"].get<std::string>());
    if (row.value("status", "") == "kept" && row.contains("py_code") && row["py_code"].is_string())
      pipeline.add_kept(row["id"].get<std::string>(), row["py_code"].get<std::string>(), row.value("fingerprint", ""));
  }
  return Status::ok();
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

// The evaluations' config: a module is validated with the worker, tuning and sandbox settings its
// evaluations will get.
Status apply_eval_config(ProposeArgs& args) {
  if (args.eval_config.empty()) return Status::ok();
  EvalOptions eval;
  KZ_RETURN_IF_ERROR(apply_toml_file(args.eval_config, eval));
  KZ_RETURN_IF_ERROR(eval.validate());
  args.validation.worker = eval.worker;
  args.validation.tuning = eval.tuning;
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

  auto generator = make_generator(args);
  if (!generator.ok()) return report_error(generator.status());
  auto pipeline = ProposerPipeline::create(**generator, proposer_options(args));
  if (!pipeline.ok()) return report_error(pipeline.status());

  fs::path out(args.out);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  if (auto status = load_existing(out, *pipeline); !status.is_ok()) return report_error(status);

  std::string api_names;
  for (const auto& api : *apis) api_names += (api_names.empty() ? "" : ", ") + api.name;
  std::cerr << fmt::format("kz: proposing {} level-{} modules with {} from {}\n", args.n, args.level, api_names,
                           args.model);
  std::optional<ProgressBar> progress;
  auto batches = pipeline->propose({*apis}, [&](size_t done, size_t total, const std::string& id) {
    if (!progress) progress.emplace("validating", total, std::cerr);
    if (done > 0) progress->advance(id);
  });
  if (progress) progress->finish();
  if (!batches.ok()) return report_error(batches.status());

  const ProposalBatch& batch = batches->front();
  for (const auto& p : batch.proposals)
    if (auto status = append_line(out, pipeline->to_row(p, batch, args.model).dump()); !status.is_ok())
      return report_error(status);
  print_report(batch.proposals, args);
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
                      "evaluation TOML (configs/eval.toml): its [worker], [tuning] and [sandbox] apply to the validation");
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
