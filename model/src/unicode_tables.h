// Declarations of the generated Unicode tables (unicode_tables.cpp, from
// model/tools/gen_unicode_tables.py). Only unicode.cpp reads them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kz::unicode::tables {

// A run of code points sharing a general category; it ends where the next run starts.
struct CategoryRun {
  uint32_t first;
  uint8_t category;  // index into unicode::Category
};

struct CombiningClassRange {
  uint32_t first, last;
  uint8_t ccc;  // canonical combining class, never 0 here
};

// The full canonical decomposition of `code_point`: kDecompositionPool[offset, offset + length).
struct Decomposition {
  uint32_t code_point;
  uint16_t offset;
  uint8_t length;
};

// first + second -> composite (primary composites only); sorted by (first, second).
struct Composition {
  uint32_t first, second, composite;
};

struct CodePointRange {
  uint32_t first, last;
};

extern const char* const kUnicodeVersion;
extern const CategoryRun kCategoryRuns[];
extern const size_t kCategoryRunCount;
extern const uint32_t kWhiteSpace[];
extern const size_t kWhiteSpaceCount;
extern const CombiningClassRange kCombiningClasses[];
extern const size_t kCombiningClassCount;
extern const uint32_t kDecompositionPool[];
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
extern const Composition kCompositions[];
extern const size_t kCompositionCount;
extern const CodePointRange kNfcQuickCheckNotYes[];
extern const size_t kNfcQuickCheckNotYesCount;

}  // namespace kz::unicode::tables
