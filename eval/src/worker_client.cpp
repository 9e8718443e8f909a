// One worker process from spawn to final message: environment, scratch dir, stage deadlines.
#include "kz/eval/worker_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "kz/core/files.h"
#include "kz/core/parallel.h"
#include "kz/core/text.h"
#include "kz/eval/scratch_dirs.h"

#ifndef KZ_DEFAULT_PYTHON
#define KZ_DEFAULT_PYTHON "python3"
#endif
#ifndef KZ_DEFAULT_ZYGOTE_LIBRARY
#define KZ_DEFAULT_ZYGOTE_LIBRARY ""
#endif
#ifndef KZ_DEFAULT_WORKER_DIR
#define KZ_DEFAULT_WORKER_DIR "worker"
#endif

namespace kz {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
// How long a fork server may take, after its child's result, to report the child gone.
constexpr std::chrono::seconds kServerCleanUp{30};
// How often the supervisor looks at what a running worker's scratch dir holds (ScratchBound).
constexpr std::chrono::milliseconds kScratchLook{500};
// How long a zygote may take to fork a server: its first answer comes once its imports are done
// (~4 s on a busy H200 host).
constexpr std::chrono::seconds kZygoteAnswer{120};

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

fs::path default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "kernelzero";
  return fs::path(env_or("HOME", "/tmp")) / ".cache" / "kernelzero";
}

fs::path scratch_root_of(const WorkerSetup& setup) {
  return !setup.scratch_root.empty() ? setup.scratch_root : fs::path(env_or("TMPDIR", "/tmp"));
}

// The worker's environment: nothing inherited but what it needs (no API keys, no tokens).
std::map<std::string, std::string> worker_environment(const WorkerSetup& setup, const fs::path& scratch) {
  auto parent = current_environment();
  std::map<std::string, std::string> env;
  std::string path = env_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  if (setup.python.find('/') != std::string::npos) path = fs::path(setup.python).parent_path().string() + ":" + path;
  std::string cuda_home = env_or("CUDA_HOME", fs::exists("/usr/local/cuda") ? "/usr/local/cuda" : "");
  if (!cuda_home.empty()) path += ":" + cuda_home + "/bin";
  env["PATH"] = path;
  env["HOME"] = scratch.string();
  env["TMPDIR"] = scratch.string();
  env["PYTHONPATH"] = setup.worker_dir.string();
  env["PYTHONUNBUFFERED"] = "1";
  env["PYTHONDONTWRITEBYTECODE"] = "1";
  env["PYTHONNOUSERSITE"] = "1";
  env["NCCL_NVLS_ENABLE"] = "0";  // NVLink multicast stays off in every process kz starts (docs/scale.md)
  // The scratch dir (the cwd, writable, and a spare's exists before its request) stays off sys.path.
  env["PYTHONSAFEPATH"] = "1";
  // Builds stay in the worker's own scratch dir (each request's harness names its own dir there);
  // the supervisor keeps them afterwards (Evaluator, extension_builds_dir). The Triton cache too, and
  // it is never shared: it holds C modules (Triton's driver helper, a launcher per kernel signature)
  // imported under keys anyone can compute (docs/evaluation.md, "Shared compile caches"). A fork
  // server's child points it at its request's dir (fork_server.run_child).
  env["TORCH_EXTENSIONS_DIR"] = (scratch / "torch_extensions").string();
  env["TRITON_CACHE_DIR"] = (scratch / "triton").string();
  env["MAX_JOBS"] = std::to_string(cpu_cores());
  if (!cuda_home.empty()) env["CUDA_HOME"] = cuda_home;
  if (!setup.bytecode_prefix.empty()) env["PYTHONPYCACHEPREFIX"] = setup.bytecode_prefix.string();
  if (!setup.lighter_builds_dir.empty()) env["KZ_LIGHTER_BUILDS_DIR"] = setup.lighter_builds_dir.string();
  if (!setup.triton_helpers_dir.empty()) env["KZ_TRITON_HELPERS_DIR"] = setup.triton_helpers_dir.string();
  if (!setup.parallel_nvcc.empty()) {
    env["KZ_PARALLEL_NVCC"] = setup.parallel_nvcc.string();
    env["KZ_NVCC_SIDE_BY_SIDE"] = setup.nvcc_side_by_side;
  }
  if (setup.cuda_connections > 0) env["CUDA_DEVICE_MAX_CONNECTIONS"] = std::to_string(setup.cuda_connections);
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "KZ_NVRTC_LIB", "KZ_RTC_ARCH",
                           "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                           "LANG", "LC_ALL",
                           // NVLink multicast stays off where the host requires it (shared GPUs).
                           "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"}) {
    if (auto it = parent.find(name); it != parent.end()) env[name] = it->second;
  }
  return env;
}

std::string tail(const std::string& text, size_t max_chars = 3000) {
  // stderr is arbitrary bytes, and the cut may split a character: repair it for JSON.
  return to_valid_utf8(text.size() <= max_chars ? text : "..." + text.substr(text.size() - max_chars));
}

