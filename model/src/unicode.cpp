// Unicode helpers (unicode.h) over the generated tables.
#include "unicode.h"

#include <algorithm>
#include <array>
#include <vector>

#include "unicode_tables.h"

namespace kz::unicode {
namespace {

namespace t = tables;

// The allowed range of the second byte after a lead byte (Unicode Table 3-7); later continuation
// bytes are always 0x80..0xBF. {0, 0} marks a byte that cannot start a sequence.
struct LeadInfo {
  uint8_t length;
  uint8_t second_low, second_high;
};

LeadInfo lead_info(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead < 0xC2) return {0, 0, 0};
  if (lead < 0xE0) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (lead < 0xF0) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead < 0xF4) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};  // nothing past U+10FFFF
  return {0, 0, 0};
}

Utf8Step step_multibyte(std::string_view text, size_t i, LeadInfo info) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  uint8_t lead = byte(i);
  char32_t cp = lead & (0xFF >> (info.length + 1));
  for (uint32_t k = 1; k < info.length; ++k) {
    if (i + k >= text.size()) return {kInvalid, k, Utf8Status::truncated};
    uint8_t b = byte(i + k);
    uint8_t low = k == 1 ? info.second_low : 0x80, high = k == 1 ? info.second_high : 0xBF;
    if (b < low || b > high) return {kInvalid, k, Utf8Status::invalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, info.length, Utf8Status::ok};
}

// Index of the category run holding cp. Consecutive lookups often fall in the same run (CJK
// ideographs, a word in one script), so the last run found is tried first.
size_t find_run(char32_t cp) {
  thread_local size_t hint = 0;
  auto start = [](size_t k) { return t::kCategoryRuns[k].first; };
  size_t n = t::kCategoryRunCount;
  if (hint < n && start(hint) <= cp && (hint + 1 == n || cp < start(hint + 1))) return hint;
  size_t lo = 0, hi = n;  // invariant: start(lo) <= cp < start(hi)
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (start(mid) <= cp) lo = mid;
    else hi = mid;
  }
  hint = lo;
  return lo;
}

uint8_t class_of_category(Category c, bool white_space) {
  uint8_t bits = white_space ? kSpace : 0;
  if (c <= Category::Lo) bits |= kLetter;
  else if (c <= Category::Me) bits |= kMark;
  else if (c <= Category::No) bits |= kNumber;
  else if (c == Category::Pc) bits |= kWordPunct;
  return bits;
}

