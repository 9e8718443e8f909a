// Where workers' scratch dirs live, and who cleans up after a kz process that died.
//
// Every scratch dir sits in one unlistable dir per user under the scratch root,
// <root>/kz-scratch-<uid> (make_unlistable_dir): a worker, whose own dir is bound in writable,
// cannot find a sibling's (docs/evaluation.md, "Sandbox"). Each kz process names its dirs with a
// token of its own and holds an flock on <parent>/owner-<token>.lock while it lives; the first
// scratch dir a process makes under a parent sweeps the dirs of every token whose lock is free, so
// that the candidates of a killed run do not pile up. flock, not pids: it holds across PID
// namespaces (containers sharing /tmp) and pid reuse.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kz/core/status.h"

namespace kz {

// The per-user parent of the scratch dirs under `scratch_root`, made unlistable.
Result<std::filesystem::path> scratch_parent(const std::filesystem::path& scratch_root);

// A fresh scratch dir under scratch_parent(scratch_root): <prefix><token>-XXXXXX, swept once this
// process is gone; with `keep` (worker.keep_scratch: debugging) <prefix>XXXXXX, never swept.
Result<std::filesystem::path> make_scratch_dir(const std::filesystem::path& scratch_root, const std::string& prefix,
                                               bool keep);

// The name of a fork server's `n`th request dir: request-<n>-<16 random hex>, a name no candidate
// can guess from another's (scrub_scratch_paths knows it by this shape).
std::string request_dir_name(int n);

// `text` with every scratch path (<root>/kz-scratch-<uid>/<dir>, and a request dir of a fork
// server below it) written as "<scratch>", and what is left of one cut by a tail (a worker's or
// request dir's name): what a worker's traceback says must not tell a later candidate where a fork
// server runs its next request.
std::string scrub_scratch_paths(const std::string& text);

// How much a worker may keep in its scratch dir ([sandbox] scratch_mb, scratch_files); 0: no bound.
struct ScratchBound {
  uint64_t max_bytes = 0;
  uint64_t max_entries = 0;
  bool any() const { return max_bytes > 0 || max_entries > 0; }
};

// Where `dir` holds more than `bound` allows (its entries' allocated bytes, st_blocks, so a sparse
// file counts what it uses; its files, dirs and links, not following links), or cannot be measured
// (a directory it cannot read, nesting past 64 levels): why, for the verdict. nullopt within the
// bound, or where `dir` itself is not there. The walk stops once past. Counted too: the files
// removed that `holders` (the worker's processes) still hold, each once: they take their disk
// until let go of, and no walk finds them (a worker writing into one would fill the disk unseen).
// Open ones (/proc/<pid>/fd, each holder's leader's table) wherever on `dir`'s filesystem, where
// the read-only mounts leave a worker nothing else to write; mapped ones (the "(deleted)" lines of
// /proc/<pid>/maps, where this process may follow map_files: CAP_SYS_ADMIN) where their path lay
// under `dir`, since a long-lived server may map a library replaced beside it. Holders whose /proc
// entries this process may not read are skipped. Not found: a file held only by another thread's
// own table (unshare(CLONE_FILES)), by a socket's queue (SCM_RIGHTS) or by io_uring, or by a holder
// that made itself non-dumpable under a supervisor without CAP_SYS_PTRACE; a mapped-only one whose
// path reads otherwise (a mount of the worker's own, in a user namespace of its own).
std::optional<std::string> scratch_over_bound(const std::filesystem::path& dir, const ScratchBound& bound,
                                              const std::vector<pid_t>& holders = {});

// Removes, under `parent`, the dirs of every owner token whose lock no process holds, and the lock
// files; returns how many dirs went. Called by make_scratch_dir once per parent and process.
int sweep_dead_owners(const std::filesystem::path& parent);

}  // namespace kz
