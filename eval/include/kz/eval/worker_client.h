// Running one Python worker process (`python -m kz_worker`): its scrubbed environment, its
// scratch directory, the JSON request on stdin, a deadline per announced stage on the messages it
// sends on fd 3, and the final "result" message.
//
// Shared by the Evaluator (a candidate against a reference) and the Proposer's module validation
// (curriculum/, request mode "validate_module"), so both get the same process isolation: own
// process group, nothing inherited but an allow-list of variables, a crash or a hang becomes an
// outcome, never an exception or a stuck supervisor.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <optional>
#include <utility>
#include <vector>
#include <string>

#include "kz/core/status.h"
#include "kz/sandbox/process.h"
#include "kz/eval/options.h"
#include "kz/eval/scratch_dirs.h"

namespace kz {

struct WorkerSetup {
  std::string python;                  // the interpreter (resolved)
  std::filesystem::path worker_dir;    // the folder holding kz_worker/ (absolute)
  std::filesystem::path cache_dir;     // kept `cuda` builds, the GPU locks
  std::filesystem::path scratch_root;  // per-run scratch dirs; empty: $TMPDIR or /tmp, read at each run
  bool keep_scratch = false;           // keep scratch dirs (debugging)
  bool fork_server = false;            // requests run in children of prepared fork servers (worker/kz_worker/fork_server.py)
  // Fork servers are forked from a zygote per kind of server (worker/kz_worker/zygote.py) through
  // this library (kz_zygote_child: the sandbox steps in the forked child). Empty: each server is a
  // program of its own.
  std::filesystem::path zygote_library;
  // Every isolation the worker's spec asks for must hold ([sandbox] require_isolation): a worker
  // that did not get one is killed, and its start is an error naming what is missing.
  bool require_isolation = false;
  // Workers' KZ_PARALLEL_NVCC: kz-nvcc, which their load_inline runs as nvcc ([tuning] parallel_nvcc).
  // Empty: nvcc itself.
  std::filesystem::path parallel_nvcc;
  std::string nvcc_side_by_side = "always";  // workers' KZ_NVCC_SIDE_BY_SIDE ([tuning] nvcc_side_by_side)
  // Idle fork servers of one kind kept for later requests; more are killed when their request ends
  // (the cuda pre-build runs one per core, the evaluations after it fewer). 0: no cap.
  int max_idle_servers = 0;
  // Workers' PYTHONPYCACHEPREFIX: the bytecode scripts/setup.sh compiled for an interpreter whose
  // installation carries none (scripts/compile_worker_bytecode.py), read-only for them. Empty: none.
  std::filesystem::path bytecode_prefix;
  // Workers' KZ_LIGHTER_BUILDS_DIR: what scripts/prepare_lighter_builds.py prepared at setup for the
  // lighter load_inline builds (named there per installation), read-only for them. Empty: none.
  std::filesystem::path lighter_builds_dir;
  // Workers' KZ_TRITON_HELPERS_DIR: Triton's driver helper, built at setup
  // (scripts/prepare_triton_helpers.py) and linked into each request's own Triton cache, read-only
  // for them. Empty: none (each Triton evaluation builds it).
  std::filesystem::path triton_helpers_dir;
  // Workers' CUDA_DEVICE_MAX_CONNECTIONS ([worker] cuda_connections). 0: not set (the driver's default).
  int cuda_connections = 0;
  // The nice value of a worker's process group while it is in its timing stage ([tuning] timing_niceness),
  // set by the supervisor at the stage message and set back at the next (or at the request's end).
  // 0: left as is.
  int timing_niceness = 0;
  // The same for its compile stage ([tuning] compile_niceness). 0: left as is.
  int compile_niceness = 0;
  // Added to a worker's nice value until its first stage message ([tuning] prepare_niceness), where
  // the supervisor sets its process group to the supervising thread's nice value: start-up and
  // device preparation only. A fork server's group stays there, so its later children prepare at
  // that value too; each new server (its zygote keeps the increment) starts at it again. 0: none.
  int prepare_niceness = 0;
  // What a worker's scratch dir may hold ([sandbox] scratch_mb, scratch_files): the supervisor looks
  // every kScratchLook while the worker runs and kills it past the bound (LimitHit::scratch).
  ScratchBound scratch_bound;
};

// Resolves WorkerOptions and the process knobs of TuningOptions: python (option, else $KZ_PYTHON, else the build's venv), worker_dir
// (option, else $KZ_WORKER_DIR, else the source tree's worker/), cache_dir (option, else
// $XDG_CACHE_HOME/kernelzero or ~/.cache/kernelzero), fork_server for requests on `device`
// (uses_fork_server), bytecode_prefix (for the build's interpreter only: $KZ_BYTECODE_PREFIX, else
// build/pycache, where scripts/setup.sh finished it), lighter_builds_dir ($KZ_LIGHTER_BUILDS_DIR,
// else build/lighter-builds, where it exists), triton_helpers_dir ($KZ_TRITON_HELPERS_DIR, else
// build/triton-helpers, where setup finished it), parallel_nvcc (with the option: $KZ_PARALLEL_NVCC,
// else the kz-nvcc built beside kz), zygote_library (with [tuning] zygote). not_found when the worker
// or Python is missing.
Result<WorkerSetup> resolve_worker_setup(const WorkerOptions& options, const TuningOptions& tuning,
                                         const std::string& device);

// Whether requests on `device` run in fork server children ([tuning] fork_server: always, gpu, never).
bool uses_fork_server(const TuningOptions& tuning, const std::string& device);

// The environment a worker for `device` needs before its first import (a fork server imports
// before any request): KZ_WORKER_DEVICE, and TRITON_INTERPRET=1 on the CPU (Triton reads it when
// imported).
void set_worker_device(const std::string& device, ProcessSpec& spec);

// Seconds the named stage may run before the worker is killed. Called with "startup" first (Python
// and torch imports, up to the first message), then with each stage name the worker announces.
using StageDeadline = std::function<double(const std::string& stage)>;

struct WorkerOutcome {
  // forged: a stage or result message without the request's message token (written by candidate
  // code, not by the harness, which alone holds the token).
  enum class Kind { result, timeout, crashed, protocol_error, forged };
  Kind kind = Kind::protocol_error;
  nlohmann::json result;  // the "result" message, when kind == result
  std::string stage;      // the last stage entered ("startup" before the first message)
  double limit_s = 0;     // the deadline that passed, when kind == timeout
  // timeout: "stage 'X' ran past its N s limit; the worker was killed"; crashed: how it died and the
  // tail of its stderr; protocol_error: the unexpected message; forged: what the forged message said.
  std::string message;
  // Seconds in each stage, in order: "startup" (spawn to the first message), then every stage the
  // worker announced, the last one up to the result (or the timeout / death). Measured here, so a
  // worker cannot misreport them.
  std::vector<std::pair<std::string, double>> stage_s;
  // With a fork server: the part of "startup" spent waiting for the server to be forked or started
  // (its zygote's imports, the first time).
  std::optional<double> server_wait_s;
  LimitHit limit_hit = LimitHit::none;  // a sandbox limit that ended the worker (ProcessSpec::limits)
  SandboxReport sandbox;                // what the sandbox requested in the spec really got
};

// Creates a scratch dir named `scratch_prefix`… under the scratch root, builds the request with
// make_request(scratch), runs the worker there (HOME and TMPDIR point at it), follows its stage
// messages until the result, a deadline or its death, then removes the scratch dir unless
// keep_scratch. `customize` may adjust the process spec before the spawn (limits, sandboxing).
// A non-ok Result: the scratch dir or the process could not be created (KernelZero's failure).
//
// With setup.fork_server, the process is a fork server (worker/kz_worker/fork_server.py): it
// imports torch, Triton and the harness once, then forks a fresh child per request, which runs in
// a new directory inside the server's scratch dir, within the server's sandbox. A request takes an
// idle server of the same kind (the same process spec but for the scratch dir) or starts one, and
// gives it back when its child is gone and nothing it started lives on; the server's scratch dir
// is emptied first. A server that timed out, crashed or left processes behind is killed. Idle
// servers live until the program ends (killed then, scratch dirs removed).
// `after_request`, when given, is called with the request's scratch dir once the request is over
// (every process of it gone) and before that dir is emptied: to keep what it made there.
Result<WorkerOutcome> run_worker_request(const WorkerSetup& setup, const std::string& scratch_prefix,
                                         const std::function<nlohmann::json(const std::filesystem::path&)>& make_request,
                                         const StageDeadline& deadline_s,
                                         const std::function<void(ProcessSpec&)>& customize = {},
                                         const std::function<void(const std::filesystem::path&)>& after_request = {});

// With setup.fork_server: starts `count` fork servers of the kind run_worker_request(setup,
// scratch_prefix, ..., customize) takes, so that the first requests of a batch find theirs
// prepared. With a zygote (setup.zygote_library) it starts that kind's zygote instead and returns
// at once: servers are forked from it as requests come, each request that finds none idle forking
// its own, and no batch waits for the zygote's imports before its first request (they overlap the
// `cuda` pre-builds' start). Nothing without setup.fork_server.
Status start_fork_servers(const WorkerSetup& setup, const std::string& scratch_prefix,
                          const std::function<void(ProcessSpec&)>& customize, int count);

// Ends every idle fork server and every zygote now, as the program's exit would: all servers are
// killed first and reaped after, so their children (a spare each, with its CUDA context) end side by
// side instead of one server after another; their scratch dirs are removed. Called before the exit
// where the time it takes is to be measured (eval-suite's phases). A server serving a request is left
// to it; a later request starts a zygote and servers again. Returns how many servers were ended.
int stop_fork_servers();

}  // namespace kz