bool in_ranges(char32_t cp, const t::CodePointRange* ranges, size_t count) {
  auto end = ranges + count;
  auto it = std::upper_bound(ranges, end, cp, [](char32_t v, const t::CodePointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// ---- NFC internals ----
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

bool needs_nfc_work(char32_t cp) {
  return cp >= 0x300 && cp != kInvalid &&
         (combining_class(cp) != 0 || in_ranges(cp, t::kNfcQuickCheckNotYes, t::kNfcQuickCheckNotYesCount));
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {  // Hangul syllable: L V (T)
    char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  auto end = t::kDecompositions + t::kDecompositionCount;
  auto it = std::lower_bound(t::kDecompositions, end, cp,
                             [](const t::Decomposition& d, char32_t v) { return d.code_point < v; });
  if (it == end || it->code_point != cp) {
    out += cp;
    return;
  }
  for (uint32_t k = 0; k < it->length; ++k) out += static_cast<char32_t>(t::kDecompositionPool[it->offset + k]);
}

// The primary composite of a + b, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto end = t::kCompositions + t::kCompositionCount;
  auto it = std::lower_bound(t::kCompositions, end, std::pair{a, b}, [](const t::Composition& c, std::pair<char32_t, char32_t> v) {
    return c.first < v.first || (c.first == v.first && c.second < v.second);
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// Stable sort of each run of non-starters by combining class (canonical ordering).
void canonical_order(std::u32string& s) {
  for (size_t i = 1; i < s.size(); ++i) {
    uint8_t ccc = combining_class(s[i]);
    if (ccc == 0) continue;
    for (size_t k = i; k > 0 && combining_class(s[k - 1]) > ccc; --k) std::swap(s[k - 1], s[k]);
  }
}

// The canonical composition algorithm of UAX #15 over decomposed, ordered text.
void compose_all(std::u32string& s) {
  if (s.empty()) return;
  size_t starter = 0, out = 1;
  int last_ccc = combining_class(s[0]) == 0 ? 0 : 256;  // a leading non-starter composes with nothing
  for (size_t i = 1; i < s.size(); ++i) {
    char32_t c = s[i];
    int ccc = combining_class(c);
    char32_t composite = compose(s[starter], c);
    bool blocked = last_ccc != 0 && last_ccc >= ccc;
    if (composite != 0 && !blocked) {
      s[starter] = composite;
      continue;
    }
    if (ccc == 0) starter = out;
    last_ccc = ccc;
    s[out++] = c;
  }
  s.resize(out);
}

// NFC of a region of well-formed text.
void nfc_region(std::string_view region, std::string& out) {
  std::u32string cps;
  for (size_t i = 0; i < region.size();) {
    Utf8Step step = next_utf8(region, i);
    decompose(step.code_point, cps);
    i += step.length;
  }
  canonical_order(cps);
  compose_all(cps);
  for (char32_t c : cps) append_utf8(out, c);
}

}  // namespace

Utf8Step next_utf8(std::string_view text, size_t i) {
  uint8_t lead = static_cast<uint8_t>(text[i]);
  if (lead < 0x80) return {lead, 1, Utf8Status::ok};
  LeadInfo info = lead_info(lead);
  if (info.length == 0) return {kInvalid, 1, Utf8Status::invalid};
  return step_multibyte(text, i, info);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_valid_utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    Utf8Step step = next_utf8(bytes, i);
    if (step.status == Utf8Status::ok) out.append(bytes.substr(i, step.length));
    else append_utf8(out, kReplacement);
    i += step.length;
  }
  return out;
}

Category category(char32_t cp) {
  if (cp > 0x10FFFF) return Category::Cn;
  return static_cast<Category>(t::kCategoryRuns[find_run(cp)].category);
}

bool is_white_space(char32_t cp) {
  return std::binary_search(t::kWhiteSpace, t::kWhiteSpace + t::kWhiteSpaceCount, static_cast<uint32_t>(cp));
}

uint8_t char_class_slow(char32_t cp) {
  if (cp == kInvalid) return 0;
  Category c = category(cp);
  bool space = (c >= Category::Zs && c <= Category::Zp) || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85;  // White_Space
  return class_of_category(c, space);
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300 || cp == kInvalid) return 0;
  auto end = t::kCombiningClasses + t::kCombiningClassCount;
  auto it = std::upper_bound(t::kCombiningClasses, end, cp,
                             [](char32_t v, const t::CombiningClassRange& r) { return v < r.first; });
  return it != t::kCombiningClasses && cp <= (it - 1)->last ? (it - 1)->ccc : 0;
}

bool is_nfc_quick(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Step step = next_utf8(text, i);
    if (needs_nfc_work(step.code_point)) return false;
    i += step.length;
  }
  return true;
}

// Only the regions around characters that may change are normalised: a region runs from the
// last untroubled, well-formed character before the trouble (it may compose with what follows)
// to the next untroubled character (a starter that composes with nothing before it).
std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  size_t copied = 0, previous = 0;  // previous: start of the last untroubled well-formed character
  bool have_previous = false;
  for (size_t i = 0; i < text.size();) {
    Utf8Step step = next_utf8(text, i);
    if (!needs_nfc_work(step.code_point)) {
      have_previous = step.status == Utf8Status::ok;
      previous = i;
      i += step.length;
      continue;
    }
    size_t start = have_previous && previous >= copied ? previous : i;
    size_t end = i;
    while (end < text.size()) {
      Utf8Step s = next_utf8(text, end);
      if (s.status != Utf8Status::ok || !needs_nfc_work(s.code_point)) break;
      end += s.length;
    }
    out.append(text.substr(copied, start - copied));
    nfc_region(text.substr(start, end - start), out);
    copied = i = end;
    have_previous = false;
  }
  out.append(text.substr(copied));
  return out;
}

char32_t byte_to_char(uint8_t byte) {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> m{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return m;
  }();
  return table[byte];
}

int char_to_byte(char32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> m{};
    m.fill(-1);
    for (int b = 0; b < 256; ++b) m[byte_to_char(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return m;
  }();
  return cp < table.size() ? table[cp] : -1;
}

const char* unicode_version() { return t::kUnicodeVersion; }

}  // namespace kz::unicode
