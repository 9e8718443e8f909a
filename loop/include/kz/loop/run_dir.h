// The run directory of `kz evolve`: durable checkpoints and append-only logs that survive a
// SIGKILL at any point.
//
//   RUN_DIR/config.toml          the resolved config the run started with (every default written)
//   RUN_DIR/checkpoints/iter-000003/   one complete checkpoint per kept iteration
//   RUN_DIR/checkpoints/LATEST   the name of the newest complete checkpoint ("iter-000003")
//   RUN_DIR/metrics.jsonl, provenance.jsonl   append-only logs (AppendLog)
//
// A checkpoint is written into a staging dir (checkpoints/.staging-<name>), every file and the
// dir fsync'ed, a MANIFEST.json listing every file with its size and FNV-1a 64 hash written last,
// then renamed into place, and only then is LATEST replaced (atomically). A kill at any moment
// leaves either the previous checkpoint as LATEST or the new one complete; a full disk fails the
// write before the rename. Reading verifies the manifest: a truncated or altered file is an error
// naming it, never a silently wrong resume.
//
// Logs: a checkpoint records each log's byte length; on resume the logs are cut back to it
// (truncate_to), so the rows of the iteration a kill interrupted are written again exactly once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::loop {

// "iter-000003"
std::string checkpoint_name(int64_t iteration);

// Writes checkpoint `iteration` of `run_dir`: fill(staging_dir) writes the files (any layout,
// subdirectories allowed), then the manifest, fsync, rename, LATEST. Keeps the newest
// `keep_last` checkpoints (>= 1; the one just written is always kept) and removes older ones and
// stale staging dirs. Rewriting an existing iteration (a rerun after a resume) replaces it.
// Symlinks and special files in the staging dir are refused. On error nothing replaces LATEST, the
// staging dir is removed, and the message starts "checkpoint iter-000003: ".
Status write_checkpoint(const fs::path& run_dir, int64_t iteration, int keep_last,
                        const std::function<Status(const fs::path& staging_dir)>& fill);

// The newest complete checkpoint's dir (LATEST), its manifest verified; nullopt when the run has
// none yet. not_found naming the file when LATEST names a missing dir or a listed file is gone;
// invalid_argument naming the file when its size or hash differs from the manifest.
Result<std::optional<fs::path>> latest_checkpoint(const fs::path& run_dir);

// An append-only JSONL log whose lines are flushed and fsync'ed as they are written.
class AppendLog {
 public:
  explicit AppendLog(fs::path path) : path_(std::move(path)) {}
  Status append(const std::string& line);  // one line; '\n' added
  // Bytes in the file now (0 when missing).
  Result<uint64_t> size() const;
  // Cuts the file back to `bytes` (a length an earlier size() returned); invalid_argument when
  // the file is shorter (it lost rows the checkpoint counted on).
  Status truncate_to(uint64_t bytes) const;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace kz::loop