WorkerOutcome failed(WorkerOutcome::Kind kind, std::string stage, std::string message) {
  WorkerOutcome outcome;
  outcome.kind = kind;
  outcome.stage = std::move(stage);
  outcome.message = std::move(message);
  return outcome;
}

// Seconds spent in each stage, closed one by one as the next begins.
class StageClock {
 public:
  void close(const std::string& stage) {
    auto now = Clock::now();
    stages_.emplace_back(stage, std::chrono::duration<double>(now - started_).count());
    started_ = now;
  }
  std::vector<std::pair<std::string, double>> take() { return std::move(stages_); }

 private:
  Clock::time_point started_ = Clock::now();
  std::vector<std::pair<std::string, double>> stages_;
};

WorkerOutcome with_stages(WorkerOutcome outcome, StageClock& clock, const std::string& stage) {
  clock.close(stage);
  outcome.stage_s = clock.take();
  return outcome;
}

// The child's exit as a fork server reports it ("fork_server_done").
ExitInfo child_exit(const nlohmann::json& done) {
  ExitInfo exit;
  if (done.contains("exit_code") && done["exit_code"].is_number_integer()) {
    exit.exited = true;
    exit.exit_code = done["exit_code"].get<int>();
  }
  if (done.contains("signal") && done["signal"].is_number_integer()) exit.term_signal = done["signal"].get<int>();
  return exit;
}

LimitHit child_limit(const nlohmann::json& done) {
  std::string limit = done.value("limit", nlohmann::json()).is_string() ? done["limit"].get<std::string>() : "";
  if (limit == "cpu_time") return LimitHit::cpu_time;
  if (limit == "file_size") return LimitHit::file_size;
  return LimitHit::none;
}

// A worker (or a fork server's child) gone without a verdict: `how` it ended, and its stderr.
WorkerOutcome died(Process& worker, const std::string& stage, const std::string& how) {
  return failed(WorkerOutcome::Kind::crashed, stage,
                fmt::format("worker died during stage '{}' ({}) without a verdict; stderr:\n{}", stage, how,
                            tail(worker.stderr_tail())));
}

// How one request ended, and whether the fork server that ran it can take the next.
struct Supervised {
  WorkerOutcome outcome;
  bool server_reusable = false;
  // The server failed (died, or could not start a child) before the child's first message, that
  // is before any candidate code ran: KernelZero's failure, not the candidate's.
  bool server_failed = false;
};

// A fresh secret for one request: the harness puts it in every message it sends, and keeps it
// where candidate code is refused (docs/evaluation.md, `forged_message` and "Holes that remain").
std::string message_token() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", device(), device(), device(), device());
}

// The worker's process group's priority through its stages:
//  - started at [tuning] prepare_niceness (its start-up and device preparation), it is set to the
//    supervising thread's nice value (the one a worker is spawned at: kz renices none of its own
//    threads) as soon as its first stage message is read (load_reference, sent before the candidate
//    is imported), and again at each later one and at the request's end: a fork server forks its next child right
//    after relaying the first message, and a fork caught midway by the first setpriority keeps the
//    increment (the kernel copies the nice value early in a fork, and adds the child to the group
//    late). So a server's later children prepare at the supervisor's value;
//  - at `timing_niceness` for its timing stage and at `compile_niceness` for its compile stage, and
//    back to what it had at the next stage (or, for a server that serves again, at the request's
//    end): the exclusive GPU hold inside the timing stage keeps every other evaluation on the GPU
//    waiting, so it gets the CPU first; the compile stage (NVRTC, a candidate's import and
//    constructor) is short CPU work that a cold batch's builds otherwise stretch.
// A fork server's group holds its evaluating child (and its spare). Without CAP_SYS_NICE a lower
// value is refused, and nothing changes. Never used on a group that was reaped: its id may be
// someone else's by then.
class StagePriority {
 public:
  StagePriority(pid_t group, std::map<std::string, int> stage_niceness, bool prepared_apart)
      : group_(group), stage_niceness_(std::move(stage_niceness)),
        set_back_to_(prepared_apart ? own_nice_value() : std::nullopt) {}

  void enter(const std::string& stage) {
    auto boost = stage_niceness_.find(stage);
    int wanted = boost == stage_niceness_.end() ? 0 : boost->second;  // 0: no boost
    if (set_back_to_) {
      // Straight to this stage's value: setting back first and boosting after would show the group
      // the supervisor's value in between. A refused boost leaves the set-back value.
      if (wanted == 0 || setpriority(PRIO_PGRP, group_, wanted) != 0) setpriority(PRIO_PGRP, group_, *set_back_to_);
      return;
    }
    if (wanted == boosted_to_) return;
    if (wanted != 0) {
      if (boosted_to_ == 0) {
        errno = 0;
        int before = getpriority(PRIO_PROCESS, group_);  // the group leader's: what every member had
        if (errno != 0) return;
        before_ = before;
      }
      if (setpriority(PRIO_PGRP, group_, wanted) != 0) return;
    } else {
      setpriority(PRIO_PGRP, group_, before_);  // the group may be gone (killed): nothing to restore
    }
    boosted_to_ = wanted;
  }

