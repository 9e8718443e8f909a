#!/usr/bin/env python3
"""Evaluation throughput: kz against KernelBench's own harness, on the same fixed batch, cold.

    bench/kernelbench_compare.py --kernelbench .kb/KernelBench --out OUTDIR [--kb-limit N]
                                 [--budget-s S] [--device cuda:0] [--dry-run]
    bench/kernelbench_compare.py --report-only OUTDIR/compare.json

Phases, in order of importance (each fits in what is left of --budget-s; the report says what
was cut):
  1. kz   `kz eval-suite` on the whole batch (bench/make_eval_batch.py: 34 candidates, three
          formats, correct and broken), no verdict cache, empty compile caches.
  2. kb   KernelBench's harness on the batch's `cuda` candidates (the first --kb-limit), the way
          its batch script runs them: parallel pre-build, then one fresh process per sample
          (bench/kb_harness.py). Its code comes from the checkout given, never from here.
  3. stability   one kernel evaluated in 5 separate kz evaluations: max/min of its times.
  4. ref         every reference evaluated as its own candidate (--format torch): speedups ~1.
  5. kz rounds   the kz batch again, cold each time (fresh compile caches), up to --kz-rounds in
          all. A cold batch lasts 15-25 s on the GPU host, and the same code on the same host
          took 15.8 s in one run and 21.5 s in the next (its `cuda` pre-builds, nvcc, 37% slower):
          one batch is a sample of the host's load as much as of kz. The report's tables are the
          median batch's (by wall time), and every batch's rates are listed beside it.
Before phase 1 (unless --no-settle) the machine is settled for both harnesses alike: dirty pages
(the build's) written out, and the toolchain's files (torch's headers and libraries, Triton, the
CUDA toolkit, the build's precompiled headers) read once, so that neither side's figures carry the
build's writeback or a first read from disk that the side timed after it would not pay.
Writes OUTDIR/compare.json (everything measured), OUTDIR/report.txt, and each tool's logs.
On `--device cpu` (no GPU) phase 1 runs under the CPU backend, phase 2 checks KernelBench's
loaders and runs its pre-build only, and phases 3-5 are skipped: they time kernels, or the GPU
host's load.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import compare_report  # noqa: E402
import make_eval_batch  # noqa: E402

DEFAULT_EVAL_S = 7.0  # one kz evaluation on the GPU host when nothing was measured yet (bench/README.md)


class Budget:
    """Wall-clock budget of the whole run; None means unlimited."""

    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds if seconds else None

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--kernelbench", type=pathlib.Path, help="a KernelBench checkout (bench/fetch-kernelbench.sh)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/kb-compare"), help="output directory")
    p.add_argument("--kz", type=pathlib.Path, default=ROOT / "build" / "kz", help="the kz binary")
    p.add_argument("--suite", type=pathlib.Path, default=ROOT / "suite" / "kzbench")
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu to verify the pipeline without a GPU")
    p.add_argument("--formats", default=",".join(make_eval_batch.FORMATS),
                   help="the part of the batch to run (default: all; a subset is for quick checks, not for figures)")
    p.add_argument("--kb-limit", type=int, default=None, help="KernelBench evaluates the first N cuda candidates (default: all)")
    p.add_argument("--kb-compile-workers", type=int, default=os.cpu_count(),
                   help="KernelBench's pre-build pool (its num_cpu_workers; default: the cores, as kz's pre-build)")
    p.add_argument("--kb-gpu-arch", default="Hopper", help="KernelBench's gpu_arch setting (Hopper for H100/H200)")
    p.add_argument("--kb-timeout", type=float, default=180.0, help="KernelBench's per-sample timeout (its default)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock budget for all phases (default: none)")
    p.add_argument("--kz-rounds", type=int, default=3,
                   help="cold kz batches in all: the first before KernelBench, the others last, as the budget allows; "
                        "the report uses the median one by wall time and lists them all (default 3)")
    p.add_argument("--stability-task", default="07_softmax")
    p.add_argument("--stability-format", default="cuda-rtc", choices=make_eval_batch.FORMATS)
    p.add_argument("--stability-runs", type=int, default=5)
    p.add_argument("--kz-config", type=pathlib.Path, default=None,
                   help="a TOML passed to kz's batch run as --config (e.g. an A/B of one [tuning] setting)")
    p.add_argument("--no-settle", action="store_true",
                   help="time without first writing out dirty pages and reading the toolchain's files")
    p.add_argument("--skip", default="", help="comma-separated phases to skip: kb, stability, ref")
    p.add_argument("--dry-run", action="store_true", help="write the batch, check KernelBench's loaders, print the plan; time nothing")
    p.add_argument("--report-only", type=pathlib.Path, help="print the report of a saved compare.json and exit")
    p.add_argument("--short", action="store_true", help="with --report-only: only the summary lines")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    if set(args.formats) - set(make_eval_batch.FORMATS):
        p.error(f"--formats: unknown {sorted(set(args.formats) - set(make_eval_batch.FORMATS))}")
    if args.skip - {"kb", "stability", "ref"}:
        p.error(f"--skip: unknown phases {sorted(args.skip - {'kb', 'stability', 'ref'})}")
    if not args.report_only and "kb" not in args.skip and args.kernelbench is None:
        p.error("--kernelbench PATH is required (or --skip kb).\n" + kb_how_to())
    if args.kb_limit is not None and args.kb_limit < 0:
        p.error("--kb-limit must be >= 0")
    if args.kz_rounds < 1:
        p.error("--kz-rounds must be >= 1")
    return args


def kb_how_to() -> str:
    import kb_harness
    return kb_harness.HOW_TO_GET_IT


# ---- running kz ---------------------------------------------------------------------------------

class CpuSampler:
    """The host's CPU while kz runs, from /proc/stat's first line every `interval_s`: per interval the
    share of all cores' time that was busy (user, nice, system, irq, softirq) and stolen by the
    hypervisor for other guests (steal), so a report can say whether a batch was bound by the cores
    and whether it shared them with another machine's load. Nothing where /proc/stat is missing."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s, self.samples = interval_s, []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()

    @staticmethod
    def read():
        """(busy, steal, total) jiffies of all cores so far; None where /proc/stat cannot be read."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
        return user + nice + system + irq + softirq, steal, user + nice + system + idle + iowait + irq + softirq + steal

    def _run(self):
        last = self.read()
        while last is not None and not self.stopped.wait(self.interval_s):
            now = self.read()
            if now is None:
                return
            total = now[2] - last[2]
            if total > 0:
                self.samples.append([round(time.monotonic() - self.started, 2), round((now[0] - last[0]) / total, 3),
                                     round((now[1] - last[1]) / total, 3)])
            last = now

    def result(self) -> dict:
        return {"cores": os.cpu_count(), "interval_s": self.interval_s, "samples": self.samples}


def run_kz(args, name: str, candidates: pathlib.Path, flags: list, cache_home: pathlib.Path, timeout: float) -> dict:
    """One `kz eval-suite` run; its verdicts (as far as it got), wall time and exit code. Logs in OUT."""
    out = args.out / f"{name}.jsonl"
    command = [str(args.kz), "eval-suite", "--suite", str(args.suite), "--candidates", str(candidates),
               "--device", args.device, "--no-cache", "--out", str(out), *flags]
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))  # empty torch-extension and Triton caches
    started = time.monotonic()
    with open(args.out / f"{name}.txt", "w") as stdout, open(args.out / f"{name}.err", "w") as stderr, \
            CpuSampler() as cpu:
        try:
            limit = None if timeout == float("inf") else max(timeout, 1.0)
            rc = subprocess.run(command, stdout=stdout, stderr=stderr, env=env, timeout=limit).returncode
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
    wall_s = time.monotonic() - started
    verdicts = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    summary = out.with_suffix(".summary.json")
    phases = json.loads(summary.read_text()).get("phases_s") if summary.exists() else None
    return {"command": shown(" ".join(command), args), "wall_s": wall_s, "rc": rc, "timed_out": timed_out,
            "verdicts": verdicts, "phases_s": phases, "host_cpu": cpu.result()}


def shown(text: str, args) -> str:
    """`text` without this machine's paths (results may be copied into bench/results/)."""
    return text.replace(str(args.out.resolve()), "OUT").replace(str(args.out), "OUT").replace(str(ROOT) + "/", "")


