// The teacher's corpus: making, writing and checking it (kz/teacher/corpus.h).
#include "kz/teacher/corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "kz/core/files.h"
#include "kz/core/terminal.h"
#include "kz/task/task.h"

namespace kz::teacher {
namespace {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::elementwise: return "elementwise";
    case Kind::reduction: return "reduction";
    case Kind::gemm: return "gemm";
  }
  return "";
}

std::filesystem::path candidate_file(const std::string& id, const CandidateSpec& spec) {
  return std::filesystem::path("candidates") / id /
         fmt::format("{}-{}-{}.py", format_name(spec.format), fusion_name(spec.fusion), spec.block_size);
}

std::vector<TeacherCandidate> make_candidates(const std::string& id, const ModuleSpec& module,
                                              const TeachOptions& options) {
  std::vector<TeacherCandidate> candidates;
  for (Format format : options.formats) {
    std::vector<int> sizes = block_sizes(module, format);
    sizes.resize(std::min(sizes.size(), static_cast<size_t>(options.variants)));
    for (Fusion fusion : {Fusion::unfused, Fusion::fused}) {
      for (int block : sizes) {
        TeacherCandidate candidate;
        candidate.spec = CandidateSpec{format, fusion, block};
        candidate.source = render_candidate(module, candidate.spec);
        candidate.file = candidate_file(id, candidate.spec);
        candidates.push_back(std::move(candidate));
      }
    }
  }
  return candidates;
}

nlohmann::json optional_json(const std::optional<std::string>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}
nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

Status write_lines(const std::filesystem::path& path, const std::vector<CorpusEntry>& corpus, const TeachOptions& options) {
  std::string text;
  for (const CorpusEntry& entry : corpus) text += corpus_json(entry, options).dump() + "\n";
  return write_file_atomic(path, text);
}

Status write_text(const std::filesystem::path& path, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  if (error) return io_error(fmt::format("creating {}: {}", path.parent_path().string(), error.message()));
  return write_file_atomic(path, text);
}

// A passing verdict for a teacher candidate: correct, or (cuda-rtc on a CPU) compiled.
bool passes(EvalStatus status, Format format) {
  return status == EvalStatus::ok || (status == EvalStatus::compiled_not_run && format == Format::cuda_rtc);
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

Status TeachOptions::validate() const {
  if (out_dir.empty()) return invalid_argument("teach: the output directory is required");
  if (count < 1) return invalid_argument(fmt::format("teach: count must be >= 1, got {}", count));
  if (formats.empty()) return invalid_argument("teach: at least one format is required");
  std::set<Format> distinct(formats.begin(), formats.end());
  if (distinct.size() != formats.size()) return invalid_argument("teach: a format is listed twice");
  if (variants < 1 || variants > 3) return invalid_argument(fmt::format("teach: variants must be in [1, 3], got {}", variants));
  if (scale < 1) return invalid_argument(fmt::format("teach: scale must be >= 1, got {}", scale));
  return Status::ok();
}

CorpusEntry make_entry(const ModuleSpec& module, int index, const TeachOptions& options) {
  CorpusEntry entry;
  entry.split = options.split;
  entry.index = index;
  entry.id = fmt::format("{}-{:06d}", split_name(options.split), index);
  entry.module = module;
  entry.reference = render_reference(module, options.scale);
  entry.reference_file = std::filesystem::path("suite") / fmt::format("level{}", level(module)) / (entry.id + ".py");
  entry.candidates = make_candidates(entry.id, module, options);
  return entry;
}

std::vector<CorpusEntry> make_corpus(const TeachOptions& options) {
  std::vector<CorpusEntry> corpus;
  ModuleSampler sampler(options.seed, options.split);
  for (int index = 0; index < options.count; ++index) corpus.push_back(make_entry(sampler.next(), index, options));
  return corpus;
}

nlohmann::json corpus_json(const CorpusEntry& entry, const TeachOptions& options) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const TeacherCandidate& c : entry.candidates) {
    candidates.push_back({{"format", format_name(c.spec.format)},
                          {"fusion", fusion_name(c.spec.fusion)},
                          {"block_size", c.spec.block_size},
                          {"source", c.source},
                          {"verdict", optional_json(c.verdict)},
                          {"speedup", optional_json(c.speedup)},
                          {"file", c.file.string()}});
  }
  nlohmann::json line = {
      {"id", entry.id},
      {"split", split_name(entry.split)},
      {"level", level(entry.module)},
      {"kind", kind_name(entry.module.kind)},
      {"apis", apis(entry.module)},
      {"ops", expression(entry.module)},
      {"reference", entry.reference},
      {"candidates", candidates},
      {"provenance",
       {{"generator", "kz teach"},
        {"teacher_version", kTeacherVersion},
        {"seed", options.seed},
        {"index", entry.index},
        {"scale", options.scale}}},
  };
  if (entry.split == Split::heldout) line["heldout_reason"] = held_out_reason(entry.module);
  return line;
}

