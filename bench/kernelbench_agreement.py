#!/usr/bin/env python3
"""Verdict agreement: kz under `--policy kernelbench` and KernelBench's tolerances against
KernelBench's own harness, on the same public kernels, side by side.

    bench/kernelbench_agreement.py --samples .kb-samples --kernelbench .kb/KernelBench --out OUTDIR
        [--limit 110] [--budget-s S] [--device cuda:0 | cuda:0,cuda:1 | cuda:all | cpu] [--state DIR]
    bench/kernelbench_agreement.py --report-only OUTDIR/agreement.json

The kernels: the first --limit samples of .kb-samples/manifest.jsonl (bench/fetch-kb-samples.sh:
KernelBench generations of levels 1 and 2 made and judged by KernelBench's own scripts elsewhere).
Each is judged twice, correctness only (no timing), --chunk samples at a time (both sides finish a
chunk's builds before the next chunk's start, and KernelBench evaluates a chunk while the next one
builds, so that a call cut by its budget leaves comparisons, not halves):
  kb   KernelBench's harness (bench/kb_harness.py, its code from the checkout given): its parallel
       pre-build on half the cores (a failed pre-build is its verdict, compile_error: its evaluation
       would build the sample again and fail alike), then eval_kernel_against_ref per sample in a fresh spawned process
       (5 correctness trials, fp32, measure_performance off: timing never changes its verdict), a
       few at once per GPU (--kb-eval-jobs; its own script runs one per GPU: correctness does not
       care), beside the next chunk's builds and kz's evaluations of it, each with a timeout; a
       sample that ran out of GPU memory, or hit its "lock file, retry" answer, is evaluated again
       alone at the end.
  kz   `kz eval-suite --no-timing --no-cache --policy kernelbench` with `[tolerance] rule =
       "kernelbench"` (fresh compile caches), beside KernelBench's pre-build of the chunk and its
       evaluations of the one before; then, as time allows,
       the samples it answered about the card's memory rather than about them (memory held outside
       its evaluations, or an out-of-memory: no verdict yet) once more with the GPU to itself, after
       KernelBench's evaluations ("kz again"; that answer stands), and the same batch under
       `--policy strict` (its builds kept from the first run).
The GPU's used memory every 5 s, after the phase noted last, goes to OUTDIR/gpu-memory.log.
A verdict is "correct" for KernelBench when it compiled and passed every trial, for kz when its
status is `ok`. The agreement rate is over the samples both sides judged. Writes
OUTDIR/agreement.json (everything) and OUTDIR/agreement.txt (the table, every disagreement with
both sides' messages, and what the time budget cut).

--budget-s bounds the whole run: kz's run gets it all, KernelBench's pre-build stops when the time
left is what evaluating the samples built so far takes (samples it did not build are cut from both
sides' comparison and listed), its evaluations stop when the budget does, and the strict run
happens only where it fits.

--state DIR makes the run resumable: DIR keeps, one JSON file per sample and piece as soon as it
exists, KernelBench's pre-build results (built, or the compile error: not retried) and its build
folders, its evaluation outcomes, and kz's verdicts under both policies. A later call with the same
DIR does only what is missing: first it evaluates the samples already built, then kz judges and
KernelBench pre-builds and evaluates the rest, as the budget allows. The tables cover every sample
of the selection judged so far, and a note says how much came from earlier calls. An unreadable
file in DIR is ignored (its work is done again) and named in a note.

On --device cpu (no GPU) it checks what it can: the manifest, the kz suite it writes, KernelBench's
loaders on every reference, every sample through Python's parser, kz on the first --dry-limit
samples it has not judged under the CPU backend, and where there is nvcc KernelBench's pre-build
of as many (KernelBench cannot evaluate without CUDA); with --state, each call takes the next ones.
"""
import argparse
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import kb_harness  # noqa: E402

KZ_CONFIG = """# kz as KernelBench judges: any PyTorch op in forward, KernelBench's fp32/half tolerances.
[policy]
mode = "kernelbench"

[tolerance]
rule = "kernelbench"
"""
KB_EVAL_S = 9.4      # one KernelBench evaluation of a pre-built sample, process start included, with 4 at
                     # once on the GPU (H100, measured: 9.4 s, i.e. ~2.4 s a sample)
KZ_STRICT_S = 0.6    # one kz evaluation whose build is kept, per sample and GPU, at kz's concurrency (8)
MARGIN_S = 20.0      # kept at the end for the tables
RETRY_MARKERS = ("out of memory", "lock file")
# kz's answers about the card's memory rather than the sample: judged again with the GPU to kz alone
# (after KernelBench's evaluations, or by the next call), and only that answer stands (machine_answer).
KZ_MACHINE_CHECKS = {"gpu_memory_held_elsewhere", "out_of_memory_shared", "build_killed"}
KILLED_BUILD = ("returned non-zero exit status 137", "died due to signal 9", "Killed signal terminated program")
SOURCE_ERROR = (": error", "this compile failed")  # a killed step beside one of these: kz-nvcc ended it
KZ_RUNS = {"kz-kernelbench": "kernelbench", "kz-strict": "strict"}  # kz's runs: their names and policies
LIVE = set()         # process groups started here (kz runs, KernelBench evaluations): ended on SIGTERM
STOPPING = threading.Event()  # set on SIGTERM: evaluations in other threads stop and record nothing more
DATA_LOCK = threading.RLock()  # the run's record (`data`): KernelBench's evaluations write it from a thread


def end_on_sigterm(signum, frame):
    """A `timeout` around the run: end what it started (in their own groups, out of the signal's
    reach), then exit through main's finally, which writes the tables. An evaluation ended this way
    is no verdict: STOPPING tells the threads that wait on them."""
    STOPPING.set()
    for pid in list(LIVE):
        stop_group(pid, grace_s=0)
    raise SystemExit(128 + signum)


class Budget:
    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds if seconds else float("inf")

    def left(self) -> float:
        return self.deadline - time.monotonic()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--samples", type=pathlib.Path, default=ROOT / ".kb-samples",
                   help="folder with manifest.jsonl (bench/fetch-kb-samples.sh)")
    p.add_argument("--kernelbench", type=pathlib.Path, default=ROOT / ".kb" / "KernelBench",
                   help="a KernelBench checkout (bench/fetch-kernelbench.sh)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/kb-agreement"))
    p.add_argument("--kz", type=pathlib.Path, default=ROOT / "build" / "kz")
    p.add_argument("--device", default="cuda:0", help="cuda:N, cuda:0,cuda:1, cuda:all, or cpu (a dry run)")
    p.add_argument("--limit", type=int, default=110, help="the first N samples of the manifest (default 110)")
    p.add_argument("--skip", type=int, default=0,
                   help="start after the manifest's first N samples (a second call's share; default 0)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of the whole run")
    p.add_argument("--kb-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="KernelBench's pre-build pool (default: half the cores; kz's builds run beside)")
    p.add_argument("--kb-eval-jobs", type=int, default=4, help="KernelBench evaluations at once per GPU (default 4)")
    p.add_argument("--kb-timeout", type=float, default=180.0, help="KernelBench's per-sample timeout (its default)")
    p.add_argument("--kb-gpu-arch", default="Hopper", help="KernelBench's gpu_arch (Hopper: H100/H200)")
    p.add_argument("--chunk", type=int, default=24,
                   help="samples judged by both sides before the next are started (default 24)")
    p.add_argument("--no-strict", action="store_true", help="skip kz's second run under --policy strict")
    p.add_argument("--dry-limit", type=int, default=3, help="--device cpu: samples run through kz (default 3)")
    p.add_argument("--state", type=pathlib.Path,
                   help="a folder keeping what is done, so that a later call goes on where this one stopped")
    p.add_argument("--report-only", type=pathlib.Path, nargs="+",
                   help="print the table of saved agreement.json files (several: their rows as one run) and exit")
    args = p.parse_args(argv)
    if args.limit < 1 or args.chunk < 1:
        p.error("--limit and --chunk must be >= 1")
    return args