 private:
  // The supervising thread's: what a worker gets without the increment.
  static std::optional<int> own_nice_value() {
    errno = 0;
    int own = getpriority(PRIO_PROCESS, 0);
    return errno == 0 ? std::optional<int>(own) : std::nullopt;
  }

  pid_t group_;
  std::map<std::string, int> stage_niceness_;  // stage -> the group's nice value in it (0: left alone)
  int before_ = 0, boosted_to_ = 0;  // without set_back_to_: the value to restore, and the boost set
  std::optional<int> set_back_to_;  // the value the group is set to at every stage (prepare_niceness)
};

// Follows the worker's stage messages until its result, a deadline or its death. A fork server
// (fork_server) relays its child's messages, then reports the child gone ("fork_server_done"); a
// worker started for one request is killed once its result is in. Every kScratchLook, and at the
// result, it looks at what `scratch` holds, and kills the worker past `bound` (LimitHit::scratch).
Supervised supervise(Process& worker, const StageDeadline& deadline_s, bool fork_server, const std::string& token,
                     StagePriority priority, const fs::path& scratch, const ScratchBound& bound) {
  std::string stage = "startup";
  StageClock clock;
  auto deadline = Clock::now() + std::chrono::duration<double>(deadline_s(stage));
  std::optional<nlohmann::json> result;
  bool child_spoke = false;  // a message of the child's arrived (its first comes before candidate code)
  auto finish = [&](WorkerOutcome outcome, bool reusable) {
    if (reusable) priority.enter("done");  // the server's next request starts at its own priority
    bool server_failed = fork_server && !child_spoke && outcome.kind == WorkerOutcome::Kind::crashed;
    return Supervised{with_stages(std::move(outcome), clock, stage), reusable, server_failed};
  };
  decltype(deadline) next_look = Clock::now() + kScratchLook;  // deadline's clock and representation
  // Past the bound: the worker is killed, whatever it says next (its result included).
  auto scratch_overfull = [&]() -> std::optional<Supervised> {
    auto look_started = Clock::now();
    auto over = scratch_over_bound(scratch, bound, worker.members());
    // A slow look (a tree of many entries) is spaced out further: reading the worker comes first.
    auto look = Clock::now() - look_started;
    next_look = Clock::now() + std::max<Clock::duration>(kScratchLook, 4 * look);
    if (!over) return std::nullopt;
    worker.kill_and_reap();
    WorkerOutcome outcome = failed(WorkerOutcome::Kind::crashed, stage, "the worker was killed: " + *over);
    outcome.limit_hit = LimitHit::scratch;
    return finish(std::move(outcome), false);
  };
  for (;;) {
    if (bound.any() && Clock::now() >= next_look)
      if (auto overfull = scratch_overfull()) return std::move(*overfull);
    auto until = bound.any() ? std::min(deadline, next_look) : deadline;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());  // never wake early
    std::string line;
    auto event = worker.read_message(line, std::max(left, std::chrono::milliseconds(0)));
    if (event == Process::ReadEvent::timeout && Clock::now() < deadline) continue;  // time for a look
    if (event == Process::ReadEvent::timeout && result) {  // the result is in; the server did not finish
      worker.kill_and_reap();
      return finish({WorkerOutcome::Kind::result, std::move(*result), stage}, false);
    }
    if (event == Process::ReadEvent::timeout) {
      worker.kill_and_reap();
      auto outcome = failed(WorkerOutcome::Kind::timeout, stage,
                            fmt::format("stage '{}' ran past its {:g} s limit; the worker was killed", stage,
                                        deadline_s(stage)));
      outcome.limit_s = deadline_s(stage);
      return finish(std::move(outcome), false);
    }
    if (event == Process::ReadEvent::eof) {
      auto exit = worker.wait_for(std::chrono::seconds(10));
      std::string how = exit ? exit->describe() : "no exit after closing its pipe";
      worker.kill_and_reap();  // the group may still hold the worker's orphans
      if (result) return finish({WorkerOutcome::Kind::result, std::move(*result), stage}, false);
      return finish(died(worker, stage, how), false);
    }
    auto message = nlohmann::json::parse(line, nullptr, false);
    std::string type = message.is_object() ? message.value("type", "") : "";
    if (result && type != "fork_server_done") continue;  // the verdict is in: only the server's word counts
    if (type != "fork_server_done") child_spoke = true;
    if ((type == "stage" || type == "result") && message.value("token", nlohmann::json()) != token) {
      worker.kill_and_reap();  // a candidate that forges one message may forge the next
      return finish(failed(WorkerOutcome::Kind::forged, stage,
                           fmt::format("a '{}' message without the request's token reached the supervisor: "
                                       "written by candidate code, not by the harness: {}",
                                       type, tail(line, 300))),
                    false);
    }
    if (message.is_object()) message.erase("token");
    if (type == "stage") {
      clock.close(stage);
      stage = message.value("name", "?");
      priority.enter(stage);
      deadline = Clock::now() + std::chrono::duration<double>(deadline_s(stage));
    } else if (type == "result") {
      if (bound.any())
        if (auto overfull = scratch_overfull()) return std::move(*overfull);
      result = std::move(message);
      if (!fork_server) {
        worker.wait_for(std::chrono::seconds(10));
        worker.kill_and_reap();  // nothing the candidate started may outlive its evaluation
        return finish({WorkerOutcome::Kind::result, std::move(*result), stage}, false);
      }
      deadline = Clock::now() + kServerCleanUp;
    } else if (type == "fork_server_done" && fork_server) {
      // A process cap crossed in this request is this request's (the cgroup's count of refused
      // forks only grows): look now, not at the next poll, which would charge the next request.
      worker.check_task_cap();
      bool reusable = message.value("leftovers", 1) == 0      // else processes of this request may live on
                      && !message.value("retire", true)        // the server's CPU time is half its limit
                      && worker.limit_hit() == LimitHit::none;
      if (!reusable) worker.kill_and_reap();
      if (result) {
        WorkerOutcome outcome{WorkerOutcome::Kind::result, std::move(*result), stage};
        outcome.limit_hit = worker.limit_hit();
        return finish(std::move(outcome), reusable);
      }
      std::string how = message.contains("error") ? message.value("error", std::string("?"))
                                                   : child_exit(message).describe();
      WorkerOutcome outcome = died(worker, stage, how);
      outcome.limit_hit = child_limit(message);
      if (outcome.limit_hit == LimitHit::none) outcome.limit_hit = worker.limit_hit();
      return finish(std::move(outcome), reusable);
    } else {
      worker.kill_and_reap();
      return finish(failed(WorkerOutcome::Kind::protocol_error, stage,
                           "worker sent an unexpected message: " + tail(line, 300)),
                    false);
    }
  }
}