def trim(verdict: dict) -> dict:
    """The fields the report uses, in one flat record (compare.json's shape): the verdict's own and
    its profile's; `id` is <task>/<file stem>, as in the batch's manifest."""
    path = pathlib.PurePath(verdict.get("candidate", ""))
    keep = ("task_id", "format", "status", "checks", "speedup", "runtime_ms", "ref_runtime_ms", "device", "stage",
            "cached", "custom_kernel_share", "unchecked")
    keep_profile = ("wall_s", "stage_s", "gpu_wait_s", "gpu_exclusive_s", "gpu_wait_by_stage_s", "startup_s",
                    "load_reference_s", "compile_s", "correctness_s", "timing_s", "timing_after_hold_s", "prebuild_s",
                    "started_s", "prebuild_started_s", "build_s", "cpu_s", "prebuild_cpu_s", "launch_spin")
    profile = verdict.get("profile") or {}
    trimmed = {k: verdict.get(k) for k in keep}
    trimmed.update({k: profile.get(k) for k in keep_profile})
    trimmed.update(id=f"{path.parent.name}/{path.stem}", task=verdict.get("task_id"))
    return trimmed


def typical_eval_s(data: dict) -> float:
    """A full kz evaluation's wall time on this machine: the median of the batch's `ok` ones."""
    walls = [v["wall_s"] for v in (data.get("kz_batch") or {}).get("verdicts", [])
             if v["status"] == "ok" and v.get("wall_s")]
    return statistics.median(walls) if walls else DEFAULT_EVAL_S


