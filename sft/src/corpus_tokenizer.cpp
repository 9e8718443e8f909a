// The corpus tokenizer (corpus_tokenizer.h): the texts, weighted, then model/'s BPE trainer.
#include "kz/sft/corpus_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "kz/llm/prompt.h"
#include "kz/model/chat_template.h"
#include "kz/model/init_model.h"
#include "kz/model/tokenizer.h"
#include "kz/model/tokenizer_train.h"
#include "kz/sft/corpus.h"

namespace kz::sft {
namespace {

constexpr size_t kModulesMeasured = 256;  // bytes_per_token is measured on the first modules

struct WeightedTexts {
  std::vector<std::string> texts;
  std::vector<uint64_t> weights;
  void add(std::string text, uint64_t weight) {
    texts.push_back(std::move(text));
    weights.push_back(weight);
  }
};

// Every *.toml under `dir`, sorted (a deterministic corpus).
Result<std::vector<fs::path>> template_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".toml") files.push_back(it->path());
  if (ec) return io_error(fmt::format("listing prompt templates in {}: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

// The templates' text and the ChatML scaffolding around a turn, each weighted by the modules.
Status add_templates(const fs::path& dir, uint64_t weight, WeightedTexts& out, size_t& templates) {
  auto files = template_files(dir);
  if (!files.ok()) return files.status();
  for (const fs::path& file : *files) {
    auto t = load_prompt_template(file);
    if (!t.ok()) return t.status();
    out.add(t->system, weight);
    out.add(t->user, weight);
    for (const auto& [name, text] : t->extras) out.add(text, weight);
    ++templates;
  }
  std::vector<ChatTurn> turns = {{"system", "."}, {"user", "."}};
  out.add(render_chatml(turns, /*add_generation_prompt=*/true) + "```python\n```", weight);
  return Status::ok();
}

// The corpus's texts and the templates'; modules_out receives the corpus.
Result<WeightedTexts> training_texts(const CorpusTokenizerOptions& options, std::vector<CorpusModule>& modules_out,
                                     size_t& templates) {
  auto modules = load_corpora(options.corpora);
  if (!modules.ok()) return modules.status();
  WeightedTexts texts;
  for (const CorpusModule& m : *modules) {
    texts.add(m.reference, 1);
    for (const CorpusCandidate& c : m.candidates) texts.add(c.source, 1);
  }
  if (!options.prompts_dir.empty())
    KZ_RETURN_IF_ERROR(add_templates(options.prompts_dir, std::max<uint64_t>(modules->size(), 1), texts, templates));
  modules_out = std::move(*modules);
  return texts;
}

double bytes_per_token(const Tokenizer& tokenizer, const std::vector<CorpusModule>& modules) {
  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < modules.size() && i < kModulesMeasured; ++i) {
    bytes += modules[i].reference.size();
    tokens += tokenizer.encode(modules[i].reference, false).size();
    for (const CorpusCandidate& c : modules[i].candidates) {
      bytes += c.source.size();
      tokens += tokenizer.encode(c.source, false).size();
    }
  }
  return tokens == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(tokens);
}

}  // namespace

Status CorpusTokenizerOptions::validate() const {
  if (corpora.empty()) return invalid_argument("train-tokenizer: give at least one corpus file");
  if (out_dir.empty()) return invalid_argument("train-tokenizer: an output directory is required");
  return model::chatml_bpe_options(vocab_size).validate();
}

Result<CorpusTokenizerReport> train_corpus_tokenizer(const CorpusTokenizerOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  CorpusTokenizerReport report;
  std::vector<CorpusModule> modules;
  auto texts = training_texts(options, modules, report.templates);
  if (!texts.ok()) return texts.status();
  report.modules = modules.size();
  for (size_t i = 0; i < texts->texts.size(); ++i) report.text_bytes += texts->texts[i].size() * texts->weights[i];
  BpeTrainOptions bpe = model::chatml_bpe_options(options.vocab_size);
  bpe.min_pair_count = options.min_pair_count;
  auto files = train_byte_level_bpe(texts->texts, texts->weights, bpe);
  if (!files.ok()) return files.status().with_context("train-tokenizer");
  KZ_RETURN_IF_ERROR(files->write(options.out_dir));
  auto tokenizer = Tokenizer::load(options.out_dir);
  if (!tokenizer.ok()) return tokenizer.status().with_context("train-tokenizer: reading back what it wrote");
  report.vocab_size = tokenizer->vocab_size();
  report.bytes_per_token = bytes_per_token(*tokenizer, modules);
  return report;
}

}  // namespace kz::sft