# ---- the samples and kz's view of them -------------------------------------------------------------

def task_id(sample: dict) -> str:
    """kz's task id (a file stem) for a sample's problem: level-1 and level-2 names overlap."""
    return f"l{sample['level']}_{sample['problem']}"


def load_samples(folder: pathlib.Path, limit: int, skip: int = 0) -> list:
    manifest = folder / "manifest.jsonl"
    if not manifest.is_file():
        raise SystemExit(f"no {manifest}: run bench/fetch-kb-samples.sh (after bench/fetch-kernelbench.sh)")
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    return rows[skip:skip + limit]


def merged(files: list) -> dict:
    """Saved runs over disjoint shares of the manifest (--skip) as one: rows and samples joined."""
    runs = [json.loads(f.read_text()) for f in files]
    data = dict(runs[0])
    if len(runs) > 1:
        data["rows"] = [r for run in runs for r in run.get("rows") or []]
        data["samples"] = [s for run in runs for s in run.get("samples") or []]
        data["summary"] = summarize(data["rows"])
        data["limit"] = sum(run.get("limit") or 0 for run in runs)
        data["wall_s"] = sum(run.get("wall_s") or 0 for run in runs)
    return data


def write_kz_suite(samples: list, kernelbench: pathlib.Path, out: pathlib.Path) -> None:
    """OUT/suite/<task>.py (KernelBench's references, unchanged) and OUT/kernelbench.toml."""
    shutil.rmtree(out / "suite", ignore_errors=True)
    (out / "suite").mkdir(parents=True)
    for s in samples:
        ref = out / "suite" / f"{task_id(s)}.py"
        if not ref.exists():
            shutil.copyfile(kernelbench / s["reference"], ref)
    (out / "kernelbench.toml").write_text(KZ_CONFIG)


def write_candidates(samples: list, samples_dir: pathlib.Path, dest: pathlib.Path, paths: dict) -> None:
    """DEST/<task>/<id>.py for each sample; paths gets {candidate path: sample id}."""
    shutil.rmtree(dest, ignore_errors=True)
    for s in samples:
        path = dest / task_id(s) / f"{s['id']}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(samples_dir / s["kernel"], path)
        paths[str(path)] = s["id"]


def run_kz(kz: pathlib.Path, kz_dir: pathlib.Path, name: str, device: str, policy: str, cache_home: pathlib.Path,
           out: pathlib.Path, candidates: pathlib.Path = None) -> subprocess.Popen:
    """Starts one `kz eval-suite` (correctness only); its verdicts go to OUT/<name>.jsonl."""
    command = [str(kz), "eval-suite", "--suite", str(kz_dir / "suite"),
               "--candidates", str(candidates or kz_dir / "candidates"), "--device", device,
               "--config", str(kz_dir / "kernelbench.toml"), "--policy", policy,
               "--no-timing", "--no-cache", "--quiet", "--out", str(out / f"{name}.jsonl")]
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
    (out / f"{name}.command").write_text(" ".join(command) + "\n")
    process = subprocess.Popen(command, stdout=open(out / f"{name}.txt", "w"), stderr=open(out / f"{name}.err", "w"),
                               env=env, start_new_session=True)
    LIVE.add(process.pid)
    return process


def wait_kz(process: subprocess.Popen, timeout: float) -> dict:
    """Waits for a kz run up to `timeout` s (its whole process group ended past it)."""
    started = time.monotonic()
    try:
        rc = process.wait(timeout=max(1.0, timeout) if timeout != float("inf") else None)
        result = {"rc": rc, "timed_out": False, "waited_s": time.monotonic() - started}
    except subprocess.TimeoutExpired:
        stop_group(process.pid)
        process.wait()
        result = {"rc": None, "timed_out": True, "waited_s": time.monotonic() - started}
    LIVE.discard(process.pid)
    return result


def stop_group(pid: int, grace_s: float = 2.0) -> None:
    """Ends a process group: SIGTERM, then SIGKILL after grace_s (0: SIGKILL at once)."""
    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace_s else (signal.SIGKILL,)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(grace_s)


def machine_answer(verdict: dict) -> bool:
    """A kz answer about the machine (KZ_MACHINE_CHECKS, an out-of-memory taken for the task's or the
    candidate's, or a build killed by SIGKILL that a kz before build_killed called compile_error) not
    yet given with the GPU to kz alone."""
    checks, message = set(verdict.get("checks") or []), verdict.get("message") or ""
    ran_out = "out of memory" in message.lower() and checks & {"memory_limit", "exceeds_gpu_memory"}
    killed = ("kernel_compile" in checks and any(text in message for text in KILLED_BUILD)
              and not any(text in message for text in SOURCE_ERROR))
    return bool(checks & KZ_MACHINE_CHECKS or ran_out or killed) and not verdict.get("judged_alone")


def kz_answers(path: pathlib.Path, paths: dict):
    """(sample id, the whole answer) for each line of a kz run's results.jsonl that names a sample."""
    if not path.exists():
        return
    by_stem = {pathlib.PurePath(p).stem: i for p, i in paths.items()}
    for line in path.read_text().splitlines():
        try:
            v = json.loads(line)
        except ValueError:  # an empty line, or the one kz is writing now
            continue
        sample = paths.get(v.get("candidate")) or by_stem.get(pathlib.PurePath(v.get("candidate", "")).stem)
        if sample:
            yield sample, v


def read_kz(path: pathlib.Path, paths: dict, judged_alone: bool = False) -> dict:
    """{sample id: verdict fields} from a results.jsonl; machine answers (machine_answer) are left out
    unless the run had the GPU to itself (judged_alone: they stand, marked so)."""
    verdicts = {}
    for sample, v in kz_answers(path, paths):
        if judged_alone or not machine_answer(v):
            verdicts[sample] = {k: v.get(k) for k in ("status", "checks", "message", "stage", "policy",
                                                      "trials_passed", "unchecked")}
            verdicts[sample]["wall_s"] = (v.get("profile") or {}).get("wall_s")
            if judged_alone:
                verdicts[sample]["judged_alone"] = True
    return verdicts


