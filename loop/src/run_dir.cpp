// Checkpoints and logs of a run directory on raw POSIX calls: every step that must survive a kill
// is fsync'ed before the next one depends on it (run_dir.h gives the order and why).
#include "kz/loop/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

namespace kz::loop {
namespace {

using nlohmann::json;

constexpr std::string_view kIterPrefix = "iter-";
constexpr std::string_view kStagingPrefix = ".staging-";
// write_file_atomic's temporaries: a kill while LATEST is replaced leaves one behind.
constexpr std::string_view kLatestTmpPrefix = "LATEST.tmp.";
constexpr const char* kManifest = "MANIFEST.json";
constexpr const char* kLatest = "LATEST";

Status errno_status(std::string_view what, const fs::path& path, int err) {
  std::string msg = fmt::format("{} {}: {}", what, path.string(), std::strerror(err));
  return err == ENOENT ? not_found(std::move(msg)) : io_error(std::move(msg));
}

Status remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return io_error(fmt::format("removing {}: {}", path.string(), ec.message()));
  return Status::ok();
}

// A relative file name has no directory part; its directory is the working one.
fs::path dir_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

struct FileDigest {
  uint64_t bytes = 0;
  uint64_t fnv1a64 = 0xcbf29ce484222325ULL;  // the FNV-1a 64 offset basis
};

// Streams the file, so a large checkpoint file is never held in memory whole.
Result<FileDigest> digest_file(const fs::path& path) {
  FileDigest digest;
  KZ_RETURN_IF_ERROR(read_file_chunks(path, [&](std::string_view piece) {
    for (unsigned char byte : piece) {
      digest.fnv1a64 ^= byte;
      digest.fnv1a64 *= 0x100000001b3ULL;  // the FNV-1a 64 prime
    }
    digest.bytes += piece.size();
  }));
  return digest;
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

// The iteration of "iter-000003"; nullopt for any other name (staging dirs, LATEST, strays).
std::optional<int64_t> parse_checkpoint_name(std::string_view name) {
  if (name.substr(0, kIterPrefix.size()) != kIterPrefix) return std::nullopt;
  std::string_view digits = name.substr(kIterPrefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;  // 18 digits cannot overflow
  int64_t value = 0;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// What fill() left in the staging dir: its regular files and subdirectories, relative to it.
struct StagedTree {
  std::vector<fs::path> files;
  std::vector<fs::path> dirs;
};

// Symlinks and special files are refused: the manifest could not vouch for what they point at.
Result<StagedTree> list_staged(const fs::path& root) {
  StagedTree tree;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    fs::path rel = it->path().lexically_relative(root);
    if (fs::is_directory(st)) {
      tree.dirs.push_back(rel);
    } else if (fs::is_regular_file(st)) {
      tree.files.push_back(rel);
    } else {
      return invalid_argument(fmt::format("{}: not a regular file or directory (a symlink?)", it->path().string()));
    }
  }
  if (ec) return io_error(fmt::format("listing {}: {}", root.string(), ec.message()));
  return tree;
}

// Hashes and fsyncs every staged file, then writes the manifest (write_file_atomic fsyncs it).
Status write_manifest(const fs::path& staging, int64_t iteration, const StagedTree& tree) {
  json files = json::object();
  for (const fs::path& rel : tree.files) {
    if (rel == kManifest) return invalid_argument(fmt::format("{}: a reserved name", (staging / rel).string()));
    auto digest = digest_file(staging / rel);
    if (!digest.ok()) return digest.status();
    KZ_RETURN_IF_ERROR(fsync_path(staging / rel));
    files[rel.generic_string()] = {{"bytes", digest->bytes}, {"fnv1a64", hex64(digest->fnv1a64)}};
  }
  json manifest = {{"iteration", iteration}, {"files", std::move(files)}};
  return write_file_atomic(staging / kManifest, manifest.dump(2) + "\n");
}

Status fsync_dirs(const fs::path& staging, const StagedTree& tree) {
  for (const fs::path& rel : tree.dirs) KZ_RETURN_IF_ERROR(fsync_path(staging / rel));
  return fsync_path(staging);
}

// Moves the staged dir to `target`. A checkpoint already there (the iteration rerun after a
// resume) is swapped out in one step, so a kill never leaves LATEST naming a removed dir; the
// replaced one lands at the staging path, which the caller removes. Filesystems without
// RENAME_EXCHANGE get remove-then-rename.
Status install(const fs::path& staging, const fs::path& target) {
  if (::rename(staging.c_str(), target.c_str()) == 0) return Status::ok();
  if (errno != ENOTEMPTY && errno != EEXIST) return errno_status("renaming to", target, errno);
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return Status::ok();
  if (errno != EINVAL && errno != ENOSYS) return errno_status("swapping into", target, errno);
  KZ_RETURN_IF_ERROR(remove_tree(target));
  if (::rename(staging.c_str(), target.c_str()) != 0) return errno_status("renaming to", target, errno);
  return Status::ok();
}

// Everything up to the rename; on error the caller removes the staging dir.
Status stage_and_install(const fs::path& staging, const fs::path& target, int64_t iteration,
                         const std::function<Status(const fs::path&)>& fill) {
  KZ_RETURN_IF_ERROR(fill(staging));
  auto tree = list_staged(staging);
  if (!tree.ok()) return tree.status();
  KZ_RETURN_IF_ERROR(write_manifest(staging, iteration, *tree));
  KZ_RETURN_IF_ERROR(fsync_dirs(staging, *tree));
  return install(staging, target);
}

Result<std::vector<std::string>> list_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec) return io_error(fmt::format("listing {}: {}", dir.string(), ec.message()));
  return names;
}

// Keeps the newest `keep_last` checkpoints (and always `current`, which LATEST names) and removes
// the rest with whatever a killed write left behind.
Status prune(const fs::path& dir, const std::string& current, int keep_last) {
  auto names = list_names(dir);
  if (!names.ok()) return names.status();
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  for (const std::string& name : *names) {
    if (starts_with(name, kStagingPrefix) || starts_with(name, kLatestTmpPrefix)) {
      KZ_RETURN_IF_ERROR(remove_tree(dir / name));
    } else if (auto iteration = parse_checkpoint_name(name)) {
      checkpoints.emplace_back(*iteration, name);
    }
  }
  std::sort(checkpoints.begin(), checkpoints.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(keep_last); i < checkpoints.size(); ++i) {
    if (checkpoints[i].second != current) KZ_RETURN_IF_ERROR(remove_tree(dir / checkpoints[i].second));
  }
  return Status::ok();
}

Status write_checkpoint_unlabelled(const fs::path& run_dir, int64_t iteration, int keep_last,
                                   const std::function<Status(const fs::path&)>& fill) {
  if (iteration < 0) return invalid_argument(fmt::format("iteration {} is negative", iteration));
  if (keep_last < 1) return invalid_argument(fmt::format("keep_last {} must be at least 1", keep_last));
  const std::string name = checkpoint_name(iteration);
  const fs::path dir = run_dir / "checkpoints";
  const fs::path staging = dir / (std::string(kStagingPrefix) + name);
  std::error_code ec;
  const bool created = fs::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("creating {}: {}", dir.string(), ec.message()));
  // The first checkpoint's LATEST is only as durable as the checkpoints/ entry in the run dir.
  if (created) KZ_RETURN_IF_ERROR(fsync_path(run_dir));
  KZ_RETURN_IF_ERROR(remove_tree(staging));  // a killed write's leftovers
  if (::mkdir(staging.c_str(), 0755) != 0) return errno_status("creating", staging, errno);

