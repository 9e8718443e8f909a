// `cuda` candidates' extension builds, kept by the supervisor between a candidate's requests (its
// pre-build, then its evaluation): one directory per candidate under extension_builds_dir
// (sandbox.h), read-only to every worker, so no candidate can touch another's build, and unlistable
// (make_unlistable_dir), so none can find another's (docs/evaluation.md, "Shared compile caches").
#pragma once
#include <cstdint>
#include <filesystem>

namespace kz {

// Keeps what a request of a `cuda` candidate built (torch_extensions in its scratch dir) as `kept`,
// unless `kept` exists already: each extension's library and the harness's marker of a failed
// lighter build (worker/kz_worker/compile/load_inline.py), regular files only, renamed into place whole. The
// rest (objects, build files, anything else the candidate left) stays behind with the scratch dir.
// Returns whether it kept something.
bool keep_extension_builds(const std::filesystem::path& request_scratch, const std::filesystem::path& kept);

// Where the kept builds under `dir` take more than `max_bytes` (0: no limit), removes the ones kept
// longest ago until they take at most 90% of it; builds being kept (*.tmp) stay. A request whose
// build went meanwhile builds again. Returns how many were removed.
int prune_kept_builds(const std::filesystem::path& dir, uint64_t max_bytes);

}  // namespace kz