def phase_estimate_s(data: dict, evaluations: int) -> float:
    """Wall seconds one `kz eval-suite` of `evaluations` full evaluations should take: kz runs
    several at once, so the batch's rate (its wall time per candidate) times the count, but never
    less than one evaluation's own wall time, plus kz's start."""
    batch = data.get("kz_batch") or {}
    count = len(batch.get("verdicts") or [])
    per_candidate = batch["wall_s"] / count if count and batch.get("wall_s") else typical_eval_s(data)
    return max(typical_eval_s(data), evaluations * per_candidate) + 10.0


# ---- phases -------------------------------------------------------------------------------------

def phase_kz_batch(args, data, budget, cache_home, kz_runs: list, number: int = 1):
    """One cold kz batch (round `number`, each with a cache home of its own), added to kz_runs;
    data["kz_batch"] is then the median complete round by wall time (median_round)."""
    flags = ["--config", str(args.kz_config)] if args.kz_config else []
    name = "kz-batch" if number == 1 else f"kz-batch-{number}"
    run = run_kz(args, name, args.out / "batch" / "candidates", flags, cache_home, budget.left())
    run["verdicts"] = [trim(v) for v in run["verdicts"]]
    run["round"] = number
    run["complete"] = not run["timed_out"] and len(run["verdicts"]) == len(data["manifest"])
    kz_runs.append(run)
    data["kz_batch"] = median_round(kz_runs)
    data["kz_rounds"] = kz_runs  # every round, for the report's list (the median one is kz_batch too)
    phase = "kz" if number == 1 else f"kz-{number}"
    if run["timed_out"]:
        note(data, phase, f"stopped at the time budget after {len(run['verdicts'])} of {len(data['manifest'])} candidates")
    elif run["rc"] not in (0, None):
        note(data, phase, f"kz eval-suite exited {run['rc']}; see {name}.err")


