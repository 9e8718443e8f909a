// Content hashing (xxHash3) for cache keys and per-evaluation seeds.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace kz {

uint64_t hash64(std::string_view data);
// 32 hex digits (XXH3-128) over the parts, each length-prefixed so ("ab","c") != ("a","bc").
std::string content_hash(std::initializer_list<std::string_view> parts);

}  // namespace kz