// A spawned worker or fork server and its scratch dir (removed with it, unless keep_scratch).
struct StartedWorker {
  Process process;
  fs::path scratch;
  bool keep_scratch = false;
  int requests = 0;  // served so far (a fork server)

  StartedWorker(Process p, fs::path dir, bool keep) : process(std::move(p)), scratch(std::move(dir)), keep_scratch(keep) {}
  StartedWorker(StartedWorker&& other) noexcept
      : process(std::move(other.process)),
        scratch(std::move(other.scratch)),
        keep_scratch(other.keep_scratch),
        requests(other.requests) {
    other.scratch.clear();
  }
  StartedWorker& operator=(StartedWorker&&) = delete;
  ~StartedWorker() {
    if (scratch.empty() || keep_scratch) return;
    process.kill_and_reap();  // nothing may still write there
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
  }
};

ProcessSpec worker_spec(const WorkerSetup& setup, const fs::path& scratch,
                        const std::function<void(ProcessSpec&)>& customize) {
  ProcessSpec spec;
  spec.argv = {setup.python, "-m", "kz_worker"};
  spec.env = worker_environment(setup, scratch);
  if (setup.fork_server) spec.env["KZ_WORKER_FORK_SERVER"] = "1";
  spec.cwd = scratch;
  spec.defer_stdin = true;  // the request follows (a fork server: one after another)
  spec.message_pipe = true;
  spec.nice_increment = setup.prepare_niceness;  // until the first stage (StagePriority); a build's customize sets its own
  if (customize) customize(spec);
  // The server's own tasks come on top of each request's: itself and its threads (OpenMP's pool,
  // one per core, from the imports' warm-up).
  if (setup.fork_server && spec.limits.max_processes > 0)
    spec.limits.max_processes += static_cast<uint64_t>(cpu_cores()) + 8;
  return spec;
}

std::string server_key(const WorkerSetup& setup, const std::string& scratch_prefix,
                       const std::function<void(ProcessSpec&)>& customize);

// A zygote and the scratch dir it runs in (removed with it, unless keep_scratch).
struct StartedZygote {
  std::shared_ptr<Zygote> zygote;
  fs::path scratch;
  bool keep_scratch = false;
  bool failure_said = false;  // its failure was warned about (once per kind)
  ~StartedZygote() {
    zygote.reset();  // its socket closes: it exits
    std::error_code ignored;
    if (!scratch.empty() && !keep_scratch) fs::remove_all(scratch, ignored);
  }
};

// "; its stderr:\n..." where the zygote wrote any (its imports' complaints, a traceback).
std::string stderr_of(const Zygote& zygote) {
  std::string tail = to_valid_utf8(zygote.stderr_tail());
  return tail.empty() ? "" : "; its stderr:\n" + tail;
}