def median_round(kz_runs: list) -> dict:
    """The complete round with the median wall time (of an even count the slower of the middle two:
    the figure never flatters kz); the first round where none is complete."""
    complete = sorted((r for r in kz_runs if r.get("complete")), key=lambda r: r["wall_s"])
    return complete[len(complete) // 2] if complete else kz_runs[0]


def phase_kz_rounds(args, data, budget, work: pathlib.Path, kz_runs: list):
    """Rounds 2..--kz-rounds of the cold kz batch, while the budget has room for one more."""
    for number in range(2, args.kz_rounds + 1):
        needed = phase_estimate_s(data, len(data["manifest"]))
        if budget.left() < needed:
            note(data, "kz rounds", f"{number - 1} of {args.kz_rounds} cold batches: {budget.left():.0f} s left, "
                                    f"{needed:.0f} s needed for another")
            return
        phase_kz_batch(args, data, budget, work / f"cache-kz-{number}", kz_runs, number)


def kb_samples(args, data) -> list:
    cuda = [row for row in data["manifest"] if row["format"] == "cuda"]
    limit = len(cuda) if args.kb_limit is None else args.kb_limit
    batch = args.out / "batch"
    return [dict(row, source=(batch / row["path"]).read_text(), ref_source=(ROOT / row["reference"]).read_text())
            for row in cuda[:limit]]


def kb_setup(args, data, stub_root: pathlib.Path):
    """KernelBench importable here and in spawned processes, its loaders checked (in a child
    process, so this one never initialises CUDA while kz is timing)."""
    import kb_harness
    setup = kb_harness.prepare(args.kernelbench, stub_root)
    setup.update(correct_trials=5, perf_trials=100, source=shown(setup["source"], args))
    data["kb"] = {"setup": setup}
    references = {p.stem: p.read_text() for p in sorted(args.suite.rglob("*.py"))}
    samples = kb_samples(args, data)
    checks = [{"id": s["id"], "task": s["task"], "source": s["source"], "expected": s["expected"]} for s in samples]
    data["kb"]["loader_problems"] = in_child(kb_harness.check_loaders, references, checks, args.device == "cpu")
    return samples


def in_child(function, *call_args):
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, call_args)


def phase_kb(args, data, budget, stub_root):
    import kb_harness
    samples = kb_setup(args, data, stub_root)
    kb = data["kb"]
    kb["samples"] = [s["id"] for s in samples]
    if not samples:
        kb["note"] = "no cuda candidates selected (--kb-limit 0)"
        return
    builds = kb_harness.build_root()
    for s in samples:
        s["build_dir"] = str(builds / s["id"].replace("/", "__"))
    deadline = time.monotonic() + max(0.0, budget.left() - stability_reserve(args, data, len(samples), budget))
    # The pre-build may use all but the time of one evaluation: cut short, it leaves nothing to evaluate.
    with CpuSampler() as cpu:
        kb["prebuild"] = kb_harness.prebuild(samples, args.kb_compile_workers, args.kb_gpu_arch,
                                             args.out / "kb-prebuild.log", deadline - 15)
    kb["prebuild"]["host_cpu"] = cpu.result()
    save(args, data)
    if args.device == "cpu":
        built = sum(bool(r.get("built")) for r in kb["prebuild"]["samples"].values())
        kb["note"] = (f"pre-build only ({built} of {len(samples)} built): eval_kernel_against_ref needs a GPU "
                      "(it asserts torch.cuda.is_available())")
    else:
        settings = {"correct_trials": 5, "perf_trials": 100, "timeout_s": args.kb_timeout, "min_eval_s": 15.0}
        kb["eval"] = kb_harness.evaluate_all(samples, settings, args.kb_gpu_arch, args.out / "kb-eval.log", deadline)
        if kb["eval"]["skipped"]:
            kb["note"] = f"time budget: {len(kb['eval']['skipped'])} pre-built samples not evaluated"
    shutil.rmtree(builds, ignore_errors=True)


