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
  auto tokenizer = kz::Tokenizer::load(argv[1]);
  if (!tokenizer.ok()) {
    fmt::print(stderr, "{}\n", tokenizer.status().to_string());
    return 1;
  }
  auto text = kz::read_file(argv[2]);
  if (!text.ok()) {
    fmt::print(stderr, "{}\n", text.status().to_string());
    return 1;
  }
  int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  double mb = static_cast<double>(text->size()) / 1e6;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    std::vector<kz::TokenId> ids = tokenizer->encode(*text);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{} run {}: {:.2f} MB in {:.3f} s = {:.1f} MB/s, {} tokens\n", r == 0 ? "cold" : "warm", r, mb, s, mb / s,
               ids.size());
  }
  return 0;
}