def kz_results(out: pathlib.Path, name: str) -> list:
    """This call's results.jsonl files of kz's run `name`, one per chunk (NAME.jsonl, NAME-cN.jsonl)."""
    return sorted(out.glob(f"{name}.jsonl")) + sorted(out.glob(f"{name}-c*.jsonl"))


def kz_attempted(out: pathlib.Path, paths: dict) -> set:
    """The samples of this call's kz runs that got an answer of any kind, machine answers included."""
    return {sample for path in kz_results(out, "kz-kernelbench") for sample, _ in kz_answers(path, paths)}


class GpuMemoryLog(threading.Thread):
    """The GPU's used memory every few seconds (nvidia-smi), after the phase noted last, with the
    processes holding the most of it (pid, MiB, command line), into a log (appended to by each call,
    under a header with the time): which side held the card when an evaluation ran short of memory."""

    def __init__(self, path: pathlib.Path, data: dict, every_s: float = 5.0):
        super().__init__(daemon=True)
        self.path, self.data, self.every_s = path, data, every_s
        self.stopped = threading.Event()

    def run(self):
        started = time.monotonic()
        with open(self.path, "a") as log:
            log.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')}: GPU memory every {self.every_s:.0f} s ==\n")
            while not self.stopped.wait(self.every_s):
                used = nvidia_smi("--query-gpu=index,memory.used,memory.total")
                holders = gpu_memory_holders(nvidia_smi("--query-compute-apps=pid,used_memory"))
                phase = (self.data.get("note_order") or ["start"])[-1]
                log.write(f"{time.monotonic() - started:7.1f} s  after {phase}: {' | '.join(used.split(chr(10))).strip(' |')}"
                          + (f"\n           held by: {holders}" if holders else "") + "\n")
                log.flush()

    def stop(self):
        self.stopped.set()
        self.join(15)


def nvidia_smi(query: str) -> str:
    """nvidia-smi's CSV answer to one query (no header, units in the values), or what went wrong."""
    try:
        done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"
    return done.stdout.strip() if done.returncode == 0 else f"nvidia-smi exit {done.returncode}: {done.stderr.strip()}"


def gpu_memory_holders(apps: str, most: int = 8) -> str:
    """The `most` processes holding the most GPU memory, from nvidia-smi's "pid, used_memory" lines,
    each with its command line where this host's /proc shows it ("?" where not: another container's
    process, or one gone)."""
    rows = []
    for line in apps.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        mib = int(parts[1].split()[0]) if parts[1].split() and parts[1].split()[0].isdigit() else 0
        try:
            command = pathlib.Path(f"/proc/{parts[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            command = "?"
        rows.append((mib, parts[0], command.strip()[:80] or "?"))
    rows.sort(reverse=True)
    shown = [f"{pid} {mib} MiB {command}" for mib, pid, command in rows[:most]]
    if len(rows) > most:
        shown.append(f"{len(rows) - most} more, {sum(r[0] for r in rows[most:])} MiB")
    return "; ".join(shown)


# ---- KernelBench's side --------------------------------------------------------------------------------

def _kb_child(result_path: str, log_path: str, gpu_arch: str, ref_src: str, src: str, build_dir: str, settings: dict):
    """One KernelBench evaluation in its own spawned process (and process group, so that a timeout
    ends its nvcc too); its summary goes to result_path as JSON."""
    os.setsid()
    kb_harness._child_init(log_path, gpu_arch)
    outcome = kb_harness.evaluate_one(ref_src, src, build_dir, settings)
    pathlib.Path(result_path).write_text(json.dumps(outcome, default=str))


def kb_evaluate(samples: list, devices: list, jobs: int, settings: dict, log: pathlib.Path, deadline: float,
                work: pathlib.Path, on_outcome=None) -> dict:
    """Samples evaluated `jobs` at a time on each device, each in a fresh process with a timeout,
    until the deadline; on_outcome(id, outcome) gets each outcome as it comes (an interrupted run
    keeps them). Returns {id: outcome} and the ids left out (not started, or stopped by the deadline
    rather than by their own timeout: no verdict of KernelBench's)."""
    context = multiprocessing.get_context("spawn")
    pending, running, skipped, outcomes = list(samples), {}, [], {}
    slots = [d for d in devices for _ in range(jobs)]
    while (pending or running) and not STOPPING.is_set():
        while pending and slots:
            if deadline - time.monotonic() < settings["min_eval_s"]:
                skipped += [s["id"] for s in pending]
                pending = []
                break
            sample, device = pending.pop(0), slots.pop(0)
            result = work / f"{sample['id']}.json"
            result.unlink(missing_ok=True)
            process = context.Process(target=_kb_child, args=(
                str(result), str(log), settings["gpu_arch"], sample["ref_source"], sample["source"],
                sample["build_dir"], dict(settings, device=device)), daemon=True)
            process.start()
            LIVE.add(process.pid)
            running[sample["id"]] = (process, device, time.monotonic(), result)
        time.sleep(0.2)
        for sample_id, (process, device, started, result) in list(running.items()):
            elapsed = time.monotonic() - started
            own_timeout = elapsed > settings["timeout_s"]
            if process.is_alive() and not own_timeout and time.monotonic() <= deadline:
                continue
            if STOPPING.is_set():  # ended by SIGTERM's handler, not by the sample: no verdict
                break
            del running[sample_id]
            slots.append(device)
            LIVE.discard(process.pid)
            if process.is_alive():
                stop_group(process.pid, grace_s=0)
                process.kill()  # where it had not yet made its own group
                process.join(5)
                if not own_timeout:  # the budget's end, not the sample's: no verdict
                    skipped.append(sample_id)
                    continue
                outcome = {"compiled": False, "correctness": False, "timeout": True,
                           "error": f"timed out after {elapsed:.0f} s"}
            elif result.exists():
                outcome = json.loads(result.read_text())
            else:
                outcome = {"compiled": False, "correctness": False,
                           "error": f"its process ended with exit code {process.exitcode} and no result"}
            outcome.update(wall_s=elapsed, device=device)
            outcome["class"] = kb_harness.verdict_class(outcome)
            outcomes[sample_id] = outcome
            if on_outcome:
                on_outcome(sample_id, outcome)
    if STOPPING.is_set():
        skipped += [s["id"] for s in pending] + list(running)
    return {"outcomes": outcomes, "skipped": skipped}


def needs_retry(outcome: dict) -> bool:
    text = " ".join([str(outcome.get("error", ""))] + [str(v) for v in (outcome.get("metadata") or {}).values()]).lower()
    return any(marker in text for marker in RETRY_MARKERS)


def kb_messages(outcome: dict) -> str:
    """KernelBench's reason, in a line."""
    if not outcome:
        return ""
    meta = outcome.get("metadata") or {}
    for key in ("compilation_error", "runtime_error", "correctness_issue"):
        if key in meta:
            extra = f" (max diff {meta['max_difference']})" if key == "correctness_issue" and "max_difference" in meta else ""
            return f"{key}: {brief(str(meta[key]))}{extra}"[:300]
    if outcome.get("error"):
        return str(outcome["error"])[:300]
    return f"trials {meta['correctness_trials']}" if "correctness_trials" in meta else ""


def kb_loader_check(references: dict, sources: dict) -> dict:
    """In a child with KernelBench importable: every reference through its load_original_model_and_inputs
    and get_init_inputs(), every sample through Python's parser (KernelBench execs the source)."""
    from kernelbench import eval as kb_eval
    problems, parsed = [], 0
    for name, src in sorted(references.items()):
        try:
            loaded = kb_eval.load_original_model_and_inputs(src, {})
            if not loaded or not all(loaded):
                problems.append(f"{name}: KernelBench's loader found no Model/get_inputs/get_init_inputs")
                continue
            loaded[1]()
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    syntax_errors = []
    for sample_id, src in sorted(sources.items()):
        try:
            compile(src, "<string>", "exec")
            parsed += 1
        except SyntaxError as exc:
            syntax_errors.append(f"{sample_id}: {exc.msg} (line {exc.lineno})")
    return {"references": len(references), "reference_problems": problems, "samples_parsed": parsed,
            "syntax_errors": syntax_errors}


def in_child(function, *call_args):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, call_args)