def stability_reserve(args, data, samples: int, budget) -> float:
    """Seconds kept from KernelBench for the stability phase, when both seem to fit; KernelBench
    goes first otherwise (a rough need: its pre-build ~90 s, then ~10 s per sample)."""
    if args.device == "cpu" or "stability" in args.skip:
        return 0.0
    reserve = phase_estimate_s(data, args.stability_runs) * 1.3
    return reserve if budget.left() >= 90 + 10 * samples + reserve else 0.0


def phase_stability(args, data, budget, cache_home):
    st = data["stability"] = {"task": args.stability_task, "format": args.stability_format}
    needed = phase_estimate_s(data, args.stability_runs) * 1.3
    if budget.left() < needed:
        st["note"] = f"skipped: {budget.left():.0f} s left, {needed:.0f} s needed"
        return
    source = (ROOT / "suite" / "examples" / args.stability_format / f"{args.stability_task}.py").read_text()
    folder = args.out / "stability" / "candidates" / args.stability_task
    folder.mkdir(parents=True, exist_ok=True)
    for run in range(1, args.stability_runs + 1):
        (folder / f"run{run}.py").write_text(source)  # identical sources, separate evaluations
    result = run_kz(args, "kz-stability", folder.parent, [], cache_home, budget.left())
    st["verdicts"] = [trim(v) for v in result["verdicts"]]


def phase_ref(args, data, budget, cache_home):
    ref = data["ref_as_candidate"] = {}
    tasks = sorted(args.suite.rglob("*.py"), key=lambda p: p.stem)
    fits = len(tasks)
    while budget.deadline and fits and phase_estimate_s(data, fits) * 1.15 > budget.left():
        fits -= 1
    ref["skipped"] = [p.stem for p in tasks[fits:]]
    if not fits:
        ref["note"] = f"skipped: {budget.left():.0f} s left, {phase_estimate_s(data, 1):.0f} s needed for one task"
        return
    folder = args.out / "refs"
    folder.mkdir(parents=True, exist_ok=True)
    for path in tasks[:fits]:
        shutil.copy(path, folder / path.name)
    # One correctness trial: a reference is trivially its own match; the timing protocol is unchanged.
    result = run_kz(args, "kz-ref-as-candidate", folder, ["--format", "torch", "--trials", "1"], cache_home, budget.left())
    ref["verdicts"] = [trim(v) for v in result["verdicts"]]


# ---- bookkeeping --------------------------------------------------------------------------------

def note(data, phase, text):
    data.setdefault("phases", {}).setdefault(phase, {})["note"] = text


def save(args, data):
    (args.out / "compare.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    (args.out / "report.txt").write_text(compare_report.render(data))


def gpu_query(device: str, field: str):
    """One nvidia-smi field (name, uuid) of the device's GPU; None where nvidia-smi cannot say."""
    try:
        values = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=20).stdout.split("\n")
        return values[int(device.split(":")[1]) if ":" in device else 0].strip() or None
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def gpu_name(device: str) -> str:
    return "cpu" if device == "cpu" else gpu_query(device, "name") or "GPU"


def kz_commit():
    """The commit kz was built from: $KZ_COMMIT where set (a copy of the tree on a GPU host may carry a
    .git older than the tree, which would name the wrong commit), else git's HEAD,
    "-dirty" where tracked files differ from it; None where neither says."""
    if os.environ.get("KZ_COMMIT"):
        return os.environ["KZ_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=20)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"], timeout=20).returncode != 0
            return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def settings(args) -> dict:
    return {"device": args.device, "gpu": gpu_name(args.device), "kz_commit": kz_commit(),
            "host": None if args.device == "cpu" else gpu_query(args.device, "uuid"),  # which host ran it
            "budget_s": args.budget_s, "kb_limit": args.kb_limit,
            "kb_workers": args.kb_compile_workers, "kb_gpu_arch": args.kb_gpu_arch, "kz": shown(str(args.kz), args),
            "stability_task": args.stability_task, "stability_format": args.stability_format,
            "shared_bytecode": getattr(args, "shared_bytecode", False),
            "kernelbench": shown(str(args.kernelbench), args) if args.kernelbench else None}


