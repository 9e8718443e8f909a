#!/usr/bin/env python3
"""Verdict agreement: kz under `--policy kernelbench` and KernelBench's tolerances against
KernelBench's own harness, on the same public kernels, side by side.

    bench/kernelbench_agreement.py --samples .kb-samples --kernelbench .kb/KernelBench --out OUTDIR
        [--limit 110] [--budget-s S] [--device cuda:0 | cuda:0,cuda:1 | cuda:all | cpu]
    bench/kernelbench_agreement.py --report-only OUTDIR/agreement.json

The kernels: the first --limit samples of .kb-samples/manifest.jsonl (bench/fetch-kb-samples.sh:
KernelBench generations of levels 1 and 2 made and judged by KernelBench's own scripts elsewhere).
Each is judged twice, correctness only (no timing):
  kb   KernelBench's harness (bench/kb_harness.py, its code from the checkout given): its parallel
       pre-build on every core, then eval_kernel_against_ref per sample in a fresh spawned process
       (5 correctness trials, fp32, measure_performance off: timing never changes its verdict), a
       few at once per GPU (--kb-eval-jobs; its own script runs one per GPU: correctness does not
       care), each with a timeout; a sample that ran out of GPU memory, or hit its "lock file,
       retry" answer, is evaluated again alone at the end.
  kz   `kz eval-suite --no-timing --no-cache --policy kernelbench` with `[tolerance] rule =
       "kernelbench"` (fresh compile caches), beside KernelBench's pre-build; then, as time allows,
       the same batch under `--policy strict` (its builds kept from the first run).
A verdict is "correct" for KernelBench when it compiled and passed every trial, for kz when its
status is `ok`. The agreement rate is over the samples both sides judged. Writes
OUTDIR/agreement.json (everything) and OUTDIR/agreement.txt (the table, every disagreement with
both sides' messages, and what the time budget cut).

--budget-s bounds the whole run: kz's run gets it all, KernelBench's pre-build stops in time for
its evaluations (samples it did not build are cut from both sides' comparison and listed), its
evaluations stop when the budget does, and the strict run happens only where it fits.
On --device cpu (no GPU) it checks what it can: the manifest, the kz suite it writes, KernelBench's
loaders on every reference, every sample through Python's parser, and kz on the first --dry-limit
samples under the CPU backend (KernelBench cannot evaluate without CUDA).
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
KB_EVAL_S = 5.0      # one KernelBench evaluation of a pre-built sample, process start included (H200, timed: ~4.3 s)
KZ_STRICT_S = 0.6    # one kz evaluation whose build is kept, per sample and GPU, at kz's concurrency (8)
MARGIN_S = 20.0      # kept at the end for the tables
RETRY_MARKERS = ("out of memory", "lock file")
LIVE = set()         # process groups started here (kz runs, KernelBench evaluations): ended on SIGTERM
PARTIAL = {"kb": {}, "kz": {}}  # the verdicts so far, for the tables of an interrupted run


def end_on_sigterm(signum, frame):
    """A `timeout` around the run: end what it started (in their own groups, out of the signal's
    reach), then exit through main's finally, which writes the tables."""
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
    p.add_argument("--kb-workers", type=int, default=os.cpu_count(), help="KernelBench's pre-build pool (default: the cores)")
    p.add_argument("--kb-eval-jobs", type=int, default=4, help="KernelBench evaluations at once per GPU (default 4)")
    p.add_argument("--kb-timeout", type=float, default=180.0, help="KernelBench's per-sample timeout (its default)")
    p.add_argument("--kb-gpu-arch", default="Hopper", help="KernelBench's gpu_arch (Hopper: H100/H200)")
    p.add_argument("--no-strict", action="store_true", help="skip kz's second run under --policy strict")
    p.add_argument("--dry-limit", type=int, default=3, help="--device cpu: samples run through kz (default 3)")
    p.add_argument("--report-only", type=pathlib.Path, nargs="+",
                   help="print the table of saved agreement.json files (several: their rows as one run) and exit")
    args = p.parse_args(argv)
    if args.limit < 1:
        p.error("--limit must be >= 1")
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