Status write_corpus(const TeachOptions& options, const std::vector<CorpusEntry>& corpus) {
  for (const char* earlier : {"suite", "candidates", "check.jsonl"}) {
    std::error_code error;
    std::filesystem::remove_all(options.out_dir / earlier, error);
    if (error) return io_error(fmt::format("teach: removing {}: {}", (options.out_dir / earlier).string(), error.message()));
  }
  for (const CorpusEntry& entry : corpus) {
    KZ_RETURN_IF_ERROR(write_text(options.out_dir / entry.reference_file, entry.reference)
                           .with_context(fmt::format("teach: module {}", entry.id)));
    for (const TeacherCandidate& candidate : entry.candidates)
      KZ_RETURN_IF_ERROR(write_text(options.out_dir / candidate.file, candidate.source)
                             .with_context(fmt::format("teach: module {}", entry.id)));
  }
  return write_lines(options.out_dir / "corpus.jsonl", corpus, options).with_context("teach: writing corpus.jsonl");
}

std::string CheckReport::render() const {
  std::set<std::string> statuses;
  for (const auto& [group, by_status] : counts)
    for (const auto& [status, n] : by_status) statuses.insert(status);
  std::vector<std::string> headers = {"candidates", "count"};
  headers.insert(headers.end(), statuses.begin(), statuses.end());
  Table table(headers);
  for (const auto& [group, by_status] : counts) {
    int total = 0;
    for (const auto& [status, n] : by_status) total += n;
    std::vector<std::string> row = {group, std::to_string(total)};
    for (const std::string& status : statuses) {
      auto it = by_status.find(status);
      row.push_back(std::to_string(it == by_status.end() ? 0 : it->second));
    }
    table.add_row(row);
  }
  std::string out = table.render();
  for (const std::string& failure : failures) out += "FAILED " + failure + "\n";
  return out;
}

Result<CheckReport> check_corpus(const Evaluator& evaluator, const SuiteRunOptions& run_options,
                                 const TeachOptions& options, std::vector<CorpusEntry>& corpus,
                                 std::ostream& progress) {
  auto tasks = load_tasks(options.out_dir / "suite");
  if (!tasks.ok()) return tasks.status().with_context("teach: reading the written suite back");
  auto entries = discover_candidates(*tasks, options.out_dir / "candidates");
  if (!entries.ok()) return entries.status().with_context("teach: reading the written candidates back");
  SuiteRunOptions run = run_options;
  run.results_path = options.out_dir / "check.jsonl";
  std::error_code ignored;
  std::filesystem::remove(run.results_path, ignored);  // run_suite appends
  auto verdicts = run_suite(evaluator, *tasks, *entries, run, progress);
  if (!verdicts.ok()) return verdicts.status().with_context("teach: checking the candidates");

  // Verdicts carry the candidate's path as read back: match them to the corpus by file.
  std::map<std::string, const Verdict*> by_file;
  for (const Verdict& verdict : *verdicts)
    by_file[std::filesystem::path(verdict.candidate).lexically_normal().string()] = &verdict;
  CheckReport report;
  for (CorpusEntry& entry : corpus) {
    for (TeacherCandidate& candidate : entry.candidates) {
      auto it = by_file.find((options.out_dir / candidate.file).lexically_normal().string());
      if (it == by_file.end())
        return internal_error(fmt::format("teach: no verdict for {} (module {})", candidate.file.string(), entry.id));
      const Verdict& verdict = *it->second;
      candidate.verdict = status_name(verdict.status);
      candidate.speedup = verdict.speedup;
      std::string group = fmt::format("{} {}", format_name(candidate.spec.format), fusion_name(candidate.spec.fusion));
      ++report.counts[group][*candidate.verdict];
      ++report.candidates;
      if (!passes(verdict.status, candidate.spec.format))
        report.failures.push_back(fmt::format("{} ({}): {}: {}", candidate.file.string(), expression(entry.module),
                                              *candidate.verdict, first_line(verdict.message)));
    }
  }
  KZ_RETURN_IF_ERROR(write_lines(options.out_dir / "corpus.jsonl", corpus, options).with_context("teach: writing corpus.jsonl"));
  return report;
}

}  // namespace kz::teacher
