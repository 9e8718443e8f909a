// Prompt -> completion pairs (examples.h): the roles' messages, the fenced reply, token ids, the
// Coder's choice of candidates, and the train / eval split.
#include "kz/sft/examples.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>

#include "kz/core/hash.h"
#include "kz/curriculum/proposer.h"
#include "kz/model/chat_template.h"

namespace kz::sft {
namespace {

// A uniform number in [0, 1) from the hash of `key`: draws that do not depend on the order in
// which modules are read.
double hashed_uniform(const std::string& key) { return static_cast<double>(hash64(key) >> 11) * 0x1.0p-53; }

bool accepted(const CorpusCandidate& c, const ExampleOptions& options) {
  if (!c.verdict) return options.accept_unchecked;
  return *c.verdict == "ok";
}

// The module's candidates of `format` that this run trains: the drawn fusion's (the other's when
// the module has none of it), candidates_per_module of them in a seeded order.
std::vector<const CorpusCandidate*> choose_candidates(const CorpusModule& module, const std::string& format,
                                                      const ExampleOptions& options) {
  std::vector<const CorpusCandidate*> unfused, fused;
  for (const auto& c : module.candidates)
    if (c.format == format && accepted(c, options)) (c.fusion == "fused" ? fused : unfused).push_back(&c);
  const std::string key = fmt::format("{}/{}/{}", options.seed, module.id, format);
  bool want_unfused = hashed_uniform(key + "/fusion") < options.unfused_share;
  std::vector<const CorpusCandidate*> pool = want_unfused ? unfused : fused;
  if (pool.empty()) pool = want_unfused ? fused : unfused;
  std::vector<std::pair<uint64_t, const CorpusCandidate*>> ranked;
  for (size_t i = 0; i < pool.size(); ++i) ranked.push_back({hash64(fmt::format("{}/{}", key, i)), pool[i]});
  std::sort(ranked.begin(), ranked.end());
  std::vector<const CorpusCandidate*> chosen;
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(options.candidates_per_module); ++i)
    chosen.push_back(ranked[i].second);
  return chosen;
}

// Templates by file, loaded once per build_examples call.
class Templates {
 public:
  explicit Templates(fs::path dir) : dir_(std::move(dir)) {}
  Result<const PromptTemplate*> coder(const std::string& format) {
    auto path = coder_prompt_path(dir_, format);
    if (!path.ok()) return path.status();
    return load(*path);
  }
  Result<const PromptTemplate*> proposer() { return load(dir_ / "proposer.toml"); }

 private:
  Result<const PromptTemplate*> load(const fs::path& path) {
    auto it = loaded_.find(path);
    if (it == loaded_.end()) {
      auto t = load_prompt_template(path);
      if (!t.ok()) return t.status();
      it = loaded_.emplace(path, std::move(*t)).first;
    }
    return &it->second;
  }
  fs::path dir_;
  std::map<fs::path, PromptTemplate> loaded_;
};

// Adds the pair unless it is longer than max_seq_len.
void keep(Example example, const ExampleOptions& options, ExampleSet& set) {
  if (example.tokens() > options.max_seq_len) {
    ++set.too_long;
    return;
  }
  set.examples.push_back(std::move(example));
}

Status add_coder_examples(const CorpusModule& module, const ExampleOptions& options, const Tokenizer& tokenizer,
                          Templates& templates, ExampleSet& set) {
  for (const std::string& format : options.formats) {
    auto chosen = choose_candidates(module, format, options);
    if (chosen.empty()) {
      ++set.without_candidate;
      continue;
    }
    auto prompt = templates.coder(format);
    if (!prompt.ok()) return prompt.status();
    auto messages = coder_messages(**prompt, module.reference);
    if (!messages.ok()) return messages.status();
    for (const CorpusCandidate* c : chosen) {
      auto example = encode_pair(tokenizer, *messages, fenced_reply(c->source));
      if (!example.ok()) return example.status();
      example->module_id = module.id;
      example->label = fmt::format("{} {} {} {}", module.id, format, c->fusion, c->block_size);
      example->fused = c->fusion == "fused";
      keep(std::move(*example), options, set);
    }
  }
  return Status::ok();
}

Status add_proposer_example(const CorpusModule& module, const ExampleOptions& options, const Tokenizer& tokenizer,
                            Templates& templates, ExampleSet& set) {
  auto prompt = templates.proposer();
  if (!prompt.ok()) return prompt.status();
  // The loop's API sampler lists a set in no particular order; a module's own list runs in its ops'
  // order (Linear first, the reducer last). Shuffled, fixed by the module's id, so that the order
  // is no cue the Proposer learns to lean on.
  std::vector<std::string> apis = module.apis;
  std::mt19937_64 order(hash64(module.id));
  std::shuffle(apis.begin(), apis.end(), order);
  auto messages = proposer_messages(**prompt, apis, module.level);
  if (!messages.ok()) return messages.status();
  auto example = encode_pair(tokenizer, *messages, fenced_reply(module.reference));
  if (!example.ok()) return example.status();
  example->module_id = module.id;
  example->label = module.id + " proposer";
  keep(std::move(*example), options, set);
  return Status::ok();
}

}  // namespace