def write_kz_batch(samples: list, kernelbench: pathlib.Path, samples_dir: pathlib.Path, out: pathlib.Path) -> dict:
    """OUT/suite/<task>.py (KernelBench's references, unchanged), OUT/candidates/<task>/<id>.py and
    OUT/kernelbench.toml. Returns {candidate path: sample id}."""
    for sub in ("suite", "candidates"):
        shutil.rmtree(out / sub, ignore_errors=True)
        (out / sub).mkdir(parents=True)
    paths = {}
    for s in samples:
        task = task_id(s)
        ref = out / "suite" / f"{task}.py"
        if not ref.exists():
            shutil.copyfile(kernelbench / s["reference"], ref)
        dest = out / "candidates" / task / f"{s['id']}.py"
        dest.parent.mkdir(exist_ok=True)
        shutil.copyfile(samples_dir / s["kernel"], dest)
        paths[str(dest)] = s["id"]
    (out / "kernelbench.toml").write_text(KZ_CONFIG)
    return paths


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


def read_kz(path: pathlib.Path, paths: dict) -> dict:
    """{sample id: verdict fields} from a results.jsonl."""
    verdicts = {}
    if not path.exists():
        return verdicts
    by_stem = {pathlib.PurePath(p).stem: i for p, i in paths.items()}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        v = json.loads(line)
        sample = paths.get(v.get("candidate")) or by_stem.get(pathlib.PurePath(v.get("candidate", "")).stem)
        if sample:
            verdicts[sample] = {k: v.get(k) for k in ("status", "checks", "message", "stage", "policy",
                                                      "trials_passed", "unchecked")}
            verdicts[sample]["wall_s"] = (v.get("profile") or {}).get("wall_s")
    return verdicts


# ---- KernelBench's side --------------------------------------------------------------------------------

def _kb_child(result_path: str, log_path: str, gpu_arch: str, ref_src: str, src: str, build_dir: str, settings: dict):
    """One KernelBench evaluation in its own spawned process (and process group, so that a timeout
    ends its nvcc too); its summary goes to result_path as JSON."""
    os.setsid()
    kb_harness._child_init(log_path, gpu_arch)
    outcome = kb_harness.evaluate_one(ref_src, src, build_dir, settings)
    pathlib.Path(result_path).write_text(json.dumps(outcome, default=str))


def kb_evaluate(samples: list, devices: list, jobs: int, settings: dict, log: pathlib.Path, deadline: float,
                work: pathlib.Path, outcomes: dict = None) -> dict:
    """Samples evaluated `jobs` at a time on each device, each in a fresh process with a timeout,
    until the deadline. Returns {id: outcome} and the ids left out (not started, or stopped by the
    deadline rather than by their own timeout: no verdict of KernelBench's)."""
    context = multiprocessing.get_context("spawn")
    pending, running, skipped = list(samples), {}, []
    outcomes = {} if outcomes is None else outcomes  # filled as they come: an interrupted run keeps them
    slots = [d for d in devices for _ in range(jobs)]
    while pending or running:
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


# ---- the run ---------------------------------------------------------------------------------------------

def note(data, phase, text):
    data.setdefault("notes", {})[phase] = text
    data.setdefault("note_order", []).append(phase)
    print(f"[agree] {phase}: {text}", flush=True)


TEXTS = ("source", "ref_source", "build_dir")  # a sample's texts and build folder: not for the report


def save(out: pathlib.Path, data: dict) -> None:
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
    PARTIAL.update(kb={}, kz={})
    LIVE.clear()
    args.out.mkdir(parents=True, exist_ok=True)
    samples = load_samples(args.samples, args.limit, args.skip)
    source = samples[0]["source"] if samples else {}
    data = {"device": args.device, "gpu": gpu_name(args.device), "limit": args.limit, "budget_s": args.budget_s,
            "kz_commit": os.environ.get("KZ_COMMIT") or git_commit(ROOT),
            "kernelbench_commit": kb_harness._git_commit(args.kernelbench),
            "source": f"{source.get('repo')}@{str(source.get('commit'))[:12]}", "samples": samples,
            "settings": {"kb_workers": args.kb_workers, "kb_eval_jobs": args.kb_eval_jobs,
                         "kb_timeout": args.kb_timeout, "kb_gpu_arch": args.kb_gpu_arch,
                         "kb_correct_trials": 5, "kz_trials": 5}, "rows": None}
    kz_dir = args.out / "kz"
    paths = write_kz_batch(samples, args.kernelbench, args.samples, kz_dir)
    work = pathlib.Path(tempfile.mkdtemp(prefix="kb-agree-"))
    print(f"[agree] {len(samples)} samples, {len({task_id(s) for s in samples})} problems; device {args.device}; "
          f"budget {args.budget_s or 'none'} s", flush=True)
    try:
        setup = kb_harness.prepare(args.kernelbench, work / "stubs")
        data["kb_setup"] = {"stubbed": setup["stubbed"], "commit": setup["commit"]}
        for s in samples:  # "source" is the kernel's text from here on, as kb_harness reads it
            s["origin"] = s.pop("source", None)
            s["ref_source"] = (args.kernelbench / s["reference"]).read_text()
            s["source"] = (args.samples / s["kernel"]).read_text()
        references = {task_id(s): s["ref_source"] for s in samples}
        data["kb_loaders"] = in_child(kb_loader_check, references, {s["id"]: s["source"] for s in samples})
        note(data, "kb loaders", f"{data['kb_loaders']['references']} references, "
                                 f"{len(data['kb_loaders']['reference_problems'])} problems; "
                                 f"{data['kb_loaders']['samples_parsed']} samples parse, "
                                 f"{len(data['kb_loaders']['syntax_errors'])} do not")
        for problem in data["kb_loaders"]["reference_problems"]:
            print("  ", problem)
        cache_home = work / "cache"
        if args.device == "cpu":
            dry_run(args, data, samples, paths, kz_dir, cache_home, work)
        else:
            gpu_run(args, data, samples, paths, kz_dir, cache_home, work, budget)
    except Exception as exc:  # noqa: BLE001 - the tables still get written
        traceback.print_exc()
        note(data, "failed", f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        if data["rows"] is None and (PARTIAL["kb"] or PARTIAL["kz"]):
            note(data, "interrupted", "the tables hold the verdicts in so far")
            data["rows"] = join(samples, PARTIAL["kb"], PARTIAL["kz"], {})
        data["wall_s"] = time.monotonic() - started
        save(args.out, data)
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous_handler)
    print((args.out / "agreement.txt").read_text(), end="")
    return 1 if "failed" in data.get("notes", {}) else 0


