// Prompt -> completion pairs for supervised training, as token ids, built exactly as `kz evolve`
// prompts the roles and parses their replies, so the supervised start and RL agree token for
// token:
//
//   Coder     prompt: prompts_dir/coder_<format>.toml (coder_prompt_path) with
//             {{reference_source}} = the module's reference (loop/src/evolve.cpp);
//             reply:  the candidate's source, fenced as ```python ... ``` (what extract_code takes)
//   Proposer  prompt: prompts_dir/proposer.toml with {{apis}} = "- a\n- b" and {{level}}
//             (curriculum/src/proposer.cpp); reply: the reference, fenced
//
// Prompt ids are the chat template's rendering of the messages with the generation prompt,
// encoded with special tokens, as the in-process Generator does (llm/src/engine_generator.cpp);
// completion ids are the reply encoded alone (generation starts after the prompt) followed by
// <|im_end|> (the eos that ends generation). The loss is on the completion ids only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/llm/generator.h"
#include "kz/llm/prompt.h"
#include "kz/model/tokenizer.h"
#include "kz/sft/corpus.h"

namespace kz::sft {

enum class Role { coder, proposer };
const char* role_name(Role role);  // "coder", "proposer"
Result<Role> parse_role(const std::string& name);

struct ExampleOptions {
  Role role = Role::coder;
  // Holds coder_<format>.toml and proposer.toml, as kz evolve's run.prompts_dir (the same folder
  // in both configs, e.g. "prompts" or "prompts/compact").
  fs::path prompts_dir = "prompts";
  // Coder: the candidate formats trained (one prompt template each).
  std::vector<std::string> formats = {"triton"};
  // Coder: for each module and format, the share of draws that take an unfused candidate (the
  // rest a fused one; whichever the module has when it lacks one kind). A mostly unfused Coder
  // leaves RL speed to discover.
  double unfused_share = 0.9;
  // Coder: examples per module and format: distinct candidates of the drawn fusion (block-size
  // variants), fewer when the module has fewer.
  int candidates_per_module = 1;
  // Coder: candidates with verdict null (a corpus written without checking) are trained too;
  // otherwise only "ok" ones. Other verdicts never are.
  bool accept_unchecked = false;
  // Pairs longer than this (prompt + completion tokens) are left out and counted, never cut: a
  // cut completion would teach a reply without its end.
  size_t max_seq_len = 2048;
  uint64_t seed = 0;  // the fusion draws and the choice among variants
  Status validate() const;
};

struct Example {
  std::string module_id;
  std::string label;                    // "train-000042 triton unfused 256", "train-000042 proposer"
  std::vector<TokenId> prompt_ids;      // chat rendering with the generation prompt
  std::vector<TokenId> completion_ids;  // the fenced reply, then <|im_end|>
  bool fused = false;                   // coder: a fused candidate
  size_t tokens() const { return prompt_ids.size() + completion_ids.size(); }
};

struct ExampleSet {
  std::vector<Example> examples;
  size_t modules = 0;            // modules read
  size_t too_long = 0;           // pairs left out by max_seq_len
  size_t without_candidate = 0;  // coder: (module, format) pairs with no candidate passing the filters
};

// The Coder's chat messages, as kz evolve builds them (the Proposer's: curriculum's proposer_messages).
Result<std::vector<ChatMessage>> coder_messages(const PromptTemplate& prompt, const std::string& reference);

// "```python\n" + code + "```" with code newline-terminated: extract_code gives back exactly the
// code (with its final newline).
std::string fenced_reply(std::string_view code);

// The prompt and completion ids of one pair (the header comment). invalid_argument when the
// tokenizer's chat template is not ChatML or it has no <|im_end|>.
Result<Example> encode_pair(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                            std::string_view reply);

// The pairs of `modules` for options.role, in module order. Errors name the template or module.
Result<ExampleSet> build_examples(const std::vector<CorpusModule>& modules, const ExampleOptions& options,
                                  const Tokenizer& tokenizer);

// Which modules train and which measure the evaluation loss.
//   "heldout"   the corpus's heldout split evaluates (the modules the teacher keeps out of training)
//   "fraction"  eval_fraction of the train split, chosen by a hash of (seed, id); heldout unused
//   "none"      no evaluation
struct ModuleSplit {
  std::vector<CorpusModule> train, eval;
};
Result<ModuleSplit> split_modules(std::vector<CorpusModule> modules, const std::string& eval_split,
                                  double eval_fraction, uint64_t seed);

}  // namespace kz::sft
