// Byte-level BPE training and the writer of tokenizer.json / tokenizer_config.json
// (tokenizer_train.h).
//
// Training: the corpus is split like the tokenizer will split it (special tokens cut out, NFC,
// the split regex), each distinct piece counted; then the most frequent adjacent pair of symbols
// over all pieces (weighted by count) is merged, until the vocabulary is full. Pair counts are
// updated incrementally, only for the pieces that contain the merged pair; a lazy max-heap finds
// the most frequent pair.
#include "kz/model/tokenizer_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_set>

#include "kz/core/files.h"
#include "kz/model/chat_template.h"
#include "tokenizer_internal.h"
#include "unicode.h"

namespace kz {
namespace {

using ordered_json = nlohmann::ordered_json;

struct Word {
  std::vector<TokenId> symbols;
  uint64_t count = 0;
};

using Pair = std::pair<TokenId, TokenId>;

uint64_t pair_key(Pair p) { return (static_cast<uint64_t>(p.first) << 32) | static_cast<uint32_t>(p.second); }
Pair key_pair(uint64_t k) { return {static_cast<TokenId>(k >> 32), static_cast<TokenId>(k & 0xFFFFFFFF)}; }

// Distinct pre-tokenized pieces of the corpus with their counts (document i counted weights[i]
// times), sorted (deterministic order).
std::vector<Word> count_words(const std::vector<std::string>& corpus, const std::vector<uint64_t>& weights,
                              const BpeTrainOptions& options, tok::SplitPattern pattern) {
  tok::PreTokenizer pre;
  pre.stages.push_back({pattern, false});
  tok::AddedMatcher specials;
  for (const std::string& s : options.special_tokens) specials.add(AddedToken{0, s, true});
  specials.finish();
  std::map<std::string, uint64_t> counts;
  uint64_t weight = 1;
  auto count_segment = [&](std::string_view segment) {
    std::string normalized = options.nfc ? unicode::nfc(segment) : std::string(segment);
    pre.run(normalized, [&](std::string_view piece) { counts[std::string(piece)] += weight; });
  };
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string& text = corpus[i];
    weight = weights[i];
    size_t done = 0;
    while (auto m = specials.find(text, done, true)) {
      count_segment(std::string_view(text).substr(done, m->start - done));
      done = m->end;
    }
    count_segment(std::string_view(text).substr(done));
  }
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [piece, count] : counts) {
    Word w{{}, count};
    for (char c : piece) w.symbols.push_back(static_cast<uint8_t>(c));  // byte b has id b
    words.push_back(std::move(w));
  }
  return words;
}

class MergeLearner {
 public:
  MergeLearner(std::vector<Word> words) : words_(std::move(words)) {
    for (uint32_t i = 0; i < words_.size(); ++i) add_pairs(i, +1);
    for (const auto& [k, count] : pair_counts_) heap_.push({count, ~k});
  }

  // The most frequent pair with at least min_count occurrences, or nullopt.
  std::optional<Pair> best(uint64_t min_count) {
    while (!heap_.empty()) {
      auto [count, inverted] = heap_.top();
      heap_.pop();
      uint64_t k = ~inverted;
      auto it = pair_counts_.find(k);
      if (it == pair_counts_.end() || it->second != count) continue;  // stale entry
      if (count < min_count) return std::nullopt;
      return key_pair(k);
    }
    return std::nullopt;
  }

  // Replaces every occurrence of `pair` (left to right, non-overlapping) by `merged`.
  void apply(Pair pair, TokenId merged) {
    auto where = where_.find(pair_key(pair));
    if (where == where_.end()) return;
    std::vector<uint32_t> indices(where->second.begin(), where->second.end());
    std::sort(indices.begin(), indices.end());
    touched_.clear();
    for (uint32_t i : indices) {
      add_pairs(i, -1);
      merge_in_word(words_[i].symbols, pair, merged);
      add_pairs(i, +1);
    }
    // Every pair whose count changed (up or down) gets a fresh heap entry; older ones go stale.
    for (uint64_t key : touched_) {
      auto it = pair_counts_.find(key);
      if (it != pair_counts_.end()) heap_.push({it->second, ~key});
    }
  }