def timed_phase(args, data, name, function, *call_args):
    """Runs one phase; a phase that fails is noted in the report and the next one still runs, so
    one broken side (a KernelBench that does not import) cannot lose the other's figures."""
    started = time.monotonic()
    print(f"[compare] {name} ...", flush=True)
    try:
        function(args, data, *call_args)
    except Exception as exc:  # noqa: BLE001 - reported, with its traceback on stderr
        traceback.print_exc()
        note(data, name, f"FAILED: {type(exc).__name__}: {str(exc)[:300]} (traceback on stderr)")
    data.setdefault("phases", {}).setdefault(name, {})["wall_s"] = time.monotonic() - started
    save(args, data)
    print(f"[compare] {name}: {time.monotonic() - started:.0f} s", flush=True)


def plan(args, data) -> str:
    cuda = sum(row["format"] == "cuda" for row in data["manifest"])
    kb = "skipped" if "kb" in args.skip else (
        f"its first {cuda if args.kb_limit is None else min(args.kb_limit, cuda)} of {cuda} cuda candidates "
        f"(--kb-limit), pre-build with {args.kb_compile_workers} workers")
    budget = "no time budget" if args.budget_s is None else f"budget {args.budget_s:.0f} s"
    return (f"[compare] {budget}; kz: {len(data['manifest'])} candidates on {args.device}; KernelBench: {kb}; "
            f"then stability ({args.stability_runs} runs), reference-as-candidate and {args.kz_rounds - 1} more "
            f"cold kz batches, as time allows")


def dry_run(args, data, stub_root):
    print(plan(args, data))
    print(compare_report.header_section(data))
    print(make_eval_batch.describe(data["manifest"]))
    print("kz:", " ".join([str(args.kz), "eval-suite", "--suite", str(args.suite), "--candidates",
                           str(args.out / "batch" / "candidates"), "--device", args.device, "--no-cache"]),
          "(XDG_CACHE_HOME: a fresh folder)", "" if args.kz.exists() else "  <- kz binary missing: build first")
    if "kb" not in args.skip:
        samples = kb_setup(args, data, stub_root)
        setup = data["kb"]["setup"]
        print(f"KernelBench: {setup['source']} ({setup['commit']}); stand-ins: {', '.join(setup['stubbed']) or 'none'}")
        print(f"KernelBench: {len(samples)} cuda candidates: pre-build with {args.kb_compile_workers} workers, "
              f"TORCH_CUDA_ARCH_LIST={args.kb_gpu_arch}, then one process each (timeout {args.kb_timeout:g} s)")
        for problem in data["kb"]["loader_problems"]:
            print("  KernelBench loader:", problem)
        print("KernelBench loaders:", "compatible" if not data["kb"]["loader_problems"] else "PROBLEMS above")
    print(f"stability: {args.stability_task} ({args.stability_format}) x{args.stability_runs}; "
          f"ref: {len(list(args.suite.rglob('*.py')))} references with --format torch")


SETTLE_LIMIT_S = 60.0  # reading stops here; the report says how much was read


