// Encoding throughput: kz_tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]
// Encodes the file as one string REPEATS times (default 3) with a cold cache first, and prints
// MB/s and tokens, so it can be set beside tokenizers' figure (tests/tokenizer_reference.py bench).
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>

#include "kz/core/files.h"
#include "kz/model/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: {} TOKENIZER_JSON TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = kz::Tokenizer::load(argv[1]);
  if (!tokenizer.ok()) {
    fmt::print(stderr, "{}\n", tokenizer.status().to_string());
    return 1;
  }
  fmt::print("loaded {} ids in {:.3f} s\n", tokenizer->vocab_size(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
  auto text = kz::read_file(argv[2]);
  if (!text.ok()) {
    fmt::print(stderr, "{}\n", text.status().to_string());
    return 1;
  }
  int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  double mb = static_cast<double>(text->size()) / 1e6;
  std::vector<kz::TokenId> ids;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    ids = tokenizer->encode(*text);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{} run {}: {:.2f} MB in {:.3f} s = {:.1f} MB/s, {} tokens\n", r == 0 ? "cold" : "warm", r, mb, s, mb / s,
               ids.size());
  }
  // The same hash as tokenizer_reference.py bench prints, to check the ids are identical.
  uint64_t hash = 0xcbf29ce484222325ull;
  for (kz::TokenId id : ids) hash = (hash ^ static_cast<uint64_t>(id)) * 0x100000001b3ull;
  fmt::print("ids fnv1a {:016x}\n", hash);
  return 0;
}