// A zygote per kind of fork server (server_key), started at the first server of that kind and kept
// for the process's life. Process-wide, like IdleServers.
class Zygotes {
 public:
  static Zygotes& instance() {
    static Zygotes zygotes;
    return zygotes;
  }

  // The zygote for servers of `key` (setup, scratch_prefix, customize), started now where there is
  // none; nullptr where it cannot start (the reason in `why`) or failed before (`why` left empty:
  // that was said then): servers of that kind then start on their own.
  std::shared_ptr<Zygote> get(const std::string& key, const WorkerSetup& setup, const std::string& scratch_prefix,
                              const std::function<void(ProcessSpec&)>& customize, std::string& why) {
    std::lock_guard lock(mutex_);
    auto& entry = zygotes_[key];
    if (entry && entry->zygote && entry->zygote->alive()) return entry->zygote;
    if (entry) {  // it failed: no second try, whose wait every server would pay again
      // One that ended with no failed spawn to say so (it died between spawns) is said here, once.
      if (entry->zygote && !entry->failure_said) why = "it has ended" + stderr_of(*entry->zygote);
      if (entry->zygote) entry->failure_said = true;
      return nullptr;
    }
    entry = std::make_unique<StartedZygote>();
    auto scratch = make_scratch_dir(scratch_root_of(setup), scratch_prefix + "zygote-", setup.keep_scratch);
    if (!scratch.ok()) {
      why = scratch.status().message();
      return nullptr;
    }
    entry->scratch = *scratch;
    entry->keep_scratch = setup.keep_scratch;
    auto started = Zygote::start(zygote_spec(setup, worker_spec(setup, *scratch, customize)));
    if (!started.ok()) {
      why = started.status().message();
      return nullptr;
    }
    entry->zygote = std::move(*started);
    return entry->zygote;
  }

  // A spawn's failure was warned about (with the zygote's stderr): get() says nothing more of it.
  void failure_said(const std::string& key) {
    std::lock_guard lock(mutex_);
    if (auto it = zygotes_.find(key); it != zygotes_.end() && it->second) it->second->failure_said = true;
  }

  // Ends every zygote (a later server starts its kind's again).
  void stop_all() {
    std::lock_guard lock(mutex_);
    zygotes_.clear();
  }

 private:
  // The zygote itself: a server's program and environment (`server`, made for the zygote's own
  // scratch dir), without the sandbox, which each server applies to itself after the fork.
  static ProcessSpec zygote_spec(const WorkerSetup& setup, const ProcessSpec& server) {
    ProcessSpec spec;
    spec.argv = server.argv;
    spec.env = server.env;
    spec.env["KZ_WORKER_ZYGOTE"] = "1";
    spec.env["KZ_ZYGOTE_LIB"] = setup.zygote_library.string();
    spec.cwd = server.cwd;
    spec.nice_increment = server.nice_increment;
    return spec;
  }

  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<StartedZygote>> zygotes_;
};

// Once per kind: Zygotes::get says why only the first time.
void warn_without_zygote(const std::string& why) {
  if (why.empty()) return;
  fmt::print(stderr, "kz: worker zygote: {}; fork servers of this kind start on their own\n", why);
}

// A fork server forked by its kind's zygote; started as a program of its own where there is no
// zygote (a warning, once per kind), or where the zygote failed this time.
Result<Process> spawn_from_zygote(const WorkerSetup& setup, const std::string& scratch_prefix,
                                  const std::function<void(ProcessSpec&)>& customize, const ProcessSpec& spec) {
  std::string key = server_key(setup, scratch_prefix, customize);
  std::string why;
  if (auto zygote = Zygotes::instance().get(key, setup, scratch_prefix, customize, why)) {
    auto forked = zygote->spawn(spec, kZygoteAnswer);
    if (forked.ok()) return forked;
    why = forked.status().message() + stderr_of(*zygote);
    Zygotes::instance().failure_said(key);
  }
  warn_without_zygote(why);
  return Process::spawn(spec);
}

Result<StartedWorker> start_worker(const WorkerSetup& setup, const std::string& scratch_prefix,
                                   const std::function<void(ProcessSpec&)>& customize) {
  auto scratch = make_scratch_dir(scratch_root_of(setup), scratch_prefix, setup.keep_scratch);  // kz/eval/scratch_dirs.h
  if (!scratch.ok()) return scratch.status().with_context("creating the scratch dir");
  auto discard = [&](const Status& status) {
    std::error_code ignored;
    fs::remove_all(*scratch, ignored);
    return status;
  };
  // A fork server's dir outlives its requests, whose dirs have random names: unlistable, so that a
  // candidate who learnt the server's path cannot find the request (a sibling's) running there.
  if (Status hidden = setup.fork_server ? make_unlistable_dir(*scratch) : Status::ok(); !hidden.is_ok())
    return discard(hidden.with_context("hiding the fork server's scratch dir"));
  ProcessSpec spec = worker_spec(setup, *scratch, customize);
  auto worker = setup.fork_server && !setup.zygote_library.empty()
                    ? spawn_from_zygote(setup, scratch_prefix, customize, spec)
                    : Process::spawn(spec);
  if (!worker.ok()) return discard(worker.status());
  if (auto missing = missing_isolation(spec, worker->sandbox()); setup.require_isolation && !missing.empty()) {
    worker->kill_and_reap();
    return discard(io_error(fmt::format("the worker did not get {} ([sandbox] require_isolation): {}",
                                        fmt::join(missing, ", "), fmt::join(worker->sandbox().notes, "; "))));
  }
  return StartedWorker(std::move(*worker), *scratch, setup.keep_scratch);
}

