// The curriculum's random numbers (the API-set sampler's and the frontier's): a std::mt19937_64
// that counts its outputs, and the few distributions they need, written here.
//
// Why our own distributions: the standard fixes mt19937_64's output sequence but not how
// uniform_int_distribution, uniform_real_distribution or discrete_distribution turn it into
// values (libstdc++ and libc++ differ, and either may change). The draws here are defined by this
// file alone, so a seed gives the same API sets and frontier selections with any standard library.
//
// The state is (seed, outputs taken): a checkpoint stores those two numbers, and restored()
// replays the engine with discard() (a few ns per output, so even 10^8 outputs restore in well
// under a second).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kz::curriculum {

class CountedRng {
 public:
  explicit CountedRng(uint64_t seed = 0) : seed_(seed), engine_(seed) {}

  // The engine seeded with `seed` after `calls` outputs: the state a CountedRng(seed) reaches
  // after taking `calls` outputs.
  static CountedRng restored(uint64_t seed, uint64_t calls) {
    CountedRng rng(seed);
    rng.engine_.discard(calls);
    rng.calls_ = calls;
    return rng;
  }

  // One engine output.
  uint64_t next() {
    ++calls_;
    return engine_();
  }
  // Uniform in [0, 1): the top 53 bits of one output.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) for n >= 1, unbiased: outputs below 2^64 mod n are rejected and drawn again
  // (for the small n used here, about once in 10^17 outputs).
  uint64_t below(uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    uint64_t x = next();
    while (x < threshold) x = next();
    return x % n;
  }
  // An index i drawn with probability weights[i] / Σ weights (one output). Weights must be >= 0
  // with a positive sum; an index of weight 0 is never returned.
  size_t weighted(const std::vector<double>& weights) {
    double total = 0;
    for (double w : weights) total += w;
    double u = unit() * total;
    size_t last_positive = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i] <= 0) continue;
      last_positive = i;
      if (u < weights[i]) return i;
      u -= weights[i];
    }
    return last_positive;  // rounding left u at the top: the last index that can be drawn
  }

  uint64_t seed() const { return seed_; }
  uint64_t calls() const { return calls_; }  // outputs taken since seeding

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
  uint64_t calls_ = 0;
};

}  // namespace kz::curriculum