  Status installed = stage_and_install(staging, dir / name, iteration, fill);
  if (installed.is_ok()) installed = fsync_path(dir);
  if (!installed.is_ok()) {
    fs::remove_all(staging, ec);  // best effort: the error being returned matters more
    return installed;
  }
  KZ_RETURN_IF_ERROR(write_file_atomic(dir / kLatest, name + "\n"));
  KZ_RETURN_IF_ERROR(fsync_path(dir));
  return prune(dir, name, keep_last).with_context("pruning");
}

// Checks one manifest entry against the file on disk.
Status verify_file(const fs::path& checkpoint, const std::string& rel, const json& entry) {
  const fs::path path = checkpoint / rel;
  if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
      !entry.contains("fnv1a64") || !entry["fnv1a64"].is_string())
    return parse_error(fmt::format("{}: the entry for {} is malformed", (checkpoint / kManifest).string(), rel));
  auto digest = digest_file(path);
  if (!digest.ok()) return digest.status();
  const auto bytes = entry["bytes"].get<uint64_t>();
  if (digest->bytes != bytes)
    return invalid_argument(fmt::format("{}: {} bytes, the manifest says {}", path.string(), digest->bytes, bytes));
  const auto hash = entry["fnv1a64"].get<std::string>();
  if (hex64(digest->fnv1a64) != hash)
    return invalid_argument(
        fmt::format("{}: FNV-1a 64 hash {}, the manifest says {}", path.string(), hex64(digest->fnv1a64), hash));
  return Status::ok();
}

