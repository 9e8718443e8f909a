// Small filesystem helpers that report failures as Status with the path in the message.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "kz/core/status.h"

namespace kz {

namespace fs = std::filesystem;

Result<std::string> read_file(const fs::path& path);
// The file's bytes in pieces of at most 64 KiB, in order: for files too large to hold at once.
Status read_file_chunks(const fs::path& path, const std::function<void(std::string_view)>& chunk);
// fsync of a file or a directory (an entry created, renamed or removed in a directory is durable
// only once the directory is fsync'ed).
Status fsync_path(const fs::path& path);
// Writes to a temporary sibling then renames, so readers never see a half-written file.
Status write_file_atomic(const fs::path& path, std::string_view content);
// Appends one line (a '\n' is added) and flushes it to the OS, so a killed run keeps every
// line already written (results.jsonl).
Status append_line(const fs::path& path, std::string_view line);
// Creates a fresh, uniquely named directory under `parent` (created if missing).
Result<fs::path> make_unique_dir(const fs::path& parent, std::string_view prefix);
// `dir`, made (its parents too) or checked: a directory of this user's own, not a symlink, whose
// entries its owner can make, remove and open by name but, without CAP_DAC_READ_SEARCH, not list
// (mode 0311). Only for root, whose sandboxed workers (same uid, no capabilities, a read-only
// mount) can neither list nor chmod it; another user's dir stays 0700, as its own processes could
// chmod it back anyway, and it still needs to list it.
Status make_unlistable_dir(const fs::path& dir);

}  // namespace kz