const char* role_name(Role role) { return role == Role::coder ? "coder" : "proposer"; }

Result<Role> parse_role(const std::string& name) {
  if (name == "coder") return Role::coder;
  if (name == "proposer") return Role::proposer;
  return invalid_argument(fmt::format("role \"{}\" is not coder or proposer", name));
}

Status ExampleOptions::validate() const {
  if (prompts_dir.empty()) return invalid_argument("prompts_dir is empty");
  if (role == Role::coder && formats.empty()) return invalid_argument("the coder needs at least one format");
  if (unfused_share < 0 || unfused_share > 1)
    return invalid_argument(fmt::format("unfused_share {} is not in [0, 1]", unfused_share));
  if (candidates_per_module < 1)
    return invalid_argument(fmt::format("candidates_per_module must be >= 1, got {}", candidates_per_module));
  if (max_seq_len < 2) return invalid_argument(fmt::format("max_seq_len must be >= 2, got {}", max_seq_len));
  return Status::ok();
}

Result<std::vector<ChatMessage>> coder_messages(const PromptTemplate& prompt, const std::string& reference) {
  return build_messages(prompt, {{"reference_source", reference}});
}

std::string fenced_reply(std::string_view code) {
  std::string reply = "```python\n";
  reply += code;
  if (reply.back() != '\n') reply += '\n';
  return reply + "```";
}

Result<Example> encode_pair(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                            std::string_view reply) {
  const ChatTemplate& chat = tokenizer.chat_template();
  if (chat.present && !chat.chatml)
    return invalid_argument(fmt::format("{}: the chat template is not ChatML, which is all the engine renders",
                                        tokenizer.origin()));
  auto im_end = tokenizer.token_to_id("<|im_end|>");
  if (!im_end) return invalid_argument(fmt::format("{}: no <|im_end|> token to end a reply", tokenizer.origin()));
  std::vector<ChatTurn> turns;
  for (const auto& m : messages) turns.push_back({m.role, m.content});
  Example example;
  example.prompt_ids = tokenizer.encode(render_chatml(turns, /*add_generation_prompt=*/true, chat), /*allow_special=*/true);
  // The reply is model output: special-token text inside it (a kernel that prints "<|im_end|>")
  // must stay text, as the sampled tokens would be.
  example.completion_ids = tokenizer.encode(reply, /*allow_special=*/false);
  example.completion_ids.push_back(*im_end);
  return example;
}

Result<ExampleSet> build_examples(const std::vector<CorpusModule>& modules, const ExampleOptions& options,
                                  const Tokenizer& tokenizer) {
  KZ_RETURN_IF_ERROR(options.validate().with_context("examples"));
  Templates templates(options.prompts_dir);
  ExampleSet set;
  set.modules = modules.size();
  for (const CorpusModule& module : modules) {
    Status added = options.role == Role::coder ? add_coder_examples(module, options, tokenizer, templates, set)
                                               : add_proposer_example(module, options, tokenizer, templates, set);
    KZ_RETURN_IF_ERROR(added.with_context("module " + module.id));
  }
  return set;
}

Result<ModuleSplit> split_modules(std::vector<CorpusModule> modules, const std::string& eval_split,
                                  double eval_fraction, uint64_t seed) {
  if (eval_split != "heldout" && eval_split != "fraction" && eval_split != "none")
    return invalid_argument(fmt::format("eval_split \"{}\" is not heldout, fraction or none", eval_split));
  ModuleSplit split;
  for (CorpusModule& m : modules) {
    bool heldout = m.split == "heldout";
    if (eval_split == "heldout") (heldout ? split.eval : split.train).push_back(std::move(m));
    else if (heldout) continue;  // the teacher's held-out modules never train
    else if (eval_split == "fraction" && hashed_uniform(fmt::format("{}/{}/eval", seed, m.id)) < eval_fraction)
      split.eval.push_back(std::move(m));
    else split.train.push_back(std::move(m));
  }
  if (eval_split != "none" && split.eval.empty())
    return invalid_argument(eval_split == "heldout"
                                ? "eval_split = \"heldout\" but the corpus has no heldout module (use "
                                  "\"fraction\" or \"none\")"
                                : "eval_split = \"fraction\" chose no module (raise eval_fraction or use \"none\")");
  return split;
}

}  // namespace kz::sft
