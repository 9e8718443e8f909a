// kz bench: generate -> extract -> evaluate -> summarise, resumable through append-only logs.
#include "kz/suite_bench/bench.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <set>

#include "kz/core/files.h"
#include "kz/core/jsonl.h"
#include "kz/core/parallel.h"
#include "kz/core/terminal.h"
#include "kz/eval/suite.h"
#include "kz/llm/prompt.h"
#include "kz/suite_bench/report.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

struct Generation {
  std::string task_id;
  int sample = 0;
  std::string text;
  std::string finish_reason;
  int prompt_tokens = 0, completion_tokens = 0;
};

std::string sample_label(const std::string& task_id, int sample) { return fmt::format("{}/{}", task_id, sample); }

// Reads a JSONL log; a torn last line (the run was killed mid-write) is skipped, not an error.
Result<std::vector<Generation>> load_generations(const fs::path& path) {
  auto rows = read_jsonl_log(path);
  if (!rows.ok()) return rows.status();
  std::vector<Generation> generations;
  for (const auto& row : *rows)
    generations.push_back({row.value("task_id", ""), row.value("sample", 0), row.value("text", ""),
                           row.value("finish_reason", ""), row.value("prompt_tokens", 0),
                           row.value("completion_tokens", 0)});
  return generations;
}

nlohmann::json generation_json(const Generation& g) {
  return {{"task_id", g.task_id},           {"sample", g.sample},
          {"text", g.text},                 {"finish_reason", g.finish_reason},
          {"prompt_tokens", g.prompt_tokens}, {"completion_tokens", g.completion_tokens}};
}

Result<std::vector<ChatMessage>> coder_messages(const PromptTemplate& prompt, const Task& task) {
  return build_messages(prompt, {{"reference_source", task.source}});
}

// Asks for the samples each task still lacks, a batch of tasks at a time, appending every
// completion to generations.jsonl as soon as its batch returns.
Status generate_missing(const std::vector<Task>& tasks, Generator& generator, const PromptTemplate& prompt,
                        const BenchOptions& options, std::vector<Generation>& generations, int& generated,
                        std::ostream& out) {
  std::map<std::string, int> have;
  for (const auto& g : generations) have[g.task_id] = std::max(have[g.task_id], g.sample + 1);
  std::vector<size_t> pending;
  for (size_t i = 0; i < tasks.size(); ++i)
    if (have[tasks[i].id] < options.samples) pending.push_back(i);
  if (pending.empty()) return Status::ok();
  ProgressBar bar("generate", pending.size(), out);
  fs::path log = options.out_dir / "generations.jsonl";
  for (size_t start = 0; start < pending.size(); start += options.generation_batch) {
    std::vector<GenerationRequest> requests;
    std::vector<size_t> batch(pending.begin() + start,
                              pending.begin() + std::min(pending.size(), start + options.generation_batch));
    for (size_t i : batch) {
      auto messages = coder_messages(prompt, tasks[i]);
      if (!messages.ok()) return messages.status().with_context("task " + tasks[i].id);
      GenerationRequest request;
      request.id = tasks[i].id;
      request.messages = std::move(*messages);
      request.params.n = options.samples - have[tasks[i].id];
      request.params.temperature = options.temperature;
      request.params.top_p = options.top_p;
      request.params.max_tokens = options.max_tokens;
      request.params.seed = options.seed + i * 7919 + have[tasks[i].id];
      requests.push_back(std::move(request));
    }
    auto results = generator.generate(requests);
    for (size_t r = 0; r < results.size(); ++r) {
      const Task& task = tasks[batch[r]];
      if (!results[r].ok()) {
        out << fmt::format("kz: generation for {} failed (rerun to retry): {}\n", task.id,
                           results[r].status().message());
        bar.advance(task.id + " failed");
        continue;
      }
      for (const auto& completion : *results[r]) {
        Generation g{task.id, have[task.id]++, completion.text, completion.finish_reason, completion.prompt_tokens,
                     completion.completion_tokens};
        KZ_RETURN_IF_ERROR(append_line(log, generation_json(g).dump()));
        generations.push_back(std::move(g));
        ++generated;
      }
      bar.advance(task.id);
    }
  }
  bar.finish();
  return Status::ok();
}

