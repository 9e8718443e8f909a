// Every setting of the evaluation, with its default, and its TOML form: the protocol's settings
// (what a verdict depends on), where the worker runs, and apart from them [tuning], the throughput
// knobs, which change how fast verdicts come and never which verdicts come.
//
// configs/eval.toml writes out every default below; `kz config show` prints the resolved values.
// A [section] key in TOML maps to the struct of the same name.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "kz/core/status.h"

namespace kz {

struct ToleranceOptions {
  // How outputs are compared (worker/kz_worker/correctness.py; docs/evaluation.md, Correctness):
  //   "kz": elementwise |out - ref| <= atol + rtol * |ref| and the relative norm, with the values below;
  //   "kernelbench": KernelBench's own check (its per-precision tolerance as atol and rtol, fp32 1e-4,
  //                  fp16/bf16 1e-2; no norm check), for verdicts that compare with its harness's;
  //   "float64": fp32 outputs against the reference run in float64, the bounds widened by what fp32
  //              costs the reference itself (an honest kernel summing in another order passes).
  std::string rule = "kz";
  double atol_fp32 = 1e-4;      // |out - ref| <= atol + rtol * |ref|, elementwise (KernelBench fp32)
  double rtol_fp32 = 1e-4;
  double norm_tol_fp32 = 1e-3;  // ||out - ref|| / ||ref||: catches zeros for near-zero references
  double atol_half = 1e-2;      // fp16 and bf16
  double rtol_half = 1e-2;
  double norm_tol_half = 2e-2;
};

// What ModelNew.forward may run besides the candidate's own kernels (docs/evaluation.md, "Policies").
struct PolicyOptions {
  // "strict": the format's allocation, view, copy and fill ops only (training's rule);
  // "kernelbench": any PyTorch op, as KernelBench allows, but the candidate's own kernels must run
  // and their work must reach the output (the forward replayed with its launches muted must change).
  std::string mode = "strict";
  // A forward whose GPU time in the candidate's own kernels is below this share (the profiled audit's
  // custom_kernel_share; GPU only) is refused (low_custom_kernel_share): lazy answers. 0: off.
  double min_custom_kernel_share = 0;
};

struct TimingOptions {
  bool enabled = true;      // time on GPUs (never on the CPU)
  int warmup_runs = 3;      // untimed passes over all input sets, per model; >= 0
  int runs = 100;           // timed runs per model, reference and candidate interleaved; >= 1
  int input_sets = 4;       // rotating fresh input sets (defeats caching by pointer); >= 1
  int l2_flush_mb = 256;    // buffer written before each run, larger than the GPU's L2 cache; >= 0
  // A GPU spin after the flush and before the start event: the host issues the forward's launches
  // meanwhile, so host launch latency up to this long (Python launchers, a host busy with other
  // evaluations) stays out of both models' samples; beyond it, it counts. >= 0; 0: none.
  int launch_spin_us = 200;
  // What the candidate's speedup is measured against: "eager" (the reference as written: `speedup`)
  // or "compile" (also torch.compile of the reference, compiled before the candidate is imported and
  // timed beside it in every run: `compile_speedup`, besides `speedup`).
  std::string baseline = "eager";
};

// Wall-clock limits per worker stage, in seconds (> 0); past one the worker's process group is killed.
struct StageTimeouts {
  double startup_s = 120;        // Python + torch import, up to the first message
  double load_reference_s = 120;
  double compile_s = 900;        // load_inline builds: minutes on a host with few cores
  double correctness_s = 300;    // all trials (the Triton interpreter is slow)
  double timing_s = 300;
  double recheck_s = 120;
  // Waiting for other evaluations on the GPU to free memory (the worker's reservation,
  // worker/kz_worker/gpu_memory.py); the evaluation's own stages are timed apart.
  double await_memory_s = 3600;
  // Once its slots are held, how long a worker waits for the card itself to have them free: the
  // memory of an evaluation that just ended can take seconds more to be freed by the driver. Past
  // it the evaluation goes on (not killed). >= 0; 0: no wait.
  double device_memory_wait_s = 30;
};

// Where and how the workers run.
struct WorkerOptions {
  std::string python;            // interpreter; empty: $KZ_PYTHON, else the build's default venv
  std::filesystem::path worker_dir;   // folder holding kz_worker/ and kz_rtc/; empty: the source tree's
  std::filesystem::path cache_dir;    // kept `cuda` builds, GPU locks; empty: ~/.cache/kernelzero
  std::filesystem::path scratch_root; // per-evaluation scratch dirs; empty: $TMPDIR or /tmp
  bool keep_scratch = false;     // keep scratch dirs (debugging)
  // Room for the kept `cuda` builds (<cache_dir>/extension_builds, ~1 MB per candidate): past it the
  // ones kept longest ago go. >= 0; 0: no limit.
  int64_t kept_builds_max_mb = 20480;
  // CUDA_DEVICE_MAX_CONNECTIONS of every worker: the hardware work queues of each CUDA context, which
  // the driver makes with the context (fewer: a cheaper context). Work a candidate spreads over
  // several streams shares the queues and overlaps less with fewer of them: such a candidate can time
  // slower, never faster, and the reference (one stream) times the same; so it is a part of the
  // protocol (the verdict cache's key). 0..32; 0: the driver's default (8).
  int cuda_connections = 1;
  // Worker processes that may hold a CUDA context on one GPU at once: its evaluations at once and
  // the spare fork servers (each prepares its next child's context ahead: default_jobs +
  // spare_servers, kz/eval/suite.h). Sent to GPU workers (request gpu_memory_processes), whose
  // memory reservation leaves room for every context. Not a TOML key: kz eval-suite, serve-eval and
  // bench set it from their job counts; a single `kz eval` runs one. >= 1.
  int gpu_memory_processes = 1;
};

// The throughput knobs ([tuning]): how many evaluations run at once, how their processes are made,
// at what CPU priority each part runs. None of them changes a verdict.
struct TuningOptions {
  int jobs = 0;                  // eval-suite evaluations at once; >= 0; 0: CPU cores on cpu, gpu_jobs per GPU
  // A lock file per GPU: a timing runs alone on its GPU while other workers' GPU work waits, so
  // several evaluations share one GPU (jobs = 0 picks gpu_jobs). false: one evaluation per GPU.
  bool exclusive_timing = true;
  int gpu_jobs = 8;              // evaluations at once per GPU with exclusive_timing (capped by the cores); >= 1
  // The nice value a worker's process group gets for its timing stage (the supervisor sets it and
  // sets it back), so the CPU work of its exclusive hold (its runs' launches and checks), which
  // keeps every other evaluation on the GPU waiting, goes before builds and other workers'
  // start-up. Needs CAP_SYS_NICE (root), else nothing changes. -20..0; 0: off.
  int timing_niceness = -10;
  // Run evaluations in children forked from fork servers that imported torch, Triton and the
  // harness once (worker/kz_worker/fork_server.py), instead of a new interpreter each. Every
  // evaluation still gets a fresh process. "always", "gpu" (GPU devices only), or "never".
  std::string fork_server = "always";
  // Fork servers are forked from a zygote of their kind (worker/kz_worker/zygote.py), which did their
  // imports once, instead of each importing on its own. Each server still gets its whole sandbox
  // (namespaces, limits, scratch dir), applied by the supervisor's own code in the forked child.
  // Where no zygote can start or answer, servers are started as programs of their own, with a
  // warning. false: always so.
  bool zygote = true;
  // load_inline's nvcc is kz-nvcc (PYTORCH_NVCC; kz/eval/parallel_nvcc.h): nvcc's own steps, with
  // the host front end and the device chain at once; the same object byte for byte. false: nvcc
  // itself.
  bool parallel_nvcc = true;
  // When kz-nvcc runs the device chain beside the host chain: "always", from the start (a build
  // takes a second core even while every core is busy); "idle", once a core is idle while the host
  // chain runs (else after it, in nvcc's order). Its workers' KZ_NVCC_SIDE_BY_SIDE.
  std::string nvcc_side_by_side = "always";
  // Fork servers kept idle per GPU beyond the evaluations that run at once (`kz serve-eval` starts
  // them with the rest; none on the CPU, where a child is ready at once: spare_servers()), so a
  // request finds one whose child has its CUDA context ready. Each holds a CUDA context. Servers
  // beyond the cap are killed when their request ends. >= 0.
  int spare_servers = 2;
  // Added to the nice value of `cuda` pre-build workers and all they start (nvcc, gcc): below 0 the
  // pre-builds, a cold batch's critical path, get the CPU before the evaluations; above 0 after them.
  // -20..19; 0: same priority; below 0 needs CAP_SYS_NICE (else left at 0).
  int prebuild_niceness = -5;
  // Added to the nice value of evaluation workers (not module validation's) until their first stage
  // message (load_reference, before the candidate is imported), where the supervisor sets their
  // process group back to its own: a worker's start-up (the imports where no server did them) and
  // its device's preparation (the CUDA context). A fork server starts at it (its zygote keeps it)
  // and is set back during its first request, so it covers each new server's start-up and first
  // child. -20..0; 0: none; below 0 needs CAP_SYS_NICE or RLIMIT_NICE (else left at 0); above 0 is
  // refused, since a worker could not be set back without them.
  int prepare_niceness = -5;
  // The nice value of an evaluation worker's process group during its compile stage (the
  // candidate's import and constructor: NVRTC for `cuda-rtc`, loading the pre-built library for
  // `cuda`), set and set back by the supervisor as for timing_niceness, so those compiles get their
  // share of the cores beside pre-builds at prebuild_niceness. -20..0; 0: left as is; below 0 needs
  // CAP_SYS_NICE (else left as is).
  int compile_niceness = -10;
  // Check each candidate's Python syntax in one long-lived interpreter before any worker starts
  // (kz/eval/syntax_check.h): one that is not valid Python gets its compile_error without a worker's
  // start-up. The verdict is the worker's own (same status, check and message). false: the worker
  // finds it.
  bool syntax_check = true;

