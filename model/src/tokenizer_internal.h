// The parts of the tokenizer (tokenizer.h) shared by its source files: the pre-tokenizer, the BPE
// model with its merge table and word cache, the added-token matcher, and Tokenizer::Impl.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kz/model/tokenizer.h"

namespace kz::tok {

// Lets unordered maps keyed by std::string be searched with a string_view (no allocation).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// ---- pre-tokenizer (tokenizer_pretokenize.cpp) ----

// The split regexes this tokenizer knows, each implemented by a scanner.
enum class SplitPattern {
  gpt2,    // GPT-2's ByteLevel regex: 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  qwen2,   // Qwen2/2.5/3: case-insensitive contractions, [^\r\n\p{L}\p{N}]?\p{L}+, single \p{N}, ...
  llama3,  // Llama 3: as qwen2 but \p{N}{1,3}
};

// The pattern whose regex is exactly `regex`, if known.
std::optional<SplitPattern> find_split_pattern(std::string_view regex);
std::string_view split_pattern_regex(SplitPattern pattern);
std::string_view split_pattern_name(SplitPattern pattern);
std::optional<SplitPattern> split_pattern_by_name(std::string_view name);
// Comma-separated names of the known patterns (for error messages).
std::string known_split_patterns();

// The byte offset where the piece starting at `pos` (< text.size()) ends, as the regex's
// leftmost-first alternation would match there.
size_t next_piece_end(SplitPattern pattern, std::string_view text, size_t pos);

// One step of the pre-tokenizer: a Split (a known regex, Isolated) or a ByteLevel (optionally
// prefixing a space, optionally splitting with GPT-2's regex).
struct PreTokenizerStage {
  std::optional<SplitPattern> split;
  bool add_prefix_space = false;  // prepend ' ' to each piece that does not start with one
};

class PreTokenizer {
 public:
  std::vector<PreTokenizerStage> stages;
  // Calls `piece` for each non-empty piece of `text`, in order.
  void run(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  void run_stage(size_t stage, std::string_view text, const std::function<void(std::string_view)>& piece) const;
};

// ---- BPE (tokenizer_bpe.cpp) ----

struct Merge {
  uint32_t rank;    // position in the merges list: lower merges first
  TokenId merged;   // the token the pair becomes
};

// Open-addressing hash map from a pair of token ids to its merge: the hottest lookup of encoding.
class PairMap {
 public:
  void reserve(size_t count);
  void insert(TokenId left, TokenId right, Merge merge);  // replaces an existing entry
  const Merge* find(TokenId left, TokenId right) const;
  size_t size() const { return size_; }

 private:
  static uint64_t key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow();

  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t size_ = 0;
  int shift_ = 64;
};

// The ids of recently encoded pieces. Code repeats the same words endlessly, so most pieces are
// found here. Open addressing over two arenas (keys, ids): no allocation per entry, one probe
// usually. It stops growing at kMaxEntries. Not thread-safe: each thread has its own (BpeModel).
class WordCache {
 public:
  bool lookup(std::string_view word, std::vector<TokenId>& out) const;  // appends to out on a hit
  void insert(std::string_view word, std::span<const TokenId> ids);
  void clear();
  static constexpr size_t kMaxEntries = 1 << 16;
  static constexpr size_t kMaxWordBytes = 256;

 private:
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint32_t key_offset = 0, ids_offset = 0;
    uint16_t key_length = 0, ids_length = 0;
  };
  static constexpr size_t kSlots = 2 * kMaxEntries;  // a power of two, at most half full
  static uint64_t hash_of(std::string_view word) { return std::hash<std::string_view>{}(word) | 1; }

  std::vector<Slot> slots_;  // allocated on the first insert
  std::string keys_;
  std::vector<TokenId> ids_;
  size_t entries_ = 0;
};

class BpeModel {
 public:
  std::array<TokenId, 256> byte_ids;  // the single-byte token of each byte; -1 when absent
  PairMap merges;
  bool ignore_merges = false;  // a piece that is itself a token is emitted whole (Llama 3)
  StringMap<TokenId> byte_tokens;  // raw bytes -> id, for ignore_merges
  std::optional<TokenId> unk;  // emitted for a byte without a token (else the byte is dropped)
  bool fuse_unk = false;       // consecutive unknown bytes give one unk

  BpeModel();
  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode(std::string_view word, std::vector<TokenId>& out) const;

 private:
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;
  // This thread's cache, emptied when it last served another model: a thread-local cache needs
  // no lock on the hot path (a shared one spent a quarter of encoding time in the lock).
  WordCache& cache() const;
  uint64_t serial_;  // unique per model, so a cache never serves a later model at the same address
};

// ---- added tokens (tokenizer.cpp) ----

// Finds added tokens in text with leftmost-longest semantics, as tokenizers' Aho-Corasick does.
class AddedMatcher {
 public:
  void add(const AddedToken& token);  // call finish() after the last add
  void finish();
  bool empty() const { return tokens_.empty(); }

  struct Match {
    size_t start, end;  // the bytes the token replaces (lstrip/rstrip white space included)
    TokenId id;
  };
  // The next usable match in text[from, ...), or none; lstrip never reaches before `from` (the
  // end of the previous match).
  std::optional<Match> find(std::string_view text, size_t from, bool allow_special) const;

 private:
  // The index in tokens_ of the longest token starting at text[pos], if any.
  std::optional<size_t> longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // token indices, longest first
};

}  // namespace kz::tok

namespace kz {

struct Tokenizer::Impl {
  std::string origin;
  std::vector<std::string> id_to_token;  // vocabulary string of each id; holes are ""
  std::vector<std::string> id_to_bytes;  // what each id decodes to
  std::vector<uint8_t> id_known;         // 1 when the id exists
  std::vector<uint8_t> id_special;       // 1 for special added tokens
  tok::StringMap<TokenId> token_to_id;  // vocabulary and added tokens
  std::vector<AddedToken> added;
  tok::AddedMatcher raw_matcher;         // added tokens with normalized = false
  tok::AddedMatcher normalized_matcher;  // added tokens with normalized = true
  bool nfc = false;
  tok::PreTokenizer pre_tokenizer;
  tok::BpeModel bpe;

  // Appends the ids of a segment free of raw added tokens: normalise, split, BPE.
  void encode_segment(std::string_view text, bool allow_special, std::vector<TokenId>& out) const;
};

}  // namespace kz