class LoaderCheck(threading.Thread):
    """kb_loader_check in a child, in the background; report() waits for it and notes what it found."""

    def __init__(self, references: dict, sources: dict):
        super().__init__(daemon=True)
        self.references, self.sources, self.result, self.error = references, sources, None, None

    def run(self):
        try:
            self.result = in_child(kb_loader_check, self.references, self.sources)
        except Exception as exc:  # noqa: BLE001 - a finding of the report, not the run's end
            self.error = f"{type(exc).__name__}: {exc}"[:300]

    def report(self, data: dict) -> None:
        self.join()
        found = data["kb_loaders"] = self.result or {"error": self.error}
        if self.error:
            note(data, "kb loaders", f"FAILED: {self.error}")
            return
        note(data, "kb loaders", f"{found['references']} references, {len(found['reference_problems'])} problems; "
                                 f"{found['samples_parsed']} samples parse, {len(found['syntax_errors'])} do not")
        for problem in found["reference_problems"]:
            print("  ", problem)


def gpu_devices(device: str) -> list:
    if device == "cpu":
        return []
    if device == "cuda:all":
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        return [f"cuda:{i}" for i in range(sum(line.startswith("GPU ") for line in listing.splitlines()))]
    return [d.strip() for d in device.split(",") if d.strip()]


# ---- the table -------------------------------------------------------------------------------------------

