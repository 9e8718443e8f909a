// The torchrun environment (world.h).
#include "kz/dist/world.h"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>

#include "kz/sandbox/process.h"

namespace kz::dist {
namespace {

std::optional<std::string> lookup(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// An integer variable within [low, high]; `fallback` when unset.
Result<int> integer(const std::map<std::string, std::string>& env, const std::string& name, int fallback, int low,
                    int high) {
  auto text = lookup(env, name);
  if (!text) return fallback;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || value < low || value > high)
    return invalid_argument(fmt::format("{}=\"{}\": expected an integer in [{}, {}]", name, *text, low, high));
  return static_cast<int>(value);
}

}  // namespace

Result<World> world_from_environment(const std::map<std::string, std::string>& env) {
  World world;
  auto size = integer(env, "WORLD_SIZE", 1, 1, 1 << 20);
  if (!size.ok()) return size.status();
  world.size = *size;
  if (!world.distributed()) return world;
  for (const char* required : {"RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (!lookup(env, required))
      return invalid_argument(fmt::format("WORLD_SIZE={} but {} is not set (a torchrun-style launch sets RANK, "
                                          "LOCAL_RANK, MASTER_ADDR and MASTER_PORT; or use kz launch)",
                                          world.size, required));
  auto rank = integer(env, "RANK", 0, 0, world.size - 1);
  if (!rank.ok()) return rank.status();
  world.rank = *rank;
  auto local_size = integer(env, "LOCAL_WORLD_SIZE", world.size, 1, world.size);
  if (!local_size.ok()) return local_size.status();
  world.local_size = *local_size;
  auto local_rank = integer(env, "LOCAL_RANK", world.rank % world.local_size, 0, world.local_size - 1);
  if (!local_rank.ok()) return local_rank.status();
  world.local_rank = *local_rank;
  auto port = integer(env, "MASTER_PORT", 29500, 1, 65535);
  if (!port.ok()) return port.status();
  world.master_port = *port;
  world.master_addr = *lookup(env, "MASTER_ADDR");
  return world;
}

Result<World> current_world() { return world_from_environment(current_environment()); }

std::map<std::string, std::string> world_environment(const World& world) {
  return {{"RANK", std::to_string(world.rank)},
          {"WORLD_SIZE", std::to_string(world.size)},
          {"LOCAL_RANK", std::to_string(world.local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world.local_size)},
          {"MASTER_ADDR", world.master_addr},
          {"MASTER_PORT", std::to_string(world.master_port)}};
}

std::string rank_device(const std::string& device, const World& world) {
  if (!world.distributed() || !(device == "cuda" || device.starts_with("cuda:"))) return device;
  return "cuda:" + std::to_string(world.local_rank);
}

void disable_nvlink_multicast() { ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1); }

}  // namespace kz::dist
