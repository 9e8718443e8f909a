// Child processes with pipes, deadlines and process groups.
//
// The evaluator runs every candidate in a Python worker process. The worker reports progress on
// a dedicated message pipe (fd 3 in the child, one JSON object per line) so that whatever the
// candidate prints on stdout/stderr cannot forge a protocol message. The supervisor waits for
// each message with a deadline; on a timeout it kills the child's whole process group, so
// grandchildren (nvcc, ninja, a fork bomb's children) die with it. stdout and stderr are drained
// while waiting (no pipe-full deadlock) and their tails kept for error messages.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz {

struct ProcessSpec {
  std::vector<std::string> argv;              // argv[0] is looked up on PATH when it has no '/'
  std::map<std::string, std::string> env;     // the child's whole environment (nothing inherited)
  std::filesystem::path cwd;                  // empty: the parent's working directory
  std::string stdin_data;                     // written to the child's stdin, which is then closed
  bool message_pipe = false;                  // open fd 3 in the child as a write-only message pipe
  bool new_process_group = true;              // setpgid(0,0) in the child, so kill_group reaches all
  size_t output_tail_bytes = 64 * 1024;       // how much of stdout/stderr to keep (the last bytes)
};

struct ExitInfo {
  bool exited = false;      // exited normally (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;      // signal that killed it, 0 if none
  // "exit code 3", "killed by signal 11 (Segmentation fault)".
  std::string describe() const;
};

class Process {
 public:
  enum class ReadEvent { line, eof, timeout };

  static Result<Process> spawn(const ProcessSpec& spec);

  Process(Process&&) noexcept;
  Process& operator=(Process&&) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // kills the process group if still running, then reaps

  pid_t pid() const;

  // Waits up to `timeout` for the next complete line on the message pipe (without the '\n').
  // eof: the child closed the pipe (usually: it exited). Requires spec.message_pipe.
  ReadEvent read_message(std::string& line, std::chrono::milliseconds timeout);

  // Waits up to `timeout` for the child to exit, draining its output meanwhile.
  std::optional<ExitInfo> wait_for(std::chrono::milliseconds timeout);
  // Sends `sig` to the child's process group (or the child alone without a group).
  void kill_group(int sig);
  // Kills the group with SIGKILL and reaps the child.
  ExitInfo kill_and_reap();

  const std::string& stdout_tail() const;
  const std::string& stderr_tail() const;

 private:
  struct Impl;
  explicit Process(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct RunResult {
  ExitInfo exit;
  bool timed_out = false;   // the deadline passed and the group was killed
  std::string stdout_text;  // the tails kept (spec.output_tail_bytes)
  std::string stderr_text;
};

// Runs to completion or until `timeout`, whichever comes first.
Result<RunResult> run_process(const ProcessSpec& spec, std::chrono::milliseconds timeout);

// The parent's environment as a map (to copy selected variables into a ProcessSpec).
std::map<std::string, std::string> current_environment();

}  // namespace kz
