// Content hashing (xxHash3) for cache keys and per-evaluation seeds, and splitmix64 for
// reproducible random streams that are the same on every standard library.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace kz {

uint64_t hash64(std::string_view data);
// 32 hex digits (XXH3-128) over the parts, each length-prefixed so ("ab","c") != ("a","bc").
std::string content_hash(std::initializer_list<std::string_view> parts);

// splitmix64: advances `state` and returns the next 64 random bits. `kz init-model`'s weights, the
// trainer's stochastic-rounding keys and the policy update's shuffles draw from it.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace kz