def brief(message: str) -> str:
    """A message in one line: its first error line (a compiler's, an exception's), else its last line."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    for pattern in (r"\berror\b[^:]*:", r"Error\b|Exception\b"):  # a compiler's error line first
        found = [line for line in lines if re.search(pattern, line)]
        if found:
            return found[0][:240]
    return lines[-1][:240] if lines else ""


def correct_kz(verdict):
    return None if not verdict else verdict.get("status") == "ok"


def correct_kb(outcome):
    return None if not outcome else bool(outcome.get("compiled") and outcome.get("correctness"))


def join(samples: list, kb: dict, kz: dict, kz_strict: dict) -> list:
    """One row per sample: both verdicts (None where a side has none), and whether they agree."""
    rows = []
    for s in samples:
        o, v, st = kb.get(s["id"]), kz.get(s["id"]), kz_strict.get(s["id"])
        row = {"id": s["id"], "level": s["level"], "problem": s["problem"], "run": s.get("run"),
               "recorded": (s.get("recorded") or {}).get("class"),
               "kb": o and o.get("class"), "kb_correct": correct_kb(o), "kb_message": kb_messages(o),
               "kz": v and v.get("status"), "kz_correct": correct_kz(v),
               "kz_checks": (v or {}).get("checks") or [], "kz_message": brief((v or {}).get("message")),
               "kz_detail": ((v or {}).get("message") or "")[-2000:],
               "kz_strict": st and st.get("status")}
        row["agree"] = None if row["kb_correct"] is None or row["kz_correct"] is None else \
            row["kb_correct"] == row["kz_correct"]
        rows.append(row)
    return rows


def summarize(rows: list) -> dict:
    judged = [r for r in rows if r["agree"] is not None]
    agree = sum(r["agree"] for r in judged)
    both = lambda a, b: sum(r["kb_correct"] is a and r["kz_correct"] is b for r in judged)  # noqa: E731
    by_level = {}
    for level in sorted({r["level"] for r in judged}):
        sub = [r for r in judged if r["level"] == level]
        by_level[str(level)] = {"judged": len(sub), "agree": sum(r["agree"] for r in sub)}
    strict = [r for r in judged if r["kz_strict"]]
    return {
        "samples": len(rows), "judged": len(judged), "agree": agree,
        "rate": agree / len(judged) if judged else None,
        "both_correct": both(True, True), "both_incorrect": both(False, False),
        "kb_only_correct": both(True, False), "kz_only_correct": both(False, True),
        "no_kb_verdict": sum(r["kb_correct"] is None for r in rows),
        "no_kz_verdict": sum(r["kz_correct"] is None for r in rows),
        "by_level": by_level,
        "strict": {"judged": len(strict), "ok": sum(r["kz_strict"] == "ok" for r in strict),
                   "kernelbench_ok_strict_not": sum(r["kz"] == "ok" and r["kz_strict"] != "ok" for r in strict)},
        "recorded_vs_kb": {"judged": sum(r["kb"] is not None and r["recorded"] is not None for r in rows),
                           "same": sum(r["kb"] is not None and (r["recorded"] == "correct") == r["kb_correct"]
                                       for r in rows if r["recorded"] is not None)},
    }


def render(data: dict) -> str:
    s, rows = data.get("summary") or {}, data.get("rows") or []
    lines = [f"kz (--policy kernelbench, [tolerance] rule = kernelbench) against KernelBench's harness "
             f"({data.get('kernelbench_commit') or '?'}), correctness only, on {data.get('device')}"
             f" ({data.get('gpu') or '-'}); kz {data.get('kz_commit') or '?'}",
             f"samples: {data.get('source') or '?'}: {len(data.get('samples') or [])} taken"]
    if s.get("judged"):
        lines.append(f"agreement: {s['agree']} / {s['judged']} = {100 * s['rate']:.1f}% (goal >= 95% on >= 100)"
                     f"  [both correct {s['both_correct']}, both incorrect {s['both_incorrect']}, KernelBench only "
                     f"{s['kb_only_correct']}, kz only {s['kz_only_correct']}]")
        lines.append("by level: " + ", ".join(f"level {k}: {v['agree']}/{v['judged']}" for k, v in s["by_level"].items()))
        if s["strict"]["judged"]:
            lines.append(f"kz --policy strict: {s['strict']['ok']} ok of {s['strict']['judged']}; "
                         f"{s['strict']['kernelbench_ok_strict_not']} ok under kernelbench but not strict")
        rv = s["recorded_vs_kb"]
        if rv["judged"]:
            lines.append(f"KernelBench here vs its verdict recorded in the source run (another GPU, older sizes): "
                         f"{rv['same']} / {rv['judged']} the same")
    else:
        lines.append("agreement: no sample judged by both sides")
    notes = data.get("notes") or {}
    for phase in dict.fromkeys(data.get("note_order") or sorted(notes)):
        lines.append(f"note ({phase}): {notes[phase]}")
    lines.append("")
    lines.append(f"{'sample':34} {'lvl':>3} {'problem':34} {'recorded':13} {'KernelBench':13} {'kz':16} "
                 f"{'kz strict':16} agree")
    for r in rows:
        mark = "-" if r["agree"] is None else ("yes" if r["agree"] else "NO")
        lines.append(f"{r['id'][:34]:34} {r['level']:>3} {r['problem'][:34]:34} {str(r['recorded']):13} "
                     f"{str(r['kb'] or '-'):13} {str(r['kz'] or '-'):16} {str(r['kz_strict'] or '-'):16} {mark}")
    disagreements = [r for r in rows if r["agree"] is False]
    lines.append("")
    lines.append(f"disagreements: {len(disagreements)}")
    for r in disagreements:
        lines.append(f"- {r['id']} ({r['problem']}): KernelBench {r['kb']}, kz {r['kz']} {r['kz_checks']}")
        lines.append(f"    KernelBench: {r['kb_message'] or '-'}")
        lines.append(f"    kz: {r['kz_message'] or '-'}")
    return "\n".join(lines) + "\n"


# ---- what is done: --state ---------------------------------------------------------------------------

PIECES = ("kb-prebuild", "kb-eval") + tuple(KZ_RUNS)  # the state's folders: one JSON file per sample in each
IDENTITY = ("kz_commit", "kernelbench_commit", "gpu")  # what made the state's verdicts: a change is noted


def write_atomically(path: pathlib.Path, text: str) -> None:
    """A whole file or none: a call killed while writing leaves only a temporary file, ignored."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class State:
    """Everything done for the samples, by piece (PIECES) and sample id, loaded from its folder and
    written there as soon as each piece exists; KernelBench's build folders live in ROOT/kb-builds."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.builds = root / "kb-builds"
        self.builds.mkdir(parents=True, exist_ok=True)
        self.done = {piece: {} for piece in PIECES}
        self.unreadable = []  # "piece/file: why", ignored: their work is done again
        self.machine_answers = []  # kz answers about the card's memory (machine_answer): judged again
        for piece in PIECES:
            folder = root / piece
            folder.mkdir(exist_ok=True)
            for leftover in folder.glob(".*.tmp"):  # a write cut short
                leftover.unlink(missing_ok=True)
            for path in sorted(folder.glob("*.json")):
                self._load(piece, path)
        self.earlier = {piece: set(found) for piece, found in self.done.items()}

    def _load(self, piece: str, path: pathlib.Path) -> None:
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.unreadable.append(f"{piece}/{path.name}: {exc}")
            return
        if not isinstance(value, dict):
            self.unreadable.append(f"{piece}/{path.name}: {type(value).__name__}, not an object")
            return
        if piece in KZ_RUNS and machine_answer(value):  # an earlier call's, not with the GPU to kz alone
            self.machine_answers.append(path.stem)
            return
        self.done[piece][path.stem] = value

    def record(self, piece: str, sample_id: str, value: dict) -> None:
        self.done[piece][sample_id] = value
        write_atomically(self.root / piece / f"{sample_id}.json", json.dumps(value, indent=1, default=str) + "\n")

    def identity_changes(self, identity: dict) -> list:
        """What differs from the identity the state was made with ("what: then -> now"); records the
        current one where there was none."""
        path = self.root / "identity.json"
        try:
            then = json.loads(path.read_text())
        except (OSError, ValueError):
            write_atomically(path, json.dumps(identity, indent=1) + "\n")
            return []
        return [f"{key}: {then.get(key)} -> {identity.get(key)}" for key in IDENTITY if then.get(key) != identity.get(key)]


def missing(samples: list, state: State, piece: str) -> list:
    """The samples without that piece in the state."""
    return [s for s in samples if s["id"] not in state.done[piece]]


def built(sample: dict, state: State) -> bool:
    """KernelBench pre-built the sample and its build folder is still here (not on a fresh host)."""
    record = state.done["kb-prebuild"].get(sample["id"]) or {}
    return bool(record.get("built")) and pathlib.Path(sample.get("build_dir") or state.builds / sample["id"]).is_dir()


def to_prebuild(samples: list, state: State) -> list:
    """The samples KernelBench has not evaluated and has no build of: never pre-built, or built on
    another host (a failed pre-build is a verdict: prebuild_verdict)."""
    return [s for s in missing(samples, state, "kb-eval") if not built(s, state)]


def ready_for_kb(samples: list, state: State) -> list:
    """The samples KernelBench can evaluate now: pre-built here, not evaluated yet."""
    return [s for s in missing(samples, state, "kb-eval") if built(s, state)]


def eval_reserve_s(samples: int, slots: int, kb_timeout: float) -> float:
    """The time KernelBench's evaluations of `samples` take (`slots` at once), with the slowest's
    tail and the tables' margin: the pre-build stops when no more than this is left."""
    return KB_EVAL_S * samples / max(1, slots) + kb_timeout / 6 + MARGIN_S


def state_note(state: State, samples: list) -> str:
    ids = {s["id"] for s in samples}
    earlier = {piece: found & ids for piece, found in state.earlier.items()}
    built = sum(bool(state.done["kb-prebuild"][i].get("built")) for i in earlier["kb-prebuild"])
    text = (f"{state.root}: from earlier calls, of the {len(samples)} samples: {len(earlier['kb-prebuild'])} "
            f"pre-built by KernelBench ({built} built), {len(earlier['kb-eval'])} evaluated by it, "
            f"{len(earlier['kz-kernelbench'])} kz verdicts, {len(earlier['kz-strict'])} kz strict verdicts")
    if state.unreadable:
        text += f"; {len(state.unreadable)} unreadable files ignored (done again): " + "; ".join(state.unreadable[:5])
    if state.machine_answers:
        text += (f"; {len(state.machine_answers)} kz answers about the machine judged again: "
                 + ", ".join(state.machine_answers[:5]))
    return text


def tables_note(state: State, samples: list) -> str:
    both = [s["id"] for s in samples if s["id"] in state.done["kb-eval"] and s["id"] in state.done["kz-kernelbench"]]
    earlier = sum(i in state.earlier["kb-eval"] and i in state.earlier["kz-kernelbench"] for i in both)
    return f"{len(both)} samples judged by both sides, {earlier} of them entirely in earlier calls"


class KzFollower(threading.Thread):
    """Copies a running kz's verdicts into the state as they appear in its results.jsonl (kz appends
    one line per verdict), so that a call killed by its timeout keeps every verdict kz gave."""

    def __init__(self, state: State, name: str, results: pathlib.Path, paths: dict, judged_alone: bool = False):
        super().__init__(daemon=True)
        self.state, self.name, self.results, self.paths = state, name, results, paths
        self.judged_alone = judged_alone
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(2.0):
            self.collect()

    def collect(self) -> None:
        record_kz(self.state, self.name, self.results, self.paths, self.judged_alone)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.collect()