  Status validate() const;
};

// The verdict cache (kz/eval/cache.h): an evaluation whose inputs were all seen before returns the
// stored verdict without starting a worker.
struct CacheOptions {
  bool enabled = true;           // look verdicts up and store them (`--no-cache` turns it off)
  std::filesystem::path path;    // SQLite file; empty: <worker.cache_dir>/verdicts.sqlite
};

// The sandbox around each worker (docs/evaluation.md, "Sandbox", says what each part enforces and
// what it does not). Limits apply to the worker and to every process it starts, each on its own.
struct SandboxOptions {
  bool enabled = true;           // false: only the process group, scrubbed environment and deadlines
  double cpu_time_s = 3600;      // RLIMIT_CPU per process (all its threads): far above the stage timeouts'
                                 // sum of wall time for one thread; a backstop, not the hang detector
  int file_size_mb = 1024;       // RLIMIT_FSIZE: no file written past this (a torch extension is ~10s of MB)
  // The worker's scratch dir in all (its files' allocated bytes, and its entries): the supervisor
  // looks every 0.5 s while it runs and kills it past either, against many files each under the
  // per-file limit. A bound looked at, not a quota: between two looks a candidate can write what the
  // disk takes in 0.5 s. Files it removed but keeps open (or mapped, where the supervisor has
  // CAP_SYS_ADMIN) count too (scratch_over_bound says which stay hidden). 0: no bound.
  int scratch_mb = 4096;
  int scratch_files = 100000;
  int max_processes = 2048;      // tasks (processes + threads) of the worker and its children; nvcc builds
                                 // run MAX_JOBS = cores compilers at once
  int memory_mb = 32768;         // RLIMIT_AS (address space), CPU device only: CUDA reserves TBs of address
                                 // space, so a GPU worker gets no limit here (gpu_memory_fraction instead)
  int open_files = 4096;         // RLIMIT_NOFILE
  bool network = false;          // false: the worker gets its own network namespace (no network at all)
  bool read_only_filesystem = true;  // everything read-only but scratch and /dev/shm
  // With read_only_filesystem: the worker's /dev/shm is a tmpfs of its own of this size (root only),
  // so what one worker leaves there no other sees (a GRPO sibling's copied source, a cached output),
  // nothing outlives the worker's namespace, and a full one (this size, or one file per 16 KiB of
  // it) fails a write (ENOSPC) instead of filling the host's memory; a fork server empties it
  // between requests. 0: the host's /dev/shm, shared by every worker.
  int shm_mb = 1024;
  bool pid_namespace = true;     // with read_only_filesystem: each worker in its own PID namespace with its own
                                 // /proc (no other worker's process, cwd or cmdline in sight)
  // A seccomp filter on each worker and everything it starts: no new user namespace and no setns
  // (a namespace's capabilities would give a candidate mounts of its own, hiding files from the
  // scratch bound),
  // no io_uring, no 32-bit system calls; clone3 answers ENOSYS, so libc uses clone
  // (ProcessSpec::syscall_filter says why).
  bool syscall_filter = true;
  // What happens where the machine refuses an isolation asked for above (the network, the
  // read-only filesystem, dropped capabilities, the PID namespace, the own /dev/shm, the syscall
  // filter: no root, a container without
  // CAP_SYS_ADMIN). false: the worker runs without it and kz says so once on stderr. true: no
  // worker runs without it; the evaluation is an error (no verdict), which stops `kz eval-suite`.
  // For RL runs, where one hole is a reward hack the policy will find.
  bool require_isolation = false;
  double gpu_memory_fraction = 0.9;  // torch.cuda.set_per_process_memory_fraction before any candidate code:
                                     // the caching allocator refuses more (an OOM error); 0: no limit
};

struct EvalOptions {
  std::string device = "cpu";    // "cpu" or "cuda:N"
  std::string format = "auto";   // auto | cuda | triton | cuda-rtc | torch
  int trials = 5;                // correctness trials, each on fresh random inputs
  uint64_t seed = 0;             // 0: a fresh secret seed per evaluation; else fixed (reproducible)
  bool use_cpu_sizes = true;     // apply a reference's `cpu_sizes` when the device is the CPU
  // On a GPU, which formats' audit forward runs under the profiler, whose kernel list gives the
  // verdict's custom_kernel_share: "cuda" (its no_custom_kernel check reads that list) or "all"
  // (cuda-rtc and triton too, where their launch counters decide no_custom_kernel and the ATen policy
  // already refuses torch compute: the share is a report, each audit the profiler's start and trace
  // longer).
  std::string kernel_share = "cuda";
  std::map<std::string, long long> size_overrides;  // module constant -> value, applied last
  PolicyOptions policy;
  ToleranceOptions tolerance;
  TimingOptions timing;
  StageTimeouts timeouts;
  WorkerOptions worker;
  CacheOptions cache;
  SandboxOptions sandbox;
  TuningOptions tuning;

  Status validate() const;
};

// Evaluations at once (per device) when [tuning] jobs says 0: every core on the CPU; on a GPU,
// [tuning] gpu_jobs when timings hold the GPU exclusively (gpu_lock.py), else 1.
int default_jobs(const EvalOptions& options);
// Idle fork servers kept beyond those: [tuning] spare_servers on a GPU, none on the CPU.
int spare_servers(const EvalOptions& options);
// Sets WorkerOptions::gpu_memory_processes for `jobs` evaluations at once per device: those and the spare
// fork servers, each of which may hold a CUDA context on the GPU.
void set_gpu_memory_processes(EvalOptions& options, int jobs);

// Overrides fields of `options` with the keys present in the TOML table; unknown keys and
// wrongly typed values are errors naming the key.
// `origin` names the text in error messages (a file path, "--config", ...).
Status apply_toml_text(std::string_view text, std::string_view origin, EvalOptions& options);
Status apply_toml_file(const std::filesystem::path& path, EvalOptions& options);
// The complete configuration as TOML text (what `kz config show` prints).
std::string to_toml(const EvalOptions& options);

}  // namespace kz