// What makes two fork servers interchangeable: their whole spec, the scratch dir left out.
std::string server_key(const WorkerSetup& setup, const std::string& scratch_prefix,
                       const std::function<void(ProcessSpec&)>& customize) {
  const fs::path placeholder = "/<scratch>";
  ProcessSpec spec = worker_spec(setup, placeholder, customize);
  const ResourceLimits& l = spec.limits;
  std::vector<std::string> writable;
  for (const auto& path : spec.writable_paths) writable.push_back(path.string());
  nlohmann::json tmpfs = nlohmann::json::array();
  for (const auto& fresh : spec.fresh_tmpfs) tmpfs.push_back({fresh.path.string(), fresh.size_bytes});
  nlohmann::json key = {{"argv", spec.argv}, {"env", spec.env}, {"root", setup.scratch_root.string()},
                        {"keep", setup.keep_scratch},  // a kept server's dir carries no owner token (scratch_dirs.h)
                        {"require_isolation", setup.require_isolation},  // a tolerant setup's server may lack some
                        {"prefix", scratch_prefix}, {"writable", writable}, {"tmpfs", tmpfs},
                        {"flags", {spec.new_network_namespace, spec.read_only_filesystem, spec.new_pid_namespace, spec.drop_capabilities,
                                   spec.new_process_group, spec.syscall_filter}},
                        {"nice", spec.nice_increment},
                        {"limits", {l.cpu_time_s, l.file_size_bytes, l.max_processes, l.address_space_bytes,
                                    l.open_files, l.no_core_dumps}}};
  return key.dump();
}

// Fork servers waiting for their next request, by server_key. Process-wide: every Evaluator
// shares them. As many of a kind as requests of that kind ran at once.
class IdleServers {
 public:
  static IdleServers& instance() {
    static IdleServers servers;  // destroyed at exit: the servers are killed, their scratch dirs removed
    return servers;
  }
  ~IdleServers() { end_side_by_side(take_all()); }

  // The server idle longest. One that died while idle (killed from outside) is dropped: its death
  // is no evaluation's fault.
  std::optional<StartedWorker> take(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = idle_.find(key);
    while (it != idle_.end() && !it->second.empty()) {
      StartedWorker server = std::move(it->second.front());
      it->second.pop_front();
      if (!server.process.wait_for(std::chrono::milliseconds(0))) return server;
    }
    return std::nullopt;
  }

  // Keeps `server` for a later request, unless `max_idle` of its kind wait already (0: no cap).
  void add(const std::string& key, StartedWorker server, int max_idle) {
    std::lock_guard lock(mutex_);
    auto& idle = idle_[key];
    if (max_idle > 0 && static_cast<int>(idle.size()) >= max_idle) return;  // killed on return
    idle.push_back(std::move(server));
  }

  // Every idle server, of every kind, taken out (stop_fork_servers).
  std::vector<StartedWorker> take_all() {
    std::lock_guard lock(mutex_);
    std::vector<StartedWorker> all;
    for (auto& [key, idle] : idle_)
      for (auto& server : idle) all.push_back(std::move(server));
    idle_.clear();
    return all;
  }

  // Kills every one of `servers` before reaping any: their children (a spare each, with its CUDA
  // context) then end side by side instead of one server after another. Returns how many.
  static int end_side_by_side(std::vector<StartedWorker> servers) {
    for (auto& server : servers) server.process.kill_group(SIGKILL);
    // Reaped as `servers` goes (a zygote's child once its zygote reported its end), dirs removed.
    return static_cast<int>(servers.size());
  }

 private:
  // The zygotes first, so that they are destroyed after the servers at exit: a zygote reports the
  // end of each server it forked.
  IdleServers() { (void)Zygotes::instance(); }

  std::mutex mutex_;
  std::map<std::string, std::deque<StartedWorker>> idle_;
};

// Empties a fork server's scratch dir before its next request, so no file of one evaluation is
// seen by the next: directories a child made unwritable are made writable first. False when
// something is left (the server must not serve again).
bool clear_scratch(const StartedWorker& server) {
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(server.scratch, fs::directory_options::none, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error))
    if (it->is_directory(error) && !it->is_symlink(error))
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, error);
  for (const auto& entry : fs::directory_iterator(server.scratch, error)) fs::remove_all(entry.path(), error);
  return fs::is_empty(server.scratch, error) && !error;
}