def record_kz(state: State, name: str, results: pathlib.Path, paths: dict, judged_alone: bool = False) -> None:
    """The verdicts of a kz run's results.jsonl into the state (those not there yet; read_kz)."""
    for sample_id, verdict in read_kz(results, paths, judged_alone).items():
        if state.done[name].get(sample_id) != verdict:
            state.record(name, sample_id, verdict)


# ---- the run ---------------------------------------------------------------------------------------------

def note(data, phase, text):
    """The phase's line of the report (a phase noted again, by a later chunk, adds to it)."""
    with DATA_LOCK:
        notes = data.setdefault("notes", {})
        notes[phase] = f"{notes[phase]}; {text}" if phase in notes else text
        data.setdefault("note_order", []).append(phase)
    print(f"[agree] {phase}: {text}", flush=True)


TEXTS = ("source", "ref_source", "build_dir")  # a sample's texts and build folder: not for the report


def save(out: pathlib.Path, data: dict) -> None:
    with DATA_LOCK:
        if data.get("rows") is not None:
            data["summary"] = summarize(data["rows"])
        kept = dict(data, samples=[{k: v for k, v in s.items() if k not in TEXTS or isinstance(v, dict)}
                                   for s in data.get("samples") or []])
        (out / "agreement.json").write_text(json.dumps(kept, indent=1, sort_keys=True, default=str) + "\n")
        (out / "agreement.txt").write_text(render(data))


