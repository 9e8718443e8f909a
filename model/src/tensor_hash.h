// Counter-based random bits on tensors: a 32-bit integer hash applied elementwise, so a stream is a
// function of (key, counter) alone. The sampler's per-row draws and the trainer's stochastic
// rounding use it: no generator state to carry, the same bits on every device and after a resume.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kz::model {

constexpr int64_t kLow32 = 0xffffffffLL;

// Xor-shift-multiply rounds on int64 tensors holding values in [0, 2^32); a bijection of that
// range. Both multipliers are below 2^31, so no product leaves int64's range.
inline at::Tensor mix32(at::Tensor x) {
  x = x.bitwise_xor(x.bitwise_right_shift(16));
  x = x.mul(0x7feb352dLL).bitwise_and(kLow32);
  x = x.bitwise_xor(x.bitwise_right_shift(15));
  x = x.mul(0x2c1b3c6dLL).bitwise_and(kLow32);
  x = x.bitwise_xor(x.bitwise_right_shift(16));
  x = x.mul(0x297a2d39LL).bitwise_and(kLow32);
  return x.bitwise_xor(x.bitwise_right_shift(15));
}

}  // namespace kz::model