Status verify_checkpoint(const fs::path& checkpoint, int64_t iteration) {
  std::error_code ec;
  if (!fs::is_directory(checkpoint, ec))
    return not_found(fmt::format("LATEST names {}, which is missing", checkpoint.string()));
  const fs::path manifest_path = checkpoint / kManifest;
  auto text = read_file(manifest_path);
  if (!text.ok()) return text.status();
  json manifest = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object() ||
      !manifest.contains("iteration") || !manifest["iteration"].is_number_integer())
    return parse_error(fmt::format("{}: not a checkpoint manifest", manifest_path.string()));
  if (manifest["iteration"].get<int64_t>() != iteration)
    return invalid_argument(fmt::format("{}: iteration {}, the dir's name says {}", manifest_path.string(),
                                        manifest["iteration"].get<int64_t>(), iteration));
  for (const auto& [rel, entry] : manifest["files"].items()) KZ_RETURN_IF_ERROR(verify_file(checkpoint, rel, entry));
  return Status::ok();
}

}  // namespace

std::string checkpoint_name(int64_t iteration) { return fmt::format("{}{:06d}", kIterPrefix, iteration); }

Status write_checkpoint(const fs::path& run_dir, int64_t iteration, int keep_last,
                        const std::function<Status(const fs::path& staging_dir)>& fill) {
  return write_checkpoint_unlabelled(run_dir, iteration, keep_last, fill)
      .with_context("checkpoint " + checkpoint_name(iteration));
}

Result<std::optional<fs::path>> latest_checkpoint(const fs::path& run_dir) {
  const fs::path dir = run_dir / "checkpoints";
  auto latest = read_file(dir / kLatest);
  if (!latest.ok()) {
    if (latest.status().code() == StatusCode::not_found) return std::optional<fs::path>();
    return latest.status();
  }
  std::string name = std::move(*latest);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  auto iteration = parse_checkpoint_name(name);
  if (!iteration)
    return invalid_argument(fmt::format("{}: \"{}\" is not a checkpoint name", (dir / kLatest).string(), name));
  KZ_RETURN_IF_ERROR(verify_checkpoint(dir / name, *iteration).with_context("checkpoint " + name));
  return std::optional<fs::path>(dir / name);
}

Status AppendLog::append(const std::string& line) {
  std::error_code ec;
  const bool created = !fs::exists(path_, ec);
  KZ_RETURN_IF_ERROR(append_line(path_, line));  // loops on short writes and fsyncs the file
  // A new file's name is durable only once its directory is fsync'ed; without that a crash could
  // drop the whole log while a checkpoint already counts its bytes.
  return created ? fsync_path(dir_of(path_)) : Status::ok();
}

Result<uint64_t> AppendLog::size() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) return static_cast<uint64_t>(st.st_size);
  if (errno == ENOENT) return uint64_t{0};
  return errno_status("stat", path_, errno);
}

Status AppendLog::truncate_to(uint64_t bytes) const {
  auto now = size();
  if (!now.ok()) return now.status();
  if (*now < bytes)
    return invalid_argument(
        fmt::format("{}: {} bytes, shorter than the {} the checkpoint recorded", path_.string(), *now, bytes));
  if (*now == bytes) return Status::ok();  // also a missing log cut to 0: nothing to write
  if (::truncate(path_.c_str(), static_cast<off_t>(bytes)) != 0) return errno_status("truncating", path_, errno);
  return fsync_path(path_);
}

}  // namespace kz::loop
