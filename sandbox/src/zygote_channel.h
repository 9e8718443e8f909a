// The supervisor's end of a zygote's control socket, shared by process.cpp (a spawned Process
// learns its exit and is reaped through it) and zygote_channel.cpp (the protocol itself). Internal:
// the public API is class Zygote in kz/sandbox/process.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "fd.h"
#include "kz/sandbox/process.h"

namespace kz {

// The supervisor's end of a zygote's control socket (Zygote's protocol: kz/sandbox/process.h). Shared by
// the Zygote and every Process it spawned: they learn their exits here. One spawn at a time
// (spawn_mutex); every message read is filed under `mutex`, whichever thread reads it.
struct Zygote::Channel {
  struct Exit {
    ExitInfo info;
    double cpu_s = -1;
  };
  detail::Fd socket;
  std::mutex spawn_mutex;
  std::mutex mutex;
  bool dead = false;                        // EOF, an error, or no answer in time
  std::optional<nlohmann::json> reply;      // the answer to the spawn in flight
  std::map<pid_t, Exit> exits;              // children that exited, until reaped

  // Sends one message with descriptors (SCM_RIGHTS). False (errno says why): the zygote is gone,
  // and is marked so.
  bool send(const nlohmann::json& message, const std::vector<int>& fds);

  bool send_once(const nlohmann::json& message, const std::vector<int>& fds);

  // Files every message waiting on the socket, without blocking. Under `mutex`.
  void pump();

  // Waits until `done()` (checked under `mutex` after each pump), the zygote is gone or `timeout`
  // passes. Blocks in poll without the lock, so other threads file their messages meanwhile.
  template <typename Done>
  bool wait_until(Done done, std::chrono::milliseconds timeout);

  // The zygote's answer to `request` (with `fds`), or an error where it is gone or silent.
  Result<nlohmann::json> spawn(const nlohmann::json& request, const std::vector<int>& fds,
                               std::chrono::milliseconds timeout);

  // `pid`'s exit as the zygote reported it, waiting up to `timeout`.
  std::optional<Exit> exit_of(pid_t pid, std::chrono::milliseconds timeout);

  bool is_dead();

  // The zygote reaps `pid` now, or as soon as it exits.
  void reap(pid_t pid);
};

}  // namespace kz