// Extracts every generation's code, writes it under candidates/, and evaluates the samples that
// have no verdict yet (results.jsonl is the record of what is done).
Status evaluate_missing(const std::vector<Task>& tasks, const std::vector<Generation>& generations,
                        const Evaluator& evaluator, const BenchOptions& options, const fs::path& results,
                        int& evaluated, std::ostream& out) {
  auto done_rows = read_jsonl_log(results);
  if (!done_rows.ok()) return done_rows.status();
  std::set<std::string> done;
  for (const auto& row : *done_rows) done.insert(row.value("candidate", ""));
  std::map<std::string, size_t> task_index;
  for (size_t i = 0; i < tasks.size(); ++i) task_index[tasks[i].id] = i;

  std::vector<SuiteEntry> entries;
  for (const auto& g : generations) {
    auto it = task_index.find(g.task_id);
    std::string label = sample_label(g.task_id, g.sample);
    if (it == task_index.end() || done.count(label)) continue;
    auto code = extract_code(g.text, options.extract);
    if (!code) {
      Verdict none = no_code_verdict(tasks[it->second], sample_label(g.task_id, g.sample), g.finish_reason,
                                     options.format, evaluator.options().device);
      KZ_RETURN_IF_ERROR(append_line(results, to_json(none).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
      ++evaluated;
      continue;
    }
    fs::path file = options.out_dir / "candidates" / g.task_id / fmt::format("{}.py", g.sample);
    fs::create_directories(file.parent_path());
    KZ_RETURN_IF_ERROR(write_file_atomic(file, *code));
    entries.push_back({it->second, Candidate{label, *code}});
  }
  if (entries.empty()) return Status::ok();
  SuiteRunOptions run{default_jobs(evaluator.options()), cpu_cores(), results, {}};
  auto verdicts = run_suite(evaluator, tasks, entries, run, out);
  if (!verdicts.ok()) return verdicts.status();
  evaluated += static_cast<int>(verdicts->size());
  return Status::ok();
}

Result<std::vector<Verdict>> load_verdicts(const fs::path& path) {
  auto rows = read_jsonl_log(path);
  if (!rows.ok()) return rows.status();
  std::vector<Verdict> verdicts;
  for (const auto& row : *rows) {
    auto v = verdict_from_json(row);
    if (!v.ok()) return v.status().with_context(path.string());
    verdicts.push_back(std::move(*v));
  }
  return verdicts;
}

std::string today() {
  std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return buffer;
}

}  // namespace

Verdict no_code_verdict(const Task& task, const std::string& label, const std::string& finish_reason,
                        const std::string& format, const std::string& device) {
  Verdict v = make_verdict(EvalStatus::format_error, {Check::no_code_block},
                           finish_reason == "length" ? "the reply holds no code block (cut at max_tokens)"
                                                     : "the reply holds no code block");
  v.task_id = task.id;
  v.candidate = label;
  v.format = format;
  v.device = device;
  v.stage = "extract";
  return v;
}

Status BenchOptions::validate() const {
  if (out_dir.empty()) return invalid_argument("bench: --out is required");
  if (samples < 1) return invalid_argument("bench: --samples must be at least 1");
  if (format != "cuda" && format != "triton" && format != "cuda-rtc")
    return invalid_argument(fmt::format("bench: format '{}' is not cuda, triton or cuda-rtc", format));
  if (generation_batch < 1) return invalid_argument("bench: generation_batch must be at least 1");
  if (!also_policy.empty() && also_policy != "strict" && also_policy != "kernelbench")
    return invalid_argument(fmt::format("bench: --also-policy '{}' is neither strict nor kernelbench", also_policy));
  return Status::ok();
}

Result<BenchResult> run_bench(const std::vector<Task>& tasks, Generator& generator, const Evaluator& evaluator,
                              const BenchOptions& options, std::ostream& out) {
  KZ_RETURN_IF_ERROR(options.validate());
  fs::create_directories(options.out_dir);
  auto prompt_path = coder_prompt_path(options.prompts_dir, options.format);
  if (!prompt_path.ok()) return prompt_path.status();
  auto prompt = load_prompt_template(*prompt_path);
  if (!prompt.ok()) return prompt.status();

  BenchResult result;
  result.tasks = static_cast<int>(tasks.size());
  auto generations = load_generations(options.out_dir / "generations.jsonl");
  if (!generations.ok()) return generations.status();
  KZ_RETURN_IF_ERROR(generate_missing(tasks, generator, *prompt, options, *generations, result.samples_generated, out));
  const std::string& policy = evaluator.options().policy.mode;
  fs::path results = options.out_dir / "results.jsonl";
  KZ_RETURN_IF_ERROR(evaluate_missing(tasks, *generations, evaluator, options, results, result.samples_evaluated, out));

  auto verdicts = load_verdicts(results);
  if (!verdicts.ok()) return verdicts.status();
  result.verdicts = std::move(*verdicts);
  RunInfo info{generator.describe(), options.suite_label, options.format, evaluator.options().device, today(), options.samples};
  auto summary = bench_summary(info, tasks, result.verdicts);
  summary["policy"] = policy;
  if (!options.also_policy.empty() && options.also_policy != policy) {
    auto other = evaluator.with_policy(options.also_policy);
    if (!other.ok()) return other.status();
    fs::path other_results = options.out_dir / fmt::format("results.{}.jsonl", options.also_policy);
    out << fmt::format("kz: the samples again under policy {}\n", options.also_policy);
    KZ_RETURN_IF_ERROR(evaluate_missing(tasks, *generations, *other, options, other_results, result.samples_evaluated, out));
    auto other_verdicts = load_verdicts(other_results);
    if (!other_verdicts.ok()) return other_verdicts.status();
    summary[options.also_policy] = bench_metrics(tasks, *other_verdicts);
  }
  KZ_RETURN_IF_ERROR(write_file_atomic(options.out_dir / "summary.json", summary.dump(2) + "\n"));
  KZ_RETURN_IF_ERROR(write_file_atomic(options.out_dir / "report.html",
                                       render_bench_html(info, summary, tasks, result.verdicts)));
  return result;
}

}  // namespace kz
