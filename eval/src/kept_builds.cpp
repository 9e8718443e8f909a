#include "kz/eval/kept_builds.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kz/core/files.h"

namespace kz {
namespace fs = std::filesystem;

bool keep_extension_builds(const fs::path& request_scratch, const fs::path& kept) {
  std::error_code error;
  const fs::path built = request_scratch / "torch_extensions";
  if (fs::exists(kept, error) || !fs::is_directory(built, error)) return false;
  // Unlistable: a worker opens its own candidate's build by name (a hash of its source) and cannot
  // find a sibling's.
  if (!make_unlistable_dir(kept.parent_path()).is_ok()) return false;
  const fs::path staging = kept.string() + fmt::format(".{}-{}.tmp", ::getpid(), std::random_device{}());
  bool any = false;
  for (const auto& entry : fs::directory_iterator(built, error)) {
    if (!entry.is_directory(error) || entry.is_symlink(error)) continue;
    const std::string name = entry.path().filename().string();
    for (const std::string& file : {name + ".so", std::string("kz_lighter_build_failed")}) {
      if (!fs::is_regular_file(fs::symlink_status(entry.path() / file, error))) continue;
      fs::create_directories(staging / name, error);
      if (!error) fs::copy_file(entry.path() / file, staging / name / file, error);
      if (error) {  // nothing kept rather than part of it
        fs::remove_all(staging, error);
        return false;
      }
      any = true;
    }
  }
  bool renamed = false;
  if (any) {
    fs::rename(staging, kept, error);  // fails where another request kept this candidate's first
    renamed = !error;
  }
  fs::remove_all(staging, error);
  return renamed;
}

namespace {

struct KeptBuild {
  fs::path path;
  fs::file_time_type kept_at;
  uint64_t bytes = 0;
};

uint64_t bytes_under(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error))
    if (it->is_regular_file(error)) total += it->file_size(error);
  return total;
}

}  // namespace

int prune_kept_builds(const fs::path& dir, uint64_t max_bytes) {
  if (max_bytes == 0) return 0;
  std::vector<KeptBuild> builds;
  uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (!entry.is_directory(error) || entry.path().extension() == ".tmp") continue;
    KeptBuild build{entry.path(), entry.last_write_time(error), bytes_under(entry.path())};
    total += build.bytes;
    builds.push_back(std::move(build));
  }
  if (total <= max_bytes) return 0;
  std::sort(builds.begin(), builds.end(), [](const KeptBuild& a, const KeptBuild& b) { return a.kept_at < b.kept_at; });
  int removed = 0;
  for (const KeptBuild& build : builds) {
    if (total <= max_bytes / 10 * 9) break;
    fs::remove_all(build.path, error);  // another kz process may have removed it first
    total -= std::min(total, build.bytes);
    ++removed;
  }
  return removed;
}

}  // namespace kz