 private:
  static void merge_in_word(std::vector<TokenId>& s, Pair pair, TokenId merged) {
    size_t out = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == pair.first && s[i + 1] == pair.second) {
        s[out++] = merged;
        ++i;
      } else {
        s[out++] = s[i];
      }
    }
    s.resize(out);
  }

  void add_pairs(uint32_t index, int sign) {
    const Word& w = words_[index];
    for (size_t k = 0; k + 1 < w.symbols.size(); ++k) {
      uint64_t key = pair_key({w.symbols[k], w.symbols[k + 1]});
      uint64_t& count = pair_counts_[key];
      count = sign > 0 ? count + w.count : count - w.count;
      touched_.insert(key);
      if (sign > 0) where_[key].insert(index);
      else if (count == 0) pair_counts_.erase(key);
    }
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, uint64_t> pair_counts_;
  std::unordered_map<uint64_t, std::unordered_set<uint32_t>> where_;  // may hold stale indices
  std::unordered_set<uint64_t> touched_;  // pairs whose count apply() changed
  // (count, ~key): the highest count first, then the smallest key (the pair of smaller ids).
  std::priority_queue<std::pair<uint64_t, uint64_t>> heap_;
};

std::string byte_level_string(std::string_view bytes) {
  std::string out;
  for (char c : bytes) unicode::append_utf8(out, unicode::byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

ordered_json byte_level_step(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}

ordered_json pre_tokenizer_json(tok::SplitPattern pattern) {
  if (pattern == tok::SplitPattern::gpt2) return byte_level_step(true);
  ordered_json split = {{"type", "Split"},
                        {"pattern", {{"Regex", std::string(tok::split_pattern_regex(pattern))}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  return {{"type", "Sequence"}, {"pretokenizers", ordered_json::array({split, byte_level_step(false)})}};
}

ordered_json added_token_json(TokenId id, const std::string& content) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", true}};
}

struct LearnedVocab {
  std::vector<std::string> tokens;  // byte strings by id
  std::vector<std::pair<TokenId, TokenId>> merges;
};

std::string tokenizer_json(const LearnedVocab& learned, const BpeTrainOptions& options, tok::SplitPattern pattern) {
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < learned.tokens.size(); ++id) vocab[byte_level_string(learned.tokens[id])] = id;
  ordered_json merges = ordered_json::array();
  for (auto [a, b] : learned.merges)
    merges.push_back({byte_level_string(learned.tokens[a]), byte_level_string(learned.tokens[b])});
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < options.special_tokens.size(); ++i)
    added.push_back(added_token_json(static_cast<TokenId>(learned.tokens.size() + i), options.special_tokens[i]));
  ordered_json model = {{"type", "BPE"},           {"dropout", nullptr},          {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},       {"byte_fallback", false},      {"ignore_merges", false},
                        {"vocab", vocab},          {"merges", merges}};
  ordered_json root = {{"version", "1.0"},
                       {"truncation", nullptr},
                       {"padding", nullptr},
                       {"added_tokens", added},
                       {"normalizer", options.nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr)},
                       {"pre_tokenizer", pre_tokenizer_json(pattern)},
                       {"post_processor", byte_level_step(false)},
                       {"decoder", byte_level_step(false)},
                       {"model", model}};
  return root.dump(2, ' ', false) + "\n";
}

std::string tokenizer_config_json(const LearnedVocab& learned, const BpeTrainOptions& options) {
  ordered_json added = ordered_json::object();
  for (size_t i = 0; i < options.special_tokens.size(); ++i) {
    ordered_json entry = added_token_json(0, options.special_tokens[i]);
    entry.erase("id");
    added[std::to_string(learned.tokens.size() + i)] = entry;
  }
  auto role = [](const std::string& token) { return token.empty() ? ordered_json(nullptr) : ordered_json(token); };
  ordered_json config = {{"add_prefix_space", false},
                         {"added_tokens_decoder", added},
                         {"bos_token", role(options.bos_token)},
                         {"chat_template", chatml_jinja(options.default_system)},
                         {"clean_up_tokenization_spaces", false},
                         {"eos_token", role(options.eos_token)},
                         {"errors", "replace"},
                         {"model_max_length", options.model_max_length},
                         {"pad_token", role(options.pad_token)},
                         {"split_special_tokens", false},
                         {"tokenizer_class", "Qwen2Tokenizer"},
                         {"unk_token", nullptr}};
  return config.dump(2, ' ', false) + "\n";
}

LearnedVocab learn(std::vector<Word> words, const BpeTrainOptions& options) {
  LearnedVocab learned;
  for (int b = 0; b < 256; ++b) learned.tokens.emplace_back(1, static_cast<char>(b));
  std::map<std::string, TokenId> ids;
  for (int b = 0; b < 256; ++b) ids[learned.tokens[b]] = b;
  size_t target = options.vocab_size - options.special_tokens.size();
  MergeLearner learner(std::move(words));
  while (learned.tokens.size() < target) {
    std::optional<Pair> pair = learner.best(std::max<size_t>(options.min_pair_count, 1));
    if (!pair) break;
    std::string merged = learned.tokens[pair->first] + learned.tokens[pair->second];
    // Two different pairs can spell the same token: the merge is kept, the token reused.
    auto [it, fresh] = ids.try_emplace(merged, static_cast<TokenId>(learned.tokens.size()));
    if (fresh) learned.tokens.push_back(merged);
    learned.merges.push_back(*pair);
    learner.apply(*pair, it->second);
  }
  return learned;
}

}  // namespace

