// The pre-tokenizer: scanners for the split regexes of GPT-2, Qwen2 and Llama 3.
//
// Each scanner reproduces, at one position, what the regex's leftmost-first alternation matches
// (Oniguruma semantics, as Hugging Face tokenizers uses), with the classes \p{L}, \p{N} and \s
// from the generated Unicode tables. The alternatives, in order, for Qwen2 / Llama 3:
//   1 (?i:'s|'t|'re|'ve|'m|'ll|'d)      2 [^\r\n\p{L}\p{N}]?\p{L}+
//   3 \p{N} (Qwen2) / \p{N}{1,3} (Llama 3)    4 ' ?[^\s\p{L}\p{N}]+[\r\n]*'
//   5 \s*[\r\n]+    6 \s+(?!\S)    7 \s+
// and for GPT-2: 's|'t|'re|'ve|'m|'ll|'d, ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+', 6, 7.
// Every character is covered by some alternative, so the pieces tile the text.
#include <fmt/format.h>

#include "tokenizer_internal.h"
#include "unicode.h"

namespace kz::tok {
namespace {

using unicode::char_class;

struct KnownPattern {
  SplitPattern pattern;
  const char* name;
  const char* regex;
};

constexpr KnownPattern kKnownPatterns[] = {
    {SplitPattern::gpt2, "gpt2",
     R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
    {SplitPattern::qwen2, "qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {SplitPattern::llama3, "llama3",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};

const KnownPattern& known(SplitPattern pattern) {
  for (const auto& k : kKnownPatterns)
    if (k.pattern == pattern) return k;
  return kKnownPatterns[0];
}

// A character of the text being scanned: its class bits and its length in bytes. Ill-formed
// bytes are "other" characters (no class bit).
struct Char {
  uint8_t cls;
  uint32_t length;
};

Char char_at(std::string_view text, size_t pos) {
  auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) return {char_class(lead), 1};
  unicode::Utf8Step step = unicode::next_utf8(text, pos);
  return {char_class(step.code_point), step.length};
}

bool is_other(uint8_t cls) { return (cls & (unicode::kLetter | unicode::kNumber | unicode::kSpace)) == 0; }

// End of the run of characters starting at pos whose class has any of `bits` (at most `limit`).
size_t run_end(std::string_view text, size_t pos, uint8_t bits, size_t limit = SIZE_MAX) {
  for (size_t count = 0; pos < text.size() && count < limit; ++count) {
    Char c = char_at(text, pos);
    if (!(c.cls & bits)) break;
    pos += c.length;
  }
  return pos;
}

size_t other_run_end(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    Char c = char_at(text, pos);
    if (!is_other(c.cls)) break;
    pos += c.length;
  }
  return pos;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[pos] == '\'', or 0.
size_t contraction_length(std::string_view text, size_t pos, bool ignore_case) {
  auto at = [&](size_t k) -> char {
    if (pos + k >= text.size()) return 0;
    char c = text[pos + k];
    return ignore_case && c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  };
  char a = at(1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  char b = at(2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Alternatives 5-7 at a white-space character: \s*[\r\n]+ (Qwen2/Llama 3 only), \s+(?!\S), \s+.
size_t white_space_end(std::string_view text, size_t pos, bool newline_rule) {
  size_t end = pos, last_start = pos, after_newline = 0, count = 0;
  while (end < text.size()) {
    Char c = char_at(text, end);
    if (!(c.cls & unicode::kSpace)) break;
    last_start = end;
    end += c.length;
    ++count;
    if (c.cls & unicode::kNewline) after_newline = end;
  }
  if (newline_rule && after_newline != 0) return after_newline;  // \s* backs off to the last newline
  if (end == text.size() || count < 2) return end;               // (?!\S) holds at the end
  return last_start;  // leave the last space to join the next word
}

size_t qwen_like_piece_end(std::string_view text, size_t pos, size_t max_digits) {
  const size_t n = text.size();
  Char c0 = char_at(text, pos);
  if (text[pos] == '\'') {
    if (size_t len = contraction_length(text, pos, /*ignore_case=*/true)) return pos + len;
  }
  if (c0.cls & unicode::kLetter) return run_end(text, pos, unicode::kLetter);
  size_t next = pos + c0.length;
  bool may_prefix = !(c0.cls & (unicode::kNumber | unicode::kNewline));  // [^\r\n\p{L}\p{N}]
  if (may_prefix && next < n && (char_at(text, next).cls & unicode::kLetter))
    return run_end(text, next, unicode::kLetter);
  if (c0.cls & unicode::kNumber) return run_end(text, pos, unicode::kNumber, max_digits);
  size_t start = text[pos] == ' ' ? next : pos;  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  if (start < n && is_other(char_at(text, start).cls)) {
    size_t end = other_run_end(text, start);
    while (end < n && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end;
  }
  return white_space_end(text, pos, /*newline_rule=*/true);
}

size_t gpt2_piece_end(std::string_view text, size_t pos) {
  const size_t n = text.size();
  if (text[pos] == '\'') {
    if (size_t len = contraction_length(text, pos, /*ignore_case=*/false)) return pos + len;
  }
  size_t start = text[pos] == ' ' && pos + 1 < n ? pos + 1 : pos;  // the optional ' '
  Char c = char_at(text, start);
  if (c.cls & unicode::kLetter) return run_end(text, start, unicode::kLetter);
  if (c.cls & unicode::kNumber) return run_end(text, start, unicode::kNumber);
  if (is_other(c.cls)) return other_run_end(text, start);
  return white_space_end(text, pos, /*newline_rule=*/false);
}

}  // namespace

std::optional<SplitPattern> find_split_pattern(std::string_view regex) {
  for (const auto& k : kKnownPatterns)
    if (regex == k.regex) return k.pattern;
  return std::nullopt;
}

std::string_view split_pattern_regex(SplitPattern pattern) { return known(pattern).regex; }
std::string_view split_pattern_name(SplitPattern pattern) { return known(pattern).name; }

std::optional<SplitPattern> split_pattern_by_name(std::string_view name) {
  for (const auto& k : kKnownPatterns)
    if (name == k.name) return k.pattern;
  return std::nullopt;
}

std::string known_split_patterns() {
  std::string names;
  for (const auto& k : kKnownPatterns) names += (names.empty() ? "" : ", ") + std::string(k.name);
  return names;
}

size_t next_piece_end(SplitPattern pattern, std::string_view text, size_t pos) {
  switch (pattern) {
    case SplitPattern::gpt2: return gpt2_piece_end(text, pos);
    case SplitPattern::qwen2: return qwen_like_piece_end(text, pos, 1);
    case SplitPattern::llama3: return qwen_like_piece_end(text, pos, 3);
  }
  return text.size();
}

void PreTokenizer::run(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  if (!text.empty()) run_stage(0, text, piece);
}

void PreTokenizer::run_stage(size_t stage, std::string_view text,
                             const std::function<void(std::string_view)>& piece) const {
  if (stage == stages.size()) {
    piece(text);
    return;
  }
  const PreTokenizerStage& s = stages[stage];
  std::string prefixed;
  if (s.add_prefix_space && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;  // (not " " + std::string(text): gcc 12 warns falsely, -Wrestrict)
    text = prefixed;
  }
  if (!s.split) {
    run_stage(stage + 1, text, piece);
    return;
  }
  for (size_t pos = 0; pos < text.size();) {
    size_t end = next_piece_end(*s.split, text, pos);
    run_stage(stage + 1, text.substr(pos, end - pos), piece);
    pos = end;
  }
}

}  // namespace kz::tok