// One request on `worker`: a fork server where setup.fork_server, else a worker started for it.
Supervised run_one_request(StartedWorker& worker, const fs::path& request_scratch,
                           const std::function<nlohmann::json(const fs::path&)>& make_request,
                           const StageDeadline& deadline_s, const WorkerSetup& setup) {
  const bool fork_server = setup.fork_server;
  nlohmann::json request_json = make_request(request_scratch);
  std::string token = message_token();
  request_json["message_token"] = token;
  // Sources may hold any bytes.
  std::string request = request_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  Process& process = worker.process;
  if (fork_server) {
    process.clear_output_tails();
    process.write_stdin(request + "\n");
  } else {
    process.send_stdin(request);
  }
  Supervised supervised =
      supervise(process, deadline_s, fork_server, token,
                StagePriority(process.pid(), {{"timing", setup.timing_niceness}, {"compile", setup.compile_niceness}},
                              setup.prepare_niceness != 0),
                worker.scratch,
                setup.scratch_bound);
  WorkerOutcome& outcome = supervised.outcome;
  if (outcome.limit_hit == LimitHit::none) outcome.limit_hit = process.limit_hit();
  outcome.sandbox = process.sandbox();
  return supervised;
}

// One request on a fork server of `key`: an idle one, else a new one.
Result<Supervised> run_on_fork_server(const WorkerSetup& setup, const std::string& key,
                                      const std::string& scratch_prefix,
                                      const std::function<nlohmann::json(const fs::path&)>& make_request,
                                      const StageDeadline& deadline_s,
                                      const std::function<void(ProcessSpec&)>& customize,
                                      const std::function<void(const fs::path&)>& after_request) {
  std::optional<StartedWorker> server = IdleServers::instance().take(key);
  // Forking from a zygote waits for its imports the first time: the request's start-up, as a
  // server's own imports are. An idle server costs none.
  double spawn_s = 0;
  if (!server) {
    auto spawn_started = Clock::now();
    auto fresh = start_worker(setup, scratch_prefix, customize);
    if (!fresh.ok()) return fresh.status();
    server.emplace(std::move(*fresh));
    spawn_s = std::chrono::duration<double>(Clock::now() - spawn_started).count();
  }
  // server->keep_scratch is this request's choice: keep_scratch is part of the server's key.
  fs::path request_scratch = server->scratch / request_dir_name(++server->requests);
  std::error_code error;
  if (!fs::create_directory(request_scratch, error))  // never one a child left behind
    return internal_error(fmt::format("creating the scratch dir {}: {}", request_scratch.string(),
                                      error ? error.message() : "it exists already"));
  Supervised supervised = run_one_request(*server, request_scratch, make_request, deadline_s, setup);
  auto& stages = supervised.outcome.stage_s;
  if (!stages.empty() && stages.front().first == "startup") stages.front().second += spawn_s;
  supervised.outcome.server_wait_s = spawn_s;
  if (after_request) after_request(request_scratch);
  // With keep_scratch the files stay, so the server does not serve again.
  if (supervised.server_reusable && !setup.keep_scratch && clear_scratch(*server))
    IdleServers::instance().add(key, std::move(*server), setup.max_idle_servers);
  return supervised;  // a server not given back is killed here, its scratch dir removed
}

// The prefix scripts/compile_worker_bytecode.py finished (its marker is written last), for the
// interpreter it was made with: the build's. Another interpreter keeps its own bytecode.
fs::path bytecode_prefix_for(const std::string& python) {
  if (python != KZ_DEFAULT_PYTHON) return {};
  fs::path prefix = env_or("KZ_BYTECODE_PREFIX", KZ_DEFAULT_BYTECODE_PREFIX);
  std::error_code error;
  return fs::exists(prefix / ".kz-complete", error) ? prefix : fs::path();
}

// One request in a worker started for it (no fork server).
Result<WorkerOutcome> run_on_own_worker(const WorkerSetup& setup, const std::string& scratch_prefix,
                                        const std::function<nlohmann::json(const fs::path&)>& make_request,
                                        const StageDeadline& deadline_s,
                                        const std::function<void(ProcessSpec&)>& customize,
                                        const std::function<void(const fs::path&)>& after_request) {
  auto worker = start_worker(setup, scratch_prefix, customize);
  if (!worker.ok()) return worker.status();
  Supervised supervised = run_one_request(*worker, worker->scratch, make_request, deadline_s, setup);
  if (after_request) after_request(worker->scratch);
  return std::move(supervised.outcome);
}

}  // namespace

int stop_fork_servers() {
  int count = IdleServers::end_side_by_side(IdleServers::instance().take_all());
  Zygotes::instance().stop_all();  // after their servers: a zygote reports each one's end
  return count;
}

bool uses_fork_server(const TuningOptions& tuning, const std::string& device) {
  return tuning.fork_server == "always" || (tuning.fork_server == "gpu" && device != "cpu");
}

