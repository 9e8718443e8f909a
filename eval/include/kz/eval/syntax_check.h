// A candidate's (or a proposed module's) Python syntax, checked before any worker starts, by one
// long-lived interpreter (worker/kz_worker/syntax_check.py: no torch, ~20 ms to start, ~1 ms a check).
//
// A candidate that is not valid Python would otherwise cost a whole worker: a process, the
// reference's load, and in a cold batch a place in the first wave, which waits seconds for the
// zygote's imports and a CUDA context. The worker compiles the source again with the same
// function, so the check can only answer sooner, never differently. Where the checker cannot say
// (it failed to start, died, did not answer in time, or compiling raised something other than a
// SyntaxError) the answer is "no finding" and the worker decides, as without the check. Compiling
// runs none of the source; the interpreter still runs within limits (2 GB of address space, 16
// tasks) and, where the machine allows, without network, writable mounts, capabilities or other
// processes in sight, as workers do.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kz/eval/verdict.h"
#include "kz/eval/worker_client.h"

namespace kz {

class Process;

class SyntaxChecker {
 public:
  // `python` and `worker_dir` as the workers get them (WorkerSetup); `bytecode_prefix`: the
  // interpreter's compiled standard library where setup made one (empty: none). `answer_timeout`:
  // how long one check may take, the interpreter's start included (~20 ms; ~1 s on a host busy with
  // a cold batch), before the checker counts as failed.
  SyntaxChecker(std::string python, std::filesystem::path worker_dir, std::filesystem::path bytecode_prefix,
                std::chrono::milliseconds answer_timeout = std::chrono::seconds(10));
  ~SyntaxChecker();
  SyntaxChecker(const SyntaxChecker&) = delete;
  SyntaxChecker& operator=(const SyntaxChecker&) = delete;

  // What Python's compiler says where it refuses `source` compiled as `filename` (e.g. "invalid
  // syntax (candidate.py, line 7)"); nullopt where it compiles or the checker cannot say.
  // Thread-safe (one check at a time).
  std::optional<std::string> error(std::string_view source, std::string_view filename = "candidate.py");

  // One checker per interpreter, worker dir and bytecode prefix in this process (as `setup` names
  // them for its workers), made at the first call: the evaluators and the module validations of one
  // kz process share it.
  static std::shared_ptr<SyntaxChecker> shared(const WorkerSetup& setup);

  // Whether the interpreter is running now (started at the first check, again after a failure).
  bool running() const;

  // After this many failures in a row (no answer, a crash) the checker stays off: every candidate
  // goes to a worker, as without it.
  static constexpr int kMaxFailures = 3;

 private:
  std::optional<std::string> ask(const std::string& request_line);

  std::string python_;
  std::filesystem::path worker_dir_, bytecode_prefix_;
  std::chrono::milliseconds answer_timeout_;
  mutable std::mutex mutex_;
  std::unique_ptr<Process> process_;
  int failures_ = 0;  // in a row
};

// The verdict for a candidate the checker refused (`error`: what the compiler said): compile_error,
// check python_syntax, the worker's message, stage "syntax_check" (no worker ran).
Verdict syntax_error_verdict(const std::string& error);

}  // namespace kz
