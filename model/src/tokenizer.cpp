// Tokenizer (tokenizer.h): encoding, decoding, lookups, the added-token matcher and the stream
// decoder. Loading lives in tokenizer_load.cpp, the pre-tokenizer and BPE in their own files.
#include <algorithm>

#include "tokenizer_internal.h"
#include "unicode.h"

namespace kz {
namespace tok {
namespace {

// Start of the white space that ends text[floor, pos) (tokenizers' lstrip).
size_t white_space_start_before(std::string_view text, size_t floor, size_t pos) {
  while (pos > floor) {
    size_t start = pos - 1;
    while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    unicode::Utf8Step step = unicode::next_utf8(text, start);
    if (step.status != unicode::Utf8Status::ok || start + step.length != pos ||
        !unicode::is_white_space(step.code_point))
      break;
    pos = start;
  }
  return pos;
}

// End of the white space that starts at text[pos] (tokenizers' rstrip).
size_t white_space_end_after(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    unicode::Utf8Step step = unicode::next_utf8(text, pos);
    if (step.status != unicode::Utf8Status::ok || !unicode::is_white_space(step.code_point)) break;
    pos += step.length;
  }
  return pos;
}

// A \w character as Rust's regex crate (tokenizers' single_word) sees it: Alphabetic, marks,
// decimal digits, connector punctuation and the joiners. Alphabetic is letters, letter numbers
// and the symbols that are Other_Alphabetic (circled and squared Latin letters).
bool is_word_char(char32_t cp) {
  using unicode::Category;
  if (cp == unicode::kInvalid) return false;
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
      (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  Category c = unicode::category(cp);
  return c <= Category::Me || c == Category::Nd || c == Category::Nl || c == Category::Pc;
}

bool word_char_before(std::string_view text, size_t pos) {
  if (pos == 0) return false;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return is_word_char(unicode::next_utf8(text, start).code_point);
}

bool word_char_after(std::string_view text, size_t pos) {
  return pos < text.size() && is_word_char(unicode::next_utf8(text, pos).code_point);
}

// Splits `text` around the added tokens `matcher` finds: `token(id)` for each, `segment(view)`
// for the text between them.
template <class OnToken, class OnSegment>
void split_added(const AddedMatcher& matcher, std::string_view text, bool allow_special, OnToken&& token,
                 OnSegment&& segment) {
  size_t done = 0;
  while (done < text.size()) {
    std::optional<AddedMatcher::Match> m = matcher.empty() ? std::nullopt : matcher.find(text, done, allow_special);
    if (!m) break;
    if (m->start > done) segment(text.substr(done, m->start - done));
    token(m->id);
    done = m->end;
  }
  if (done < text.size()) segment(text.substr(done));
}

}  // namespace

void AddedMatcher::add(const AddedToken& token) {
  if (!token.content.empty()) tokens_.push_back(token);
}

void AddedMatcher::finish() {
  for (auto& bucket : by_first_byte_) bucket.clear();
  for (size_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(static_cast<uint32_t>(i));
  for (auto& bucket : by_first_byte_)
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

std::optional<size_t> AddedMatcher::longest_at(std::string_view text, size_t pos) const {
  for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[pos])])
    if (text.substr(pos).starts_with(tokens_[index].content)) return index;
  return std::nullopt;
}

// A match that is not usable (a special token when specials are off, a single_word token inside
// a word) still consumes its bytes, as in tokenizers' non-overlapping Aho-Corasick iteration.
std::optional<AddedMatcher::Match> AddedMatcher::find(std::string_view text, size_t from, bool allow_special) const {
  for (size_t pos = from; pos < text.size();) {
    if (by_first_byte_[static_cast<uint8_t>(text[pos])].empty()) {
      ++pos;
      continue;
    }
    std::optional<size_t> index = longest_at(text, pos);
    if (!index) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[*index];
    size_t start = pos, end = pos + token.content.size();
    bool skip = (token.special && !allow_special) ||
                (token.single_word && (word_char_before(text, start) || word_char_after(text, end)));
    if (skip) {
      pos = end;
      continue;
    }
    if (token.lstrip) start = white_space_start_before(text, from, start);
    if (token.rstrip) end = white_space_end_after(text, end);
    return Match{start, end, token.id};
  }
  return std::nullopt;
}

}  // namespace tok

void Tokenizer::Impl::encode_segment(std::string_view text, bool allow_special, std::vector<TokenId>& out) const {
  std::string normalized;
  if (nfc && !unicode::is_nfc_quick(text)) {
    normalized = unicode::nfc(text);
    text = normalized;
  }
  auto bpe_piece = [&](std::string_view piece) { bpe.encode(piece, out); };
  tok::split_added(
      normalized_matcher, text, allow_special, [&](TokenId id) { out.push_back(id); },
      [&](std::string_view segment) { pre_tokenizer.run(segment, bpe_piece); });
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  tok::split_added(
      impl_->raw_matcher, text, allow_special, [&](TokenId id) { out.push_back(id); },
      [&](std::string_view segment) { impl_->encode_segment(segment, allow_special, out); });
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_known.size() || !impl_->id_known[id]) continue;
    if (skip_special && impl_->id_special[id]) continue;
    bytes += impl_->id_to_bytes[id];
  }
  return unicode::to_valid_utf8_lossy(bytes);
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::string normalized = impl_->nfc ? unicode::nfc(text) : std::string(text);
  std::vector<std::string> pieces;
  impl_->pre_tokenizer.run(normalized, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_to_id.find(token);
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_known.size() || !impl_->id_known[id]) return std::nullopt;
  return std::string_view(impl_->id_to_token[id]);
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_known.size() || !impl_->id_known[id]) return {};
  return impl_->id_to_bytes[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[id];
}

size_t Tokenizer::vocab_size() const { return impl_->id_known.size(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::origin() const { return impl_->origin; }

// Emits everything but a trailing well-formed prefix of a character (it may still complete).
std::string TokenStreamDecoder::push(TokenId id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  size_t keep_from = pending_.size();
  for (size_t i = 0; i < pending_.size();) {
    unicode::Utf8Step step = unicode::next_utf8(pending_, i);
    if (step.status == unicode::Utf8Status::truncated) {
      keep_from = i;
      break;
    }
    i += step.length;
  }
  std::string text = unicode::to_valid_utf8_lossy(std::string_view(pending_).substr(0, keep_from));
  pending_.erase(0, keep_from);
  return text;
}

std::string TokenStreamDecoder::finish() {
  std::string text = unicode::to_valid_utf8_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace kz
