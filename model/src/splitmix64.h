// splitmix64: a 64-bit counter-based generator, one step per call. Random weights of
// `kz init-model` draw from it, and the trainer keys its stochastic rounding's streams with it.
#pragma once

#include <cstdint>

namespace kz::model {

// Advances `state` and returns the next 64 random bits.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace kz::model