def dry_run(args, data, samples, paths, kz_dir, cache_home, work):
    """No GPU: kz on the first --dry-limit samples under the CPU backend; KernelBench's side stops
    at its loaders (eval_kernel_against_ref asserts CUDA)."""
    subset = kz_dir / "candidates-dry"
    shutil.rmtree(subset, ignore_errors=True)
    chosen = samples[:args.dry_limit]
    for s in chosen:
        dest = subset / task_id(s) / f"{s['id']}.py"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(s["source"])
        paths[str(dest)] = s["id"]
    for name, policy in (("kz-kernelbench", "kernelbench"), ("kz-strict", "strict")):
        try:
            process = run_kz(args.kz, kz_dir, name, "cpu", policy, cache_home, args.out, subset)
        except OSError as exc:
            note(data, name, f"FAILED to start {args.kz}: {exc}")
            continue
        data[name] = wait_kz(process, 900)
        note(data, name, f"exit {data[name]['rc']} in {data[name]['waited_s']:.0f} s on the CPU "
                         f"({len(chosen)} samples)")
    kz = read_kz(args.out / "kz-kernelbench.jsonl", paths)
    strict = read_kz(args.out / "kz-strict.jsonl", paths)
    nvcc = shutil.which("nvcc") or pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    if pathlib.Path(nvcc).exists():  # KernelBench's pre-build needs nvcc, not a GPU
        builds = kb_harness.build_root()
        for s in chosen:
            s["build_dir"] = str(builds / s["id"])
        prebuild = kb_harness.prebuild(chosen, max(1, min(args.kb_workers, len(chosen))), args.kb_gpu_arch,
                                       args.out / "kb-prebuild.log", time.monotonic() + 900)
        data["kb"] = {"prebuild": prebuild}
        shutil.rmtree(builds, ignore_errors=True)
        note(data, "kb pre-build", ", ".join(f"{i}: {'built' if r.get('built') else 'not built'} "
                                             f"({r.get('compile_s') or 0:.0f} s) {brief(r.get('error'))}".strip()
                                             for i, r in prebuild["samples"].items()))
    note(data, "kb", "evaluations not run: KernelBench's eval_kernel_against_ref needs CUDA")
    data["rows"] = join(samples, {}, kz, strict)


