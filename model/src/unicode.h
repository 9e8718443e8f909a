// Unicode helpers for the tokenizer: UTF-8 stepping with the replacement rules of Rust and
// Python (one U+FFFD per maximal invalid subpart), general categories and White_Space for the
// pre-tokenizer's character classes, NFC normalisation, and GPT-2's byte <-> character map.
//
// The data comes from the generated unicode_tables.cpp (model/tools/gen_unicode_tables.py), so
// there is no ICU dependency. Text that is not valid UTF-8 is never an error here: invalid bytes
// are stepped over as their own "characters" of category Cn, so byte-level BPE still round-trips
// them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kz::unicode {

// Stands for an invalid UTF-8 subpart when stepping through text.
inline constexpr char32_t kInvalid = 0xFFFFFFFF;
inline constexpr char32_t kReplacement = 0xFFFD;

enum class Utf8Status : uint8_t {
  ok,         // a well-formed character
  invalid,    // a maximal subpart of an ill-formed sequence (replace with one U+FFFD)
  truncated,  // a well-formed prefix cut by the end of the input (more bytes may complete it)
};

struct Utf8Step {
  char32_t code_point;  // kInvalid unless status is ok
  uint32_t length;      // bytes consumed, >= 1
  Utf8Status status;
};

// The character (or ill-formed subpart) starting at text[i]; i < text.size().
Utf8Step next_utf8(std::string_view text, size_t i);
void append_utf8(std::string& out, char32_t code_point);
// `bytes` with each ill-formed subpart replaced by U+FFFD (as Rust's from_utf8_lossy does).
std::string to_valid_utf8_lossy(std::string_view bytes);

// General categories, in the generator's order.
enum class Category : uint8_t {
  Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po,
  Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co, Cn,
};
Category category(char32_t code_point);  // kInvalid -> Cn
bool is_white_space(char32_t code_point);  // Unicode White_Space, i.e. a regex \s

// The pre-tokenizer's classes as bits (a code point can be in none of them: "other").
enum CharClass : uint8_t {
  kLetter = 1,   // \p{L}
  kNumber = 2,   // \p{N}
  kSpace = 4,    // \s
  kNewline = 8,  // \r or \n (also kSpace)
  kMark = 16,    // \p{M}
  kWordPunct = 32,  // \p{Pc} (connector punctuation such as '_'), for \w
};
// From the tables, for any code point (without kNewline, which only the ASCII table sets).
uint8_t char_class_slow(char32_t code_point);

// ASCII classes as a constant table: the pre-tokenizer asks for every character.
inline constexpr auto kAsciiClasses = [] {
  std::array<uint8_t, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) classes[c] = kLetter;
    else if (c >= '0' && c <= '9') classes[c] = kNumber;
    else if (c == ' ' || (c >= '\t' && c <= '\r')) classes[c] = kSpace;
    else if (c == '_') classes[c] = kWordPunct;
  }
  classes['\r'] |= kNewline;
  classes['\n'] |= kNewline;
  return classes;
}();

inline uint8_t char_class(char32_t code_point) {
  return code_point < 128 ? kAsciiClasses[code_point] : char_class_slow(code_point);
}

// ---- NFC ----
uint8_t combining_class(char32_t code_point);
// True when NFC leaves `text` unchanged for certain (quick check: no character that decomposes
// or may compose with its predecessor, marks in canonical order).
bool is_nfc_quick(std::string_view text);
// Canonical composition of `text`; ill-formed bytes pass through unchanged.
std::string nfc(std::string_view text);

// ---- GPT-2 byte-level alphabet ----
// Every byte maps to a printable character: bytes that are printable in Latin-1 ('!'..'~',
// U+00A1..U+00AC, U+00AE..U+00FF) map to themselves, the others to U+0100 upwards in order.
char32_t byte_to_char(uint8_t byte);
// The inverse, or -1 for a character outside the alphabet.
int char_to_byte(char32_t code_point);

const char* unicode_version();

}  // namespace kz::unicode
