// The byte-level BPE tokenizer of the in-process model engine, loaded from a Hugging Face
// `tokenizer.json` (Qwen2 / Qwen2.5 / Qwen3, Llama 3, GPT-2 style) and giving the same token ids
// as the `tokenizers` library.
//
// Encoding: added tokens are split out first (leftmost-longest match; special ones only when
// allow_special), the rest is NFC-normalised when the file asks for it, cut into pieces by the
// model's split pattern (a hand-written scanner per known regex, no regex engine), and each piece
// is BPE-merged over its UTF-8 bytes by merge rank, with a per-piece cache.
//
// Supported tokenizer.json: model BPE (merges as "a b" strings or [a, b] pairs, ignore_merges),
// normalizer none or NFC, pre_tokenizer ByteLevel or Sequence[Split(known regex), ByteLevel],
// decoder ByteLevel. Anything else is an invalid_argument error naming the field and the file.
// post_processor is ignored: encode() never adds BOS/EOS (callers or the chat template do).
//
// Copies share the (immutable) tables; every const method may be called from several threads at
// once. Each encoding thread keeps its own cache of encoded pieces (at most 65,536 pieces, a few
// MB), reset when the thread switches to another tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/status.h"
#include "kz/model/chat_template.h"

namespace kz {

using TokenId = int32_t;

// An entry of tokenizer.json's added_tokens.
struct AddedToken {
  TokenId id = 0;
  std::string content;       // matched verbatim in the input text
  bool special = false;      // dropped by decode(skip_special); matched only when allow_special
  bool single_word = false;  // only matched when not inside a word
  bool lstrip = false;       // the match swallows white space on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched in the normalised text instead of the raw text
};

// Token roles from tokenizer_config.json (bos_token, eos_token, pad_token); unset when absent.
struct SpecialTokens {
  std::optional<TokenId> bos, eos, pad;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one. A tokenizer_config.json beside it
  // is read too when present (bos/eos/pad tokens, chat template). Errors: not_found / io_error for
  // the files, parse_error for malformed JSON, invalid_argument for unsupported or inconsistent
  // content; each message names the file and the field.
  static Result<Tokenizer> load(const std::filesystem::path& path);
  // From the text of a tokenizer.json; `origin` names it in error messages.
  static Result<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view origin = "tokenizer.json");
  // Applies the text of a tokenizer_config.json (as load() does for the file beside tokenizer.json).
  Status apply_config(std::string_view tokenizer_config_json, std::string_view origin = "tokenizer_config.json");

  // Token ids of `text`, as tokenizers' encode(text, add_special_tokens=False). With
  // allow_special false, special tokens written in the text are encoded as plain text (as with
  // split_special_tokens): use it for untrusted content. Never fails: bytes that are not valid
  // UTF-8 are encoded as bytes.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = true) const;
  // The text of `ids` (byte-level decoding; ill-formed UTF-8 becomes U+FFFD, one per maximal
  // invalid subpart). Ids outside the vocabulary are skipped, as tokenizers does (a model's
  // embedding table is often padded past the vocabulary).
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The pieces the pre-tokenizer cuts `text` into (after normalisation; added tokens are not
  // split out): for tests and debugging, as tokenizers' pre_tokenize_str.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // Lookups by the token's vocabulary string ("Ġhello", "<|im_end|>"); added tokens first.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(TokenId id) const;
  // The raw bytes token `id` decodes to (not necessarily valid UTF-8 on its own); empty for an
  // unknown id.
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;

  // Highest token id + 1 (the rows an embedding table needs), added tokens included.
  size_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  const SpecialTokens& special_tokens() const { return special_; }
  std::optional<TokenId> bos_id() const { return special_.bos; }
  std::optional<TokenId> eos_id() const { return special_.eos; }
  std::optional<TokenId> pad_id() const { return special_.pad; }
  const ChatTemplate& chat_template() const { return chat_template_; }
  // Where it was loaded from (for messages).
  const std::string& origin() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // the vocabulary and the BPE tables, shared by copies
  // From tokenizer_config.json; per object, so apply_config() never changes another copy.
  SpecialTokens special_;
  ChatTemplate chat_template_;
};

// Decodes a stream of generated tokens into text as they arrive. Byte-level tokens can end in
// the middle of a UTF-8 character; push() holds such bytes back until the character is complete,
// so what it returns is always valid UTF-8, and the concatenation of every push() and the final
// finish() equals decode() of all the ids.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(Tokenizer tokenizer, bool skip_special = false)
      : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

  // The text that `id` completes (possibly empty).
  std::string push(TokenId id);
  // What is still held back, with an incomplete character as U+FFFD; the decoder is then empty.
  std::string finish();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of a character not yet complete
};

// Copies the files of a Hugging Face checkpoint that are neither config.json nor weights (the
// tokenizer's and the generation config) from `from` into `to`, those that exist: a checkpoint
// written from a loaded model carries them for Engine::load and for transformers.
Status copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace kz