def toolchain_dirs(args) -> list:
    """What both harnesses read while compiling and importing: torch's package (headers, libraries),
    Triton's, NVIDIA's pip libraries, the CUDA toolkit's compilers and headers, kz's build dir (its
    precompiled headers and bytecode; KernelBench reads the bytecode too, share_worker_bytecode).
    Found without importing anything."""
    import importlib.util
    dirs = []
    for package in ("torch", "triton", "nvidia"):
        spec = importlib.util.find_spec(package)
        if spec and spec.submodule_search_locations:
            dirs += [pathlib.Path(p) for p in spec.submodule_search_locations]
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    cuda = pathlib.Path(nvcc).resolve().parent.parent
    dirs += [cuda / sub for sub in ("bin", "nvvm", "include")]  # lib64's math libraries: torch brings its own
    dirs += [args.kz.resolve().parent / sub for sub in ("lighter-builds", "pycache")]
    return [d for d in dirs if d.is_dir()]


def settle(args, data) -> None:
    """sync(2), then every file under toolchain_dirs read once (up to SETTLE_LIMIT_S)."""
    started = time.monotonic()
    os.sync()
    synced = time.monotonic() - started
    read = files = 0
    complete = True
    for root in toolchain_dirs(args):
        for path in root.rglob("*"):
            if time.monotonic() - started > SETTLE_LIMIT_S:
                complete = False
                break
            try:
                if path.is_file() and not path.is_symlink():
                    with open(path, "rb", buffering=0) as f:
                        while chunk := f.read(1 << 20):
                            read += len(chunk)
                    files += 1
            except OSError:
                continue
        if not complete:
            break
    data["settle"] = {"sync_s": synced, "read_bytes": read, "files": files, "complete": complete,
                      "seconds": time.monotonic() - started, "dirs": [shown(str(d), args) for d in toolchain_dirs(args)]}
    print(f"[compare] settled: sync {synced:.1f} s, read {read / 2**30:.1f} GiB in {files} files "
          f"({'all' if complete else 'stopped at the limit'}), {data['settle']['seconds']:.0f} s", flush=True)


def share_worker_bytecode(args) -> bool:
    """Where scripts/setup.sh compiled bytecode for an interpreter whose packages carry none (the GPU
    host's torch: every import of torch and torch._dynamo compiles ~6.5 s of sources), kz's workers
    import from it (worker_client.cpp); KernelBench's processes, spawned with this environment, get
    it too, so neither side pays what the other does not."""
    prefix = args.kz.resolve().parent / "pycache"
    if not (prefix / ".kz-complete").exists():
        return False
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = str(prefix)
    return True


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        data = json.loads(args.report_only.read_text())
        print((compare_report.short_report if args.short else compare_report.render)(data), end="")
        return 0
    args.shared_bytecode = share_worker_bytecode(args)
    budget = Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    if (args.out / "batch").exists():
        shutil.rmtree(args.out / "batch")  # a stale candidate would join the batch
    manifest = make_eval_batch.write_batch(args.out / "batch", args.formats)
    data = {"settings": settings(args), "manifest": manifest, "phases": {}}
    work = pathlib.Path(tempfile.mkdtemp(prefix="kb-compare-"))  # compile caches: big, not part of the results
    try:
        if args.dry_run:
            dry_run(args, data, work / "stubs")
            return 0
        cache_home = work / "cache"
        save(args, data)  # a run killed in its first phase still leaves a compare.json to report on
        print(plan(args, data), flush=True)
        if not args.no_settle:
            settle(args, data)
        kz_runs = []
        timed_phase(args, data, "kz", phase_kz_batch, budget, cache_home, kz_runs)
        if "kb" not in args.skip:
            timed_phase(args, data, "kb", phase_kb, budget, work / "stubs")
        if args.device != "cpu" and "stability" not in args.skip:
            timed_phase(args, data, "stability", phase_stability, budget, cache_home)
        if args.device != "cpu" and "ref" not in args.skip:
            timed_phase(args, data, "ref", phase_ref, budget, cache_home)
        if args.device != "cpu" and args.kz_rounds > 1:
            timed_phase(args, data, "kz rounds", phase_kz_rounds, budget, work, kz_runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(compare_report.render(data), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
