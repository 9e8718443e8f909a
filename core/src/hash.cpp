// Content hashing with xxHash3: 64-bit for seeds, 128-bit hex digests for cache keys.
#include "kz/core/hash.h"

// Header-only use (XXH_INLINE_ALL): no library to link, one less dependency to carry to the GPU host.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>
#include <memory>

namespace kz {

uint64_t hash64(std::string_view data) { return XXH3_64bits(data.data(), data.size()); }

std::string content_hash(std::initializer_list<std::string_view> parts) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                  &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  for (std::string_view part : parts) {
    // A fixed-width little-endian length prefix makes the part boundaries part of the hash,
    // independent of the host's byte order.
    unsigned char len[8];
    uint64_t n = part.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    XXH3_128bits_update(state.get(), len, sizeof len);
    XXH3_128bits_update(state.get(), part.data(), part.size());
  }
  XXH128_hash_t h = XXH3_128bits_digest(state.get());
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string(buf, 32);
}

}  // namespace kz