def gpu_run(args, data, samples, paths, kz_dir, cache_home, work, budget):
    devices = gpu_devices(args.device)
    builds = kb_harness.build_root()
    for s in samples:
        s["build_dir"] = str(builds / s["id"])
    # kz first, in the background: its pre-build shares the cores with KernelBench's below.
    kz_started = time.monotonic()
    try:
        kz_process = run_kz(args.kz, kz_dir, "kz-kernelbench", args.device, "kernelbench", cache_home, args.out)
    except OSError as exc:  # KernelBench's side still runs: its verdicts are half the table
        kz_process = None
        note(data, "kz", f"FAILED to start {args.kz}: {exc}")
    # KernelBench's pre-build stops in time for its evaluations (and, if it fits, kz's strict run).
    evals_s = KB_EVAL_S * len(samples) / max(1, len(devices) * args.kb_eval_jobs) + args.kb_timeout / 6
    prebuild_deadline = budget.deadline - evals_s - MARGIN_S
    kb = data["kb"] = {}
    kb["prebuild"] = kb_harness.prebuild(samples, max(1, min(args.kb_workers, len(samples))), args.kb_gpu_arch, args.out / "kb-prebuild.log",
                                         prebuild_deadline)
    built = {i for i, r in kb["prebuild"]["samples"].items() if r.get("built")}
    cut = [i for i, r in kb["prebuild"]["samples"].items() if "deadline" in str(r.get("error"))]
    note(data, "kb pre-build", f"{len(built)} of {len(samples)} built in {kb['prebuild']['wall_s']:.0f} s"
                               f" ({args.kb_workers} workers)" + (f"; {len(cut)} cut by the budget" if cut else ""))
    save(args.out, data)
    # KernelBench's evaluations start once kz's are done (both on the GPU's memory), or at the last moment.
    kz = {}
    if kz_process:
        data["kz-kernelbench"] = wait_kz(kz_process, max(1.0, budget.left() - evals_s - MARGIN_S))
        data["kz-kernelbench"]["wall_s"] = time.monotonic() - kz_started
        kz = PARTIAL["kz"] = read_kz(args.out / "kz-kernelbench.jsonl", paths)
        run = data["kz-kernelbench"]
        note(data, "kz", f"{len(kz)} of {len(samples)} verdicts, exit {run['rc']}, {run['wall_s']:.0f} s"
                         + (" (cut by the budget)" if run["timed_out"] else ""))
    settings = {"correct_trials": 5, "perf_trials": 0, "measure_performance": False, "timeout_s": args.kb_timeout,
                "min_eval_s": 10.0, "gpu_arch": args.kb_gpu_arch, "metadata_chars": 6000}
    to_eval = [s for s in samples if s["id"] not in cut]
    results = work / "kb-results"
    results.mkdir()
    kb_started = time.monotonic()
    kb["eval"] = kb_evaluate(to_eval, devices, args.kb_eval_jobs, settings, args.out / "kb-eval.log",
                             budget.deadline - MARGIN_S, results, PARTIAL["kb"])
    retry = [s for s in to_eval if s["id"] in kb["eval"]["outcomes"] and needs_retry(kb["eval"]["outcomes"][s["id"]])]
    if retry:
        again = kb_evaluate(retry, devices, 1, settings, args.out / "kb-eval.log", budget.deadline - MARGIN_S, results)
        for sample_id, outcome in again["outcomes"].items():
            outcome["retried_alone"] = True
            kb["eval"]["outcomes"][sample_id] = outcome
        for sample_id in again["skipped"]:  # its first answer was our concurrency's, not a verdict
            kb["eval"]["outcomes"].pop(sample_id, None)
            kb["eval"]["skipped"].append(sample_id)
        kb["retried"] = [s["id"] for s in retry]
    kb["cut"] = cut + kb["eval"]["skipped"]
    note(data, "kb", f"{len(kb['eval']['outcomes'])} evaluated in {time.monotonic() - kb_started:.0f} s "
                     f"({args.kb_eval_jobs} at once on {','.join(devices)}), {len(retry)} again alone"
                     + (f"; cut by the budget: {len(kb['cut'])}" if kb["cut"] else ""))
    shutil.rmtree(builds, ignore_errors=True)
    strict = {}
    if args.no_strict or not kz_process:
        note(data, "kz strict", "skipped" + (" (--no-strict)" if args.no_strict else ""))
    elif budget.left() - MARGIN_S < KZ_STRICT_S * len(samples) / len(devices) + 30:
        note(data, "kz strict", f"cut: {budget.left():.0f} s left, "
                                f"~{KZ_STRICT_S * len(samples) / len(devices) + 30:.0f} s needed")
    else:
        strict_started = time.monotonic()
        process = run_kz(args.kz, kz_dir, "kz-strict", args.device, "strict", cache_home, args.out)
        data["kz-strict"] = wait_kz(process, budget.left() - MARGIN_S / 2)
        strict = read_kz(args.out / "kz-strict.jsonl", paths)
        note(data, "kz strict", f"{len(strict)} verdicts in {time.monotonic() - strict_started:.0f} s"
                                + (" (cut by the budget)" if data["kz-strict"]["timed_out"] else ""))
    data["rows"] = join(samples, kb["eval"]["outcomes"], kz, strict)


if __name__ == "__main__":
    sys.exit(main())
