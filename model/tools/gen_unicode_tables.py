#!/usr/bin/env python3
"""Generates model/src/unicode_tables.cpp: the Unicode data the tokenizer needs, without ICU.

Tables (all sorted, searched by binary search):
  - general category: one entry per run of code points sharing a category (the run ends where
    the next one starts), for the pre-tokenizer's \\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S} classes;
  - White_Space (what Oniguruma's \\s matches: U+0009..000D, U+0085 and Zs/Zl/Zp);
  - NFC: canonical combining classes (ranges), full canonical decompositions, primary
    compositions (pairs that NFC recomposes; exclusions and singletons left out), and the code
    points that make a string fail the NFC quick check (decompose or may compose backwards).
Hangul syllables are algorithmic and handled in unicode.cpp, not tabulated.

Usage: python3 gen_unicode_tables.py > model/src/unicode_tables.cpp
The Unicode version should match the one Hugging Face `tokenizers` compiles its regex engine
(Oniguruma) with: 16.0 for tokenizers 0.2x. The standard library's unicodedata is often older,
so the `unicodedata2` backport is used when importable: pip install unicodedata2==16.0.0.
"""
import sys

try:
    import unicodedata2 as ud
except ImportError:  # older tables: letters/digits of recent scripts are then classed "other"
    import unicodedata as ud

MAX_CP = 0x110000
# Hugging Face tokenizers' NFC (its unicode-normalization-alignments crate) has Unicode 12 data:
# it neither composes nor decomposes these composites, which Unicode 13 (U+11938) and 16 added.
# They are left out of the NFC tables so that normalised text, and so token ids, match it.
TOKENIZERS_UNKNOWN_COMPOSITES = {
    0x105C9, 0x105E4, 0x11383, 0x11385, 0x1138E, 0x11391, 0x113C5, 0x113C7, 0x113C8, 0x11938,
    0x16121, 0x16122, 0x16123, 0x16124, 0x16125, 0x16126, 0x16127, 0x16128, 0x16D68, 0x16D69, 0x16D6A}
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
              "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs",
              "Co", "Cn"]


def category_runs():
    runs, last = [], None
    for cp in range(MAX_CP):
        cat = ud.category(chr(cp))
        if cat != last:
            runs.append((cp, CATEGORIES.index(cat)))
            last = cat
    return runs


def white_space():
    return [cp for cp in range(MAX_CP)
            if 0x09 <= cp <= 0x0D or cp == 0x85 or ud.category(chr(cp)) in ("Zs", "Zl", "Zp")]


def combining_class_ranges():
    ranges = []
    for cp in range(MAX_CP):
        ccc = ud.combining(chr(cp))
        if ccc == 0:
            continue
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == ccc:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, ccc])
    return ranges


def is_hangul_syllable(cp):
    return HANGUL_FIRST <= cp <= HANGUL_LAST


def decompositions():
    out = []
    for cp in range(MAX_CP):
        if is_hangul_syllable(cp) or 0xD800 <= cp <= 0xDFFF or cp in TOKENIZERS_UNKNOWN_COMPOSITES:
            continue
        nfd = ud.normalize("NFD", chr(cp))
        if nfd != chr(cp):
            out.append((cp, [ord(c) for c in nfd]))
    return out


def compositions():
    """(first, second) -> composite for every primary composite (NFC keeps it composed)."""
    out = []
    for cp in range(MAX_CP):
        if is_hangul_syllable(cp) or cp in TOKENIZERS_UNKNOWN_COMPOSITES:
            continue
        raw = ud.decomposition(chr(cp))
        if not raw or raw.startswith("<"):
            continue
        parts = [int(p, 16) for p in raw.split()]
        if len(parts) == 2 and ud.normalize("NFC", chr(cp)) == chr(cp):
            out.append((parts[0], parts[1], cp))
    out.sort()
    return out


def quick_check_not_yes(comps):
    """Code points whose NFC_Quick_Check is No (NFC changes them) or Maybe (may compose with what
    precedes): a string without them, and with canonically ordered marks, is already NFC."""
    cps = {second for _, second, _ in comps}
    cps.update(range(0x1161, 0x1176))  # Hangul V jamo compose with a preceding L
    cps.update(range(0x11A8, 0x11C3))  # Hangul T jamo compose with a preceding LV
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF or cp in TOKENIZERS_UNKNOWN_COMPOSITES:
            continue
        if ud.normalize("NFC", chr(cp)) != chr(cp):
            cps.add(cp)
    return to_ranges(sorted(cps))


def to_ranges(cps):
    ranges = []
    for cp in cps:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def rows(items, per_line):
    lines = []
    for i in range(0, len(items), per_line):
        lines.append("    " + " ".join(items[i:i + per_line]))
    return "\n".join(lines)


def main():
    runs = category_runs()
    spaces = white_space()
    cccs = combining_class_ranges()
    decomps = decompositions()
    comps = compositions()
    qc = quick_check_not_yes(comps)

    pool, decomp_entries = [], []
    for cp, seq in decomps:
        decomp_entries.append(f"{{0x{cp:X}, {len(pool)}, {len(seq)}}},")
        pool.extend(seq)

    out = sys.stdout
    out.write(f"""// GENERATED by model/tools/gen_unicode_tables.py from Unicode {ud.unidata_version}: do not edit.
// Regenerate: python3 model/tools/gen_unicode_tables.py > model/src/unicode_tables.cpp
#include "unicode_tables.h"

namespace kz::unicode::tables {{

const char* const kUnicodeVersion = "{ud.unidata_version}";

const CategoryRun kCategoryRuns[] = {{
{rows([f"{{0x{cp:X}, {cat}}}," for cp, cat in runs], 8)}
}};
const size_t kCategoryRunCount = {len(runs)};

const uint32_t kWhiteSpace[] = {{
{rows([f"0x{cp:X}," for cp in spaces], 12)}
}};
const size_t kWhiteSpaceCount = {len(spaces)};

const CombiningClassRange kCombiningClasses[] = {{
{rows([f"{{0x{a:X}, 0x{b:X}, {c}}}," for a, b, c in cccs], 6)}
}};
const size_t kCombiningClassCount = {len(cccs)};

const uint32_t kDecompositionPool[] = {{
{rows([f"0x{cp:X}," for cp in pool], 12)}
}};
const Decomposition kDecompositions[] = {{
{rows(decomp_entries, 6)}
}};
const size_t kDecompositionCount = {len(decomp_entries)};

const Composition kCompositions[] = {{
{rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in comps], 5)}
}};
const size_t kCompositionCount = {len(comps)};

const CodePointRange kNfcQuickCheckNotYes[] = {{
{rows([f"{{0x{a:X}, 0x{b:X}}}," for a, b in qc], 8)}
}};
const size_t kNfcQuickCheckNotYesCount = {len(qc)};

}}  // namespace kz::unicode::tables
""")


if __name__ == "__main__":
    main()