Status BpeTrainOptions::validate() const {
  if (!tok::split_pattern_by_name(split_pattern))
    return invalid_argument(fmt::format("split_pattern '{}' is not one of {}", split_pattern, tok::known_split_patterns()));
  if (vocab_size < 256 + special_tokens.size())
    return invalid_argument(fmt::format("vocab_size {} is below 256 byte tokens + {} special tokens", vocab_size,
                                        special_tokens.size()));
  std::unordered_set<std::string> seen;
  for (const std::string& s : special_tokens) {
    if (s.empty()) return invalid_argument("special_tokens: an empty token");
    if (!seen.insert(s).second) return invalid_argument(fmt::format("special_tokens: '{}' is listed twice", s));
  }
  for (auto [field, token] : {std::pair{"bos_token", &bos_token}, {"eos_token", &eos_token}, {"pad_token", &pad_token}})
    if (!token->empty() && !seen.count(*token))
      return invalid_argument(fmt::format("{} '{}' is not one of special_tokens", field, *token));
  return Status::ok();
}

Status TokenizerFiles::write(const std::filesystem::path& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("creating {}: {}", dir.string(), ec.message()));
  KZ_RETURN_IF_ERROR(write_file_atomic(dir / "tokenizer.json", tokenizer_json));
  return write_file_atomic(dir / "tokenizer_config.json", tokenizer_config_json);
}

Result<TokenizerFiles> train_byte_level_bpe(const std::vector<std::string>& corpus, const BpeTrainOptions& options) {
  return train_byte_level_bpe(corpus, std::vector<uint64_t>(corpus.size(), 1), options);
}

Result<TokenizerFiles> train_byte_level_bpe(const std::vector<std::string>& corpus, const std::vector<uint64_t>& weights,
                                            const BpeTrainOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate().with_context("BPE training options"));
  if (weights.size() != corpus.size())
    return invalid_argument(fmt::format("BPE training: {} weights for {} documents", weights.size(), corpus.size()));
  tok::SplitPattern pattern = *tok::split_pattern_by_name(options.split_pattern);
  LearnedVocab learned = learn(count_words(corpus, weights, options, pattern), options);
  return TokenizerFiles{tokenizer_json(learned, options, pattern), tokenizer_config_json(learned, options)};
}

}  // namespace kz