Result<WorkerSetup> resolve_worker_setup(const WorkerOptions& options, const TuningOptions& tuning,
                                         const std::string& device) {
  WorkerSetup setup;
  setup.python = !options.python.empty() ? options.python : env_or("KZ_PYTHON", KZ_DEFAULT_PYTHON);
  fs::path worker_dir = !options.worker_dir.empty() ? options.worker_dir
                                                    : fs::path(env_or("KZ_WORKER_DIR", KZ_DEFAULT_WORKER_DIR));
  if (!fs::exists(worker_dir / "kz_worker" / "__main__.py"))
    return not_found(fmt::format("evaluation worker not found: {} (set KZ_WORKER_DIR or [worker] worker_dir)",
                                 (worker_dir / "kz_worker").string()));
  if (setup.python.find('/') != std::string::npos && !fs::exists(setup.python))
    return not_found(
        fmt::format("worker Python '{}' does not exist (run scripts/setup.sh, or set KZ_PYTHON)", setup.python));
  setup.worker_dir = fs::absolute(worker_dir);
  setup.cache_dir = !options.cache_dir.empty() ? options.cache_dir : default_cache_dir();
  setup.scratch_root = options.scratch_root;
  setup.keep_scratch = options.keep_scratch;
  setup.cuda_connections = options.cuda_connections;
  setup.fork_server = uses_fork_server(tuning, device);
  setup.bytecode_prefix = bytecode_prefix_for(setup.python);
  if (tuning.zygote) {
    fs::path library = env_or("KZ_ZYGOTE_LIBRARY", KZ_DEFAULT_ZYGOTE_LIBRARY);
    std::error_code missing;
    if (!library.empty() && fs::exists(library, missing)) setup.zygote_library = fs::absolute(library);
  }
  if (tuning.parallel_nvcc) {
    fs::path tool = env_or("KZ_PARALLEL_NVCC", KZ_DEFAULT_PARALLEL_NVCC);
    std::error_code missing;
    if (!tool.empty() && fs::exists(tool, missing)) setup.parallel_nvcc = fs::absolute(tool);
    setup.nvcc_side_by_side = tuning.nvcc_side_by_side;
  }
  fs::path lighter_builds = env_or("KZ_LIGHTER_BUILDS_DIR", KZ_DEFAULT_LIGHTER_BUILDS_DIR);
  std::error_code error;
  // Absolute: workers run in their scratch dirs.
  if (fs::is_directory(lighter_builds, error)) setup.lighter_builds_dir = fs::absolute(lighter_builds);
  fs::path triton_helpers = env_or("KZ_TRITON_HELPERS_DIR", KZ_DEFAULT_TRITON_HELPERS_DIR);
  if (fs::exists(triton_helpers / ".kz-complete", error))  // triton_helpers.py
    setup.triton_helpers_dir = fs::absolute(triton_helpers);
  return setup;
}

void set_worker_device(const std::string& device, ProcessSpec& spec) {
  if (device == "cpu") spec.env["TRITON_INTERPRET"] = "1";
  spec.env["KZ_WORKER_DEVICE"] = device;
}

Result<WorkerOutcome> run_worker_request(const WorkerSetup& setup, const std::string& scratch_prefix,
                                         const std::function<nlohmann::json(const fs::path&)>& make_request,
                                         const StageDeadline& deadline_s,
                                         const std::function<void(ProcessSpec&)>& customize,
                                         const std::function<void(const fs::path&)>& after_request) {
  if (!setup.fork_server) return run_on_own_worker(setup, scratch_prefix, make_request, deadline_s, customize, after_request);
  std::string key = server_key(setup, scratch_prefix, customize);
  auto supervised = run_on_fork_server(setup, key, scratch_prefix, make_request, deadline_s, customize, after_request);
  // A server that failed before its child's first message (killed while idle, a fork refused at a
  // process limit, a child that could not set up) is no verdict on the candidate: once more, on
  // another server where that one is gone.
  if (supervised.ok() && supervised->server_failed)
    supervised = run_on_fork_server(setup, key, scratch_prefix, make_request, deadline_s, customize, after_request);
  if (!supervised.ok()) return supervised.status();
  return std::move(supervised->outcome);
}

Status start_fork_servers(const WorkerSetup& setup, const std::string& scratch_prefix,
                          const std::function<void(ProcessSpec&)>& customize, int count) {
  if (!setup.fork_server) return Status::ok();
  std::string key = server_key(setup, scratch_prefix, customize);
  if (!setup.zygote_library.empty()) {
    std::string why;
    if (Zygotes::instance().get(key, setup, scratch_prefix, customize, why)) return Status::ok();
    warn_without_zygote(why);
  }
  for (int i = 0; i < count; ++i) {
    auto server = start_worker(setup, scratch_prefix, customize);
    if (!server.ok()) return server.status().with_context(fmt::format("starting fork server {} of {}", i + 1, count));
    IdleServers::instance().add(key, std::move(*server), 0);  // as many as asked for
  }
  return Status::ok();
}

}  // namespace kz