def git_commit(path: pathlib.Path):
    try:
        r = subprocess.run(["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=20)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_name(device: str):
    if device == "cpu":
        return None
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        print(render(merged(args.report_only)), end="")
        return 0
    budget = Budget(args.budget_s)
    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGTERM, end_on_sigterm)
    LIVE.clear()
    STOPPING.clear()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (*KZ_RUNS, "kz-again"):  # this call's kz verdicts only: the state holds the earlier ones
        for path in kz_results(args.out, name):
            path.unlink(missing_ok=True)
    samples = load_samples(args.samples, args.limit, args.skip)
    source = samples[0]["source"] if samples else {}
    data = {"device": args.device, "gpu": gpu_name(args.device), "limit": args.limit, "budget_s": args.budget_s,
            "kz_commit": os.environ.get("KZ_COMMIT") or git_commit(ROOT),
            "kernelbench_commit": kb_harness._git_commit(args.kernelbench),
            "source": f"{source.get('repo')}@{str(source.get('commit'))[:12]}", "samples": samples,
            "state": str(args.state) if args.state else None,
            "settings": {"kb_workers": args.kb_workers, "kb_eval_jobs": args.kb_eval_jobs,
                         "kb_timeout": args.kb_timeout, "kb_gpu_arch": args.kb_gpu_arch,
                         "kb_correct_trials": 5, "kz_trials": 5}, "rows": None}
    kz_dir = args.out / "kz"
    write_kz_suite(samples, args.kernelbench, kz_dir)
    paths = {}  # {candidate path: sample id}, filled as kz's batches are written
    work = pathlib.Path(tempfile.mkdtemp(prefix="kb-agree-"))
    # Without --state, a state in the temporary folder: the same flow, forgotten at the end.
    state = State(args.state or work / "state")
    cache_home = args.state / "kz-cache" if args.state else work / "cache"  # kz's builds, kept for strict
    print(f"[agree] {len(samples)} samples, {len({task_id(s) for s in samples})} problems; device {args.device}; "
          f"budget {args.budget_s or 'none'} s", flush=True)
    finished = False
    try:
        if args.state:
            note(data, "state", state_note(state, samples))
            changes = state.identity_changes({key: data[key] for key in IDENTITY})
            if changes:
                note(data, "state made elsewhere", "its results are kept, judged by other code or on another GPU "
                                                   "(a new --state folder starts afresh): " + "; ".join(changes))
        for sample_id, result in list(state.done["kb-prebuild"].items()):  # states written before that rule
            if failed_prebuild(result) and sample_id not in state.done["kb-eval"]:
                state.record("kb-eval", sample_id, prebuild_verdict(result))
        setup = kb_harness.prepare(args.kernelbench, work / "stubs")
        data["kb_setup"] = {"stubbed": setup["stubbed"], "commit": setup["commit"]}
        for s in samples:  # "source" is the kernel's text from here on, as kb_harness reads it
            s["origin"] = s.pop("source", None)
            s["ref_source"] = (args.kernelbench / s["reference"]).read_text()
            s["source"] = (args.samples / s["kernel"]).read_text()
            s["build_dir"] = str(state.builds / s["id"])
        # KernelBench's loaders on every reference (a child importing torch: tens of seconds), beside the run.
        loaders = LoaderCheck({task_id(s): s["ref_source"] for s in samples}, {s["id"]: s["source"] for s in samples})
        loaders.start()
        if args.device == "cpu":
            dry_run(args, data, samples, state, paths, kz_dir, cache_home)
        else:
            gpu_run(args, data, samples, state, paths, kz_dir, cache_home, work, budget)
        loaders.report(data)
        finished = True
    except Exception as exc:  # noqa: BLE001 - the tables still get written
        traceback.print_exc()
        note(data, "failed", f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        for name in KZ_RUNS:  # what a run cut short by SIGTERM wrote since its follower last looked
            for path in kz_results(args.out, name):
                record_kz(state, name, path, paths)
        record_kz(state, "kz-kernelbench", args.out / "kz-again.jsonl", paths, judged_alone=True)
        if not finished and "failed" not in data.get("notes", {}):
            note(data, "interrupted", "the tables hold the verdicts in so far")
        data["rows"] = join(samples, state.done["kb-eval"], state.done["kz-kernelbench"], state.done["kz-strict"])
        if args.state:
            note(data, "tables", tables_note(state, samples))
        data["wall_s"] = time.monotonic() - started
        save(args.out, data)
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous_handler)
    print((args.out / "agreement.txt").read_text(), end="")
    return 1 if "failed" in data.get("notes", {}) else 0


def start_kz(args, data, state, batch, name, kz_dir, cache_home, paths, device, again=False, chunk=None):
    """kz's run `name` (KZ_RUNS) on the batch, in the background, its verdicts followed into the
    state. again: the samples kz answered about the machine rather than about them (KZ_MACHINE_CHECKS),
    judged once more, with files of their own (kz-again.*). chunk N: files of their own (NAME-cN.*,
    candidates/cN). None when the batch is empty or kz does not start (said in a note)."""
    phase = "kz again" if again else "kz" if name == "kz-kernelbench" else "kz strict"
    label = "kz-again" if again else name if chunk is None else f"{name}-c{chunk}"  # its files, its record in data
    if not batch:
        note(data, phase, "every sample already judged")
        return None
    candidates = kz_dir / ("candidates-again" if again else "candidates" if name == "kz-kernelbench"
                           else "candidates-strict")
    if chunk is not None:
        candidates = candidates / f"c{chunk}"
    write_candidates(batch, args.samples, candidates, paths)
    try:
        process = run_kz(args.kz, kz_dir, label, device, KZ_RUNS[name], cache_home, args.out, candidates)
    except OSError as exc:  # KernelBench's side still runs: its verdicts are half the table
        note(data, phase, f"FAILED to start {args.kz}: {exc}")
        return None
    follower = KzFollower(state, name, args.out / f"{label}.jsonl", paths, judged_alone=again)
    follower.start()
    return {"name": label, "phase": phase, "process": process, "follower": follower, "batch": len(batch),
            "started": time.monotonic()}


def finish_kz(data, run, timeout) -> None:
    """Waits for a kz run up to `timeout` s (ended past it); its verdicts are in the state after."""
    result = data[run["name"]] = wait_kz(run["process"], timeout)
    run["follower"].stop()
    result["wall_s"] = time.monotonic() - run["started"]
    judged = len(read_kz(run["follower"].results, run["follower"].paths))
    note(data, run["phase"], f"{judged} of {run['batch']} verdicts, exit {result['rc']}, {result['wall_s']:.0f} s"
                             + (" (cut by the budget)" if result["timed_out"] else ""))


def prebuild_missing(args, data, batch, state, deadline, stop_early=None) -> None:
    """KernelBench's parallel pre-build of the batch, each result into the state as it comes."""
    with DATA_LOCK:
        kb = data.setdefault("kb", {})
        kb.setdefault("cut", [])
    if not batch:
        note(data, "kb pre-build", "nothing to build")
        return
    for s in batch:  # what a build cut short left is no build
        shutil.rmtree(s["build_dir"], ignore_errors=True)

    build_dirs = {s["id"]: s["build_dir"] for s in batch}

    def keep(sample_id, result):
        state.record("kb-prebuild", sample_id, result)
        if failed_prebuild(result):  # a verdict already: its folder is needed no more
            state.record("kb-eval", sample_id, prebuild_verdict(result))
            shutil.rmtree(build_dirs[sample_id], ignore_errors=True)

    done = kb_harness.prebuild(batch, max(1, min(args.kb_workers, len(batch))), args.kb_gpu_arch,
                               args.out / "kb-prebuild.log", deadline, on_result=keep, stop_early=stop_early)
    results = done["samples"]
    cut = [i for i, r in results.items() if r.get("cut")]
    with DATA_LOCK:
        totals = kb.setdefault("prebuild", {"samples": {}, "wall_s": 0.0, "workers": done["workers"]})
        totals["samples"].update(results)
        totals["wall_s"] += done["wall_s"]
        kb["cut"] += cut
    failed = sum(failed_prebuild(r) for r in results.values())
    note(data, "kb pre-build", f"{sum(bool(r.get('built')) for r in results.values())} of {len(batch)} built"
                               + (f", {failed} failed (their verdict: compile_error)" if failed else "")
                               + f" in {done['wall_s']:.0f} s ({args.kb_workers} workers)"
                               + (f"; {len(cut)} cut by the budget" if cut else ""))


def failed_prebuild(result: dict) -> bool:
    """A pre-build that ended without a build, for the sample's reasons: KernelBench's evaluation would
    build it again and fail the same way (compiled=False), so the failure is its verdict."""
    return not result.get("built") and not result.get("cut") and not needs_retry(result)


def prebuild_verdict(result: dict) -> dict:
    """KernelBench's verdict on a sample whose pre-build failed, as its evaluation would give it."""
    return {"compiled": False, "correctness": False, "error": result.get("error") or "pre-build failed",
            "metadata": {"compilation_error": result.get("error") or ""}, "class": "compile_error",
            "from_prebuild": True, "compile_s": result.get("compile_s")}


def kb_judge(args, data, phase, batch, devices, state, work, budget, later=None) -> None:
    """KernelBench's evaluations of the batch (pre-built, or failed to be) until the budget's end,
    a few at once per GPU. An out-of-memory or "lock file" answer, ours rather than the sample's, is
    evaluated again alone: at once, or, given `later` (a list: evaluations beside other work), by the
    caller once the GPU is KernelBench's alone (kb_judge_alone), its samples added to `later`."""
    with DATA_LOCK:
        kb = data.setdefault("kb", {})
        kb.setdefault("cut", [])
    if not batch:
        note(data, phase, "nothing to evaluate" + (f"; cut by the budget: {len(kb['cut'])}" if kb["cut"] else ""))
        return
    started = time.monotonic()
    first = kb_pass(args, data, batch, devices, state, work, budget, alone=False)
    retry = [s for s in batch if s["id"] in first and needs_retry(first[s["id"]])]
    if later is None:
        kb_pass(args, data, retry, devices, state, work, budget, alone=True)
    else:
        later += retry
    note(data, phase, f"{len(first) - len(retry)} evaluated in {time.monotonic() - started:.0f} s "
                      f"({args.kb_eval_jobs} at once on {','.join(devices)}), {len(retry)} again alone"
                      + (" (later)" if later is not None and retry else "")
                      + (f"; cut by the budget: {len(kb['cut'])}" if kb["cut"] else ""))


def kb_judge_alone(args, data, batch, devices, state, work, budget) -> None:
    """The samples whose evaluation beside other work answered about the machine: one at a time, with
    the GPU to KernelBench alone; this answer stands."""
    if batch:
        started = time.monotonic()
        done = kb_pass(args, data, batch, devices, state, work, budget, alone=True)
        note(data, "kb again alone", f"{len(done)} of {len(batch)} in {time.monotonic() - started:.0f} s")


def kb_pass(args, data, batch, devices, state, work, budget, alone: bool) -> dict:
    """One pass of KernelBench's evaluations over the batch (alone: one at a time per GPU, else
    --kb-eval-jobs). Each verdict goes into the state as it comes, and its build folder, needed no more,
    goes; an answer about the machine (needs_retry) in a pass not alone is left for one alone. Returns
    every answer it got."""
    with DATA_LOCK:
        kb = data.setdefault("kb", {})
        evaluated = kb.setdefault("eval", {"outcomes": {}, "skipped": []})
    settings = {"correct_trials": 5, "perf_trials": 0, "measure_performance": False, "timeout_s": args.kb_timeout,
                "min_eval_s": 10.0, "gpu_arch": args.kb_gpu_arch, "metadata_chars": 6000}
    build_dirs = {s["id"]: s["build_dir"] for s in batch}

    def keep(sample_id, outcome):
        if alone:
            outcome["retried_alone"] = True
        elif needs_retry(outcome):
            return
        state.record("kb-eval", sample_id, outcome)
        with DATA_LOCK:
            evaluated["outcomes"][sample_id] = outcome
        shutil.rmtree(build_dirs[sample_id], ignore_errors=True)

    results = work / "kb-results"
    results.mkdir(exist_ok=True)
    done = kb_evaluate(batch, devices, 1 if alone else args.kb_eval_jobs, settings, args.out / "kb-eval.log",
                       budget.deadline - MARGIN_S, results, keep)
    with DATA_LOCK:
        evaluated["skipped"] += done["skipped"]
        kb["cut"] += done["skipped"]
        if alone:
            kb.setdefault("retried", []).extend(s["id"] for s in batch)
    return done["outcomes"]


class KbInBackground(threading.Thread):
    """kb_judge of a chunk while the next chunk builds: its answers about the machine go to `later`."""

    def __init__(self, *judge_args, later: list):
        super().__init__(daemon=True)
        self.judge_args, self.later, self.error = judge_args, later, None
        # Waited on rather than join(): a join that a signal handler's exception interrupts marks
        # the thread as ended while it still runs.
        self.ended = threading.Event()

    def run(self):
        try:
            kb_judge(*self.judge_args, later=self.later)
        except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread by finish()
            self.error = exc
        finally:
            self.ended.set()

    def finish(self) -> None:
        """Waits for the evaluations to end, then raises what they raised."""
        self.ended.wait()
        if self.error:
            raise self.error


def dry_run(args, data, samples, state, paths, kz_dir, cache_home):
    """No GPU: kz on the first --dry-limit samples it has not judged, under the CPU backend, and where
    there is nvcc KernelBench's pre-build of the first it has not built; its side stops there
    (eval_kernel_against_ref asserts CUDA)."""
    for name in KZ_RUNS:
        run = start_kz(args, data, state, missing(samples, state, name)[:args.dry_limit], name, kz_dir,
                       cache_home, paths, "cpu")
        if run:
            finish_kz(data, run, 900)
    nvcc = shutil.which("nvcc") or pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    if pathlib.Path(nvcc).exists():  # KernelBench's pre-build needs nvcc, not a GPU
        batch = to_prebuild(samples, state)[:args.dry_limit]
        prebuild_missing(args, data, batch, state, time.monotonic() + 900)
        if batch:
            note(data, "kb pre-build", ", ".join(f"{i}: {'built' if r.get('built') else 'not built'} "
                                                 f"({r.get('compile_s') or 0:.0f} s) {brief(r.get('error'))}".strip()
                                                 for i, r in data["kb"]["prebuild"]["samples"].items()))
    note(data, "kb", "evaluations not run: KernelBench's eval_kernel_against_ref needs CUDA")


def gpu_run(args, data, samples, state, paths, kz_dir, cache_home, work, budget):
    memory_log = GpuMemoryLog(args.out / "gpu-memory.log", data)
    memory_log.start()
    try:
        judge_on_gpu(args, data, samples, state, paths, kz_dir, cache_home, work, budget)
    finally:
        memory_log.stop()


def judge_on_gpu(args, data, samples, state, paths, kz_dir, cache_home, work, budget):
    devices = gpu_devices(args.device)
    # Builds of earlier calls first: the GPU alone turns them into verdicts, before anything else
    # wants the cores or the GPU's memory.
    built_earlier = ready_for_kb(samples, state)
    if built_earlier:
        kb_judge(args, data, "kb, built earlier", built_earlier, devices, state, work, budget)
    # Then chunk by chunk, so that every chunk's samples end judged by both sides even where the
    # budget ends the call: first those one side has judged already (only the other's half is left).
    # KernelBench evaluates a chunk while the next one builds (kz judges it, KernelBench pre-builds it):
    # an answer about the machine that this sharing gives is judged again alone at the end.
    judged = lambda s, piece: s["id"] in state.done[piece]  # noqa: E731
    open_ = [s for s in samples if not (judged(s, "kb-eval") and judged(s, "kz-kernelbench"))]
    open_.sort(key=lambda s: not (judged(s, "kb-eval") or judged(s, "kz-kernelbench")))
    chunks = [open_[i:i + args.chunk] for i in range(0, len(open_), args.chunk)]
    kb_later, evaluating = [], None
    try:
        for number, chunk in enumerate(chunks, 1):
            if budget.left() - MARGIN_S < 60:
                rest = [s["id"] for c in chunks[number - 1:] for s in c]
                with DATA_LOCK:
                    data.setdefault("kb", {}).setdefault("cut", []).extend(rest)
                note(data, "chunks", f"{number - 1} of {len(chunks)} judged; the budget cut the rest")
                note(data, "kb", f"cut by the budget: {len(rest)} samples not started")
                break
            build_chunk(args, data, chunk, number, open_, state, paths, kz_dir, cache_home, budget, devices)
            if evaluating:
                evaluating.finish()
            evaluating = KbInBackground(args, data, "kb", ready_for_kb(chunk, state), devices, state, work, budget,
                                        later=kb_later)
            evaluating.start()
            save(args.out, data)
        else:
            note(data, "chunks", f"{len(chunks)} of up to {args.chunk} samples" if chunks else "nothing left to judge")
        if evaluating:
            evaluating.finish()
    except BaseException:  # SIGTERM (SystemExit) or a failure: the evaluations stop and say what they cut
        if evaluating:
            evaluating.ended.wait(10)
        raise
    kb_judge_alone(args, data, kb_later, devices, state, work, budget)
    # kz's answers about the machine (KZ_MACHINE_CHECKS): judged again with the GPU to kz alone, where
    # the time allows.
    again = [s for s in missing(samples, state, "kz-kernelbench") if s["id"] in kz_attempted(args.out, paths)]
    if again and budget.left() - MARGIN_S > 60:
        rerun = start_kz(args, data, state, again, "kz-kernelbench", kz_dir, cache_home, paths, args.device,
                         again=True)
        if rerun:
            finish_kz(data, rerun, budget.left() - MARGIN_S)
    strict_batch = [s for s in missing(samples, state, "kz-strict") if s["id"] in state.done["kz-kernelbench"]]
    strict_s = KZ_STRICT_S * len(strict_batch) / len(devices) + 30
    if args.no_strict:
        note(data, "kz strict", "skipped (--no-strict)")
    elif strict_batch and budget.left() - MARGIN_S < strict_s:
        note(data, "kz strict", f"cut: {budget.left():.0f} s left, ~{strict_s:.0f} s needed")
    else:
        strict_run = start_kz(args, data, state, strict_batch, "kz-strict", kz_dir, cache_home, paths, args.device)
        if strict_run:
            finish_kz(data, strict_run, budget.left() - MARGIN_S / 2)


def build_chunk(args, data, chunk, number, waiting, state, paths, kz_dir, cache_home, budget, devices):
    """One chunk's first half: kz judges it (its builds, then its evaluations on the GPU) while
    KernelBench pre-builds it on the cores, stopping early where the budget only leaves the time to
    evaluate what is built of `waiting` (this chunk and the one KernelBench may still be evaluating)."""
    slots = len(devices) * args.kb_eval_jobs
    kz_run = start_kz(args, data, state, missing(chunk, state, "kz-kernelbench"), "kz-kernelbench", kz_dir,
                      cache_home, paths, args.device, chunk=number)

    def reserve_s():  # evaluating what is built so far, should the pre-build stop now
        return eval_reserve_s(len(ready_for_kb(waiting, state)), slots, args.kb_timeout)

    prebuild_missing(args, data, to_prebuild(chunk, state), state, budget.deadline,
                     stop_early=lambda: budget.left() <= reserve_s())
    if kz_run:
        finish_kz(data, kz_run, budget.left() - reserve_s())


if __name__ == "__main__":
    sys.exit(main())
