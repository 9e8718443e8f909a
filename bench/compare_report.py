"""The report of bench/kernelbench_compare.py, rendered from its compare.json (pure functions: the
script calls them after every phase, and `--report-only compare.json` re-renders a saved run)."""
import collections
import math
import statistics

FORMATS = ("cuda", "cuda-rtc", "triton")
STAGES = ("startup", "load_reference", "compile", "correctness", "timing", "recheck")
# kz status -> the class KernelBench can report (it has no format_error: compiled=False covers both).
KB_CLASS = {"format_error": "compile_error"}
GOALS = {"cuda": 10.0, "cuda-rtc": 50.0}  # issue #3: kz cands/min over KernelBench's on `cuda`


def per_minute(count: int, seconds: float):
    return 60.0 * count / seconds if seconds and seconds > 0 and count else None


def fmt_num(value, spec=".1f", none="n/a"):
    return none if value is None else format(value, spec)


def fmt_ratio(rate, kb_rate) -> str:
    return f"{rate / kb_rate:.2f}x" if rate and kb_rate else "n/a"


def table(header: list, rows: list) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- kz -------------------------------------------------------------------------------------------

def in_format_order(formats) -> list:
    """The formats named in `formats`: the known ones in FORMATS' order, then any others by name."""
    return [f for f in FORMATS if f in formats] + sorted(f for f in formats if f not in FORMATS)


def gpu_waits_by_format(verdicts: list) -> list:
    """(format, seconds waiting for the GPU lock, summed wall_s) per format, in FORMATS' order: where a
    format's evaluations lost time to the others' timings (each exclusive hold first waits for the
    shared holders' current unit while everyone else queues)."""
    waits = {}
    for v in verdicts:
        waited, summed = waits.get(v["format"], (0.0, 0.0))
        waits[v["format"]] = (waited + (v.get("gpu_wait_s") or 0.0), summed + (v.get("wall_s") or 0.0))
    return [(f, *waits[f]) for f in in_format_order(waits)]


def kz_charge_s(verdict: dict) -> float:
    """A verdict's own seconds: its evaluation's wall_s, plus, for a pre-built `cuda` candidate, its
    compile-only pre-build (prebuild_s; a build that failed there has the pre-build's verdict, whose
    wall_s is that build)."""
    return (verdict.get("wall_s") or 0.0) + (verdict.get("prebuild_s") or 0.0)


def kz_charged_total_s(data: dict) -> float:
    return sum(kz_charge_s(v) for v in (data.get("kz_batch") or {}).get("verdicts", []))


def kz_overlap_scale(data: dict) -> float:
    """Batch wall time over the summed seconds of every verdict (kz_charge_s): 1 when nothing ran
    at once; below 1 when kz ran several evaluations at once ([tuning] gpu_jobs) and the `cuda`
    pre-builds beside them. Each verdict's seconds times this is its share of the batch's wall time,
    so per-format rates add up to the batch's and `cuda` carries its own pre-build."""
    inside = kz_charged_total_s(data)
    wall = (data.get("kz_batch") or {}).get("wall_s") or 0.0
    return wall / inside if inside > wall > 0 else 1.0


def kz_format_times(data: dict) -> dict:
    """format -> {count, seconds}: each verdict's share of the batch's wall time (kz_charge_s,
    scaled by kz_overlap_scale when things overlapped), plus, for `cuda`, the batch's wall time not
    spent inside any evaluation or pre-build when they did not (kz's own start-up, charged to `cuda`
    in full)."""
    batch = data.get("kz_batch") or {}
    verdicts = batch.get("verdicts", [])
    scale = kz_overlap_scale(data)
    times = {f: {"count": 0, "seconds": 0.0} for f in FORMATS}
    for v in verdicts:
        entry = times.setdefault(v["format"], {"count": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["seconds"] += kz_charge_s(v) * scale
    times["cuda"]["seconds"] += kz_residual_s(data)
    return {f: t for f, t in times.items() if t["count"]}


def kz_residual_s(data: dict) -> float:
    """The batch's wall time outside every evaluation and pre-build (0 once they overlap)."""
    return max(0.0, ((data.get("kz_batch") or {}).get("wall_s") or 0.0) - kz_charged_total_s(data))


def kb_totals(data: dict) -> dict:
    """KernelBench's evaluated samples and its time: the parallel pre-build plus the evaluations."""
    kb = data.get("kb") or {}
    outcomes = (kb.get("eval") or {}).get("outcomes", [])
    prebuild_s = (kb.get("prebuild") or {}).get("wall_s") or 0.0
    eval_s = sum(o.get("wall_s") or 0.0 for o in outcomes)
    return {"count": len(outcomes), "seconds": prebuild_s + eval_s, "prebuild_s": prebuild_s, "eval_s": eval_s,
            "inside_s": sum(o.get("eval_s") or 0.0 for o in outcomes)}


def kz_subset_seconds(data: dict, ids: set) -> float:
    """kz's time for the `cuda` candidates KernelBench also ran: their own seconds (evaluations and
    pre-builds) plus the pre-builds of the other `cuda` candidates (a parallel build of all is no
    cheaper than of a part, so none of it is discounted), as shares of the batch's wall time."""
    verdicts = (data.get("kz_batch") or {}).get("verdicts", [])
    mine = sum(kz_charge_s(v) for v in verdicts if v["id"] in ids)
    other_builds = sum(v.get("prebuild_s") or 0.0 for v in verdicts if v["id"] not in ids)
    return (mine + other_builds) * kz_overlap_scale(data) + kz_residual_s(data)


def throughput_section(data: dict) -> str:
    """Rates end to end, and without the parallel pre-build (for `cuda`, the part of either
    harness's cost that does not grow with the number of samples up to the cores available)."""
    batch = data.get("kz_batch") or {}
    verdicts = batch.get("verdicts", [])
    kb = kb_totals(data)
    kb_rate, kb_eval_rate = per_minute(kb["count"], kb["seconds"]), per_minute(kb["count"], kb["eval_s"])
    rows = [["kz", "all", len(verdicts), fmt_num(batch.get("wall_s")), fmt_num(per_minute(len(verdicts), batch.get("wall_s"))),
             "", "", ""]]
    for fmt, t in kz_format_times(data).items():
        rate = per_minute(t["count"], t["seconds"])
        inside = sum(v.get("wall_s") or 0.0 for v in verdicts if v["format"] == fmt) * kz_overlap_scale(data)
        eval_rate = per_minute(t["count"], inside)
        rows.append(["kz", fmt, t["count"], fmt_num(t["seconds"]), fmt_num(rate), fmt_ratio(rate, kb_rate),
                     fmt_num(eval_rate), fmt_ratio(eval_rate, kb_eval_rate)])
    kb_ids = {o["id"] for o in ((data.get("kb") or {}).get("eval") or {}).get("outcomes", [])}
    if kb_ids:
        seconds = kz_subset_seconds(data, kb_ids)
        rate = per_minute(len(kb_ids), seconds)
        inside = sum(v.get("wall_s") or 0.0 for v in verdicts if v["id"] in kb_ids) * kz_overlap_scale(data)
        rows.append(["kz", "cuda, KernelBench's samples", len(kb_ids), fmt_num(seconds), fmt_num(rate),
                     fmt_ratio(rate, kb_rate), fmt_num(per_minute(len(kb_ids), inside)),
                     fmt_ratio(per_minute(len(kb_ids), inside), kb_eval_rate)])
    built = len(((data.get("kb") or {}).get("prebuild") or {}).get("samples", {}))
    count = kb["count"] if kb["count"] or not built else f"0 ({built} pre-built)"
    rows.append(["KernelBench", "cuda", count, fmt_num(kb["seconds"]), fmt_num(kb_rate), "1.00x" if kb_rate else "",
                 fmt_num(kb_eval_rate), "1.00x" if kb_eval_rate else ""])
    lines = [table(["harness", "format", "candidates", "wall s", "cands/min", "vs KernelBench cuda",
                    "w/o pre-build", "vs KernelBench"], rows),
             "  w/o pre-build: the evaluations alone (kz: each verdict's wall_s; KernelBench: its per-sample",
             "  processes), i.e. the rate once the parallel pre-build is amortised over many samples.",
             f"  kz ran evaluations and cuda pre-builds concurrently: each format is charged its verdicts' share"
             f" of the batch's wall time (summed wall_s + prebuild_s x {kz_overlap_scale(data):.3f}; cuda carries"
             " its own pre-build)" if kz_overlap_scale(data) < 1 else
             "  nothing in kz's batch overlapped: each format is charged its verdicts' wall_s + prebuild_s (cuda's"
             " pre-build), cuda also the batch's time outside them"]
    lines += goal_lines(data, kb_rate)
    return "\n".join(lines)


def goal_rate(data: dict, fmt: str):
    """kz's rate for a format, and where it was taken. For `cuda` the same samples on both sides (kz's
    time for KernelBench's samples, its whole pre-build included): a parallel pre-build costs about
    the same for few samples as for many, so rates over different counts would not compare."""
    kb_ids = {o["id"] for o in ((data.get("kb") or {}).get("eval") or {}).get("outcomes", [])}
    if fmt == "cuda" and kb_ids:
        return per_minute(len(kb_ids), kz_subset_seconds(data, kb_ids)), f" (on its {len(kb_ids)} samples)"
    t = kz_format_times(data).get(fmt)
    return (per_minute(t["count"], t["seconds"]) if t else None), ""


def kz_rounds(data: dict) -> list:
    """Every cold kz batch of the run, each as a `data` whose kz_batch it is (one where the run has no
    list: compare.json before rounds were kept)."""
    return [{**data, "kz_batch": run} for run in data.get("kz_rounds") or [data.get("kz_batch") or {}]]


def cut_short(data: dict) -> list:
    """What the time budget cut from the phases the goals rest on: KernelBench's evaluated samples (its
    rate over fewer spreads its pre-build over fewer) and kz's cold batches (no median of several)."""
    cuts = []
    kb_eval = (data.get("kb") or {}).get("eval") or {}
    if skipped := kb_eval.get("skipped"):
        evaluated = len(kb_eval.get("outcomes", []))
        cuts.append(f"KernelBench on {evaluated} of its {evaluated + len(skipped)} samples")
    if rounds_note := ((data.get("phases") or {}).get("kz rounds") or {}).get("note"):
        cuts.append("kz " + rounds_note.split(":")[0])
    return cuts


def goal_lines(data: dict, kb_rate) -> list:
    """Issue #3's goals, on the median cold batch (kz_batch), with every batch's ratio beside it; a
    verdict on a run the time budget cut short says so."""
    rounds = kz_rounds(data)
    cuts = cut_short(data)
    lines = []
    for fmt, goal in GOALS.items():
        rate, where = goal_rate(data, fmt)
        if rate is None or kb_rate is None:
            lines.append(f"goal {fmt} >= {goal:g}x KernelBench: not measured")
            continue
        ratio = rate / kb_rate
        line = f"goal {fmt} >= {goal:g}x KernelBench{where}: {ratio:.2f}x, {'met' if ratio >= goal else 'NOT met'}"
        if len(rounds) > 1:
            each = [fmt_ratio(goal_rate(r, fmt)[0], kb_rate) if r["kz_batch"].get("complete") else "n/a (incomplete)"
                    for r in rounds]
            line += f" ({chosen_round_words(data)}; each: " + ", ".join(each) + ")"
        if cuts:
            line += "; provisional, cut short by the time budget: " + ", ".join(cuts)
        lines.append(line)
    return lines


def chosen_round_words(data: dict) -> str:
    """Which cold kz batch the report's figures are (kernelbench_compare.median_round)."""
    complete = sum(1 for r in data.get("kz_rounds") or [] if r.get("complete"))
    chosen = (data.get("kz_batch") or {}).get("round")
    if not complete:
        return f"round {chosen}, incomplete: no cold kz batch completed"
    if complete == 1:
        return f"round {chosen}, the only complete cold kz batch"
    return (f"round {chosen}, the median by wall time of {complete} complete cold kz batches"
            + (" (the slower of the middle two)" if complete % 2 == 0 else ""))


def rounds_section(data: dict) -> str:
    """Each cold kz batch's wall time and rates: one batch is a sample of the host's load too."""
    rounds = kz_rounds(data)
    if len(rounds) < 2:
        return ""
    kb = kb_totals(data)
    kb_rate = per_minute(kb["count"], kb["seconds"])
    chosen = (data.get("kz_batch") or {}).get("round")
    rows = []
    for r in rounds:
        batch = r["kz_batch"]
        cells = [batch.get("round"), fmt_num(batch.get("wall_s")), "yes" if batch.get("complete") else "no"]
        for fmt in FORMATS:  # a cut batch's rates would count its finished candidates over its time
            rate, _ = goal_rate(r, fmt) if batch.get("complete") else (None, "")
            cells.append(f"{fmt_num(rate)} ({fmt_ratio(rate, kb_rate)})" if rate else "n/a (incomplete)")
        cells.append("<- the tables" if batch.get("round") == chosen else "")
        rows.append(cells)
    header = ["round", "wall s", "complete", *(f"{fmt} /min (vs KB)" for fmt in FORMATS), ""]
    return (f"kz: {len(rounds)} cold batches (round 1 before KernelBench, the others after every other phase, each with "
            f"empty compile caches); every table here is {chosen_round_words(data)}\n" + table(header, rows))


# Without startup_s: a child of a ready fork server answers in ~1-2 s on the H200, a fresh worker in ~12 s.
READY_STARTUP_S = 3.0
# With startup_s: a wait for a server or a device shorter than this is a ready child's hand-over.
WAITED_S = 0.05


def waited_for_worker(verdict: dict) -> bool:
    """Whether the evaluation waited for its worker before its own work began: for a server (its
    zygote's imports) or for its child's device where the verdict's startup_s says so, else (a fresh
    worker, or results from before startup_s) a startup stage of READY_STARTUP_S or more."""
    parts = verdict.get("startup_s")
    if parts:
        return any(parts.get(key, 0.0) >= WAITED_S for key in ("server", "device", "imports"))
    return ((verdict.get("stage_s") or {}).get("startup") or 0.0) >= READY_STARTUP_S


def stage_parts(verdicts: list, key: str, label: str) -> list:
    """One line per format: where a stage's seconds went, summed from each verdict's `key`: the
    worker's load_reference_s (the reference's import, its Model built, every input set and reference
    output, the audit's warm-up; GPU-lock waits included), compile_s (the candidate's import, its
    ModelNew built, moved to the device; nvrtc: kz_rtc's compiles inside the first two), correctness_s (the audit forward, under the
    profiler where kernel_share asks, the trials, the replay probe; GPU-lock waits included), gpu_wait_by_stage_s (the waits
    alone, by stage), timing_s (the exclusive hold: inputs, warmup, timed, with new_round,
    guard and samples inside the last two) or timing_after_hold_s (after the hold, under the shared lock:
    checks, the comparisons of the sampled outputs copied in the hold)."""
    lines = []
    for fmt in FORMATS:
        sums = summed_parts([v for v in verdicts if v["format"] == fmt], key)
        if sums:
            parts = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in sorted(sums.items()))
            lines.append(f"  {fmt} {label}: {parts}")
    return lines


def summed_parts(verdicts: list, key: str) -> dict:
    """part -> seconds, summed over the verdicts' `key` ({part: seconds} each, or absent)."""
    sums = {}
    for v in verdicts:
        for part, seconds in (v.get(key) or {}).items():
            sums[part] = sums.get(part, 0.0) + seconds
    return sums


def startup_lines(verdicts: list) -> list:
    """One line per format and kind of process: where the startup stage went (each verdict's
    startup_s). For the evaluations a fork server served: the wait for a server (forked from its
    zygote, which the first time means its imports), the wait for the child's device (CUDA context;
    in older verdicts the profiler's warm-up too), and the rest (the child's own set-up and the harness's start up to its first message).
    For those run in a worker started for the request alone ([tuning] fork_server = "never"): its
    imports, the wait for its device after them, and the seconds its CUDA context took in a thread
    beside the imports."""
    lines = []
    for fmt in FORMATS:
        started = [v for v in verdicts if v["format"] == fmt and v.get("startup_s")]
        served = [v for v in started if "imports" not in v["startup_s"]]
        fresh = [v for v in started if "imports" in v["startup_s"]]
        if served:
            parts = summed_parts(served, "startup_s")
            server, device = parts.get("server", 0.0), parts.get("device", 0.0)
            stage = summed_parts(served, "stage_s").get("startup", 0.0)
            longest = max(v["startup_s"].get("server", 0.0) for v in served)
            lines.append(f"  {fmt} startup ({len(served)} served by fork servers): waiting for a server {server:.1f} s "
                         f"(the longest {longest:.1f} s: the zygote's imports, the first time), for the child's device "
                         f"{device:.1f} s, the rest {max(0.0, stage - server - device):.1f} s")
            lines += device_step_lines(parts)
        if fresh:
            parts = summed_parts(fresh, "startup_s")
            imports, device = parts.get("imports", 0.0), parts.get("device", 0.0)
            stage = summed_parts(fresh, "stage_s").get("startup", 0.0)
            lines.append(f"  {fmt} startup ({len(fresh)} in workers started for them): "
                         f"imports {imports:.1f} s, then waiting for the device {device:.1f} s (its context made "
                         f"during the imports: {parts.get('early_context', 0.0):.1f} s), the rest "
                         f"{max(0.0, stage - imports - device):.1f} s")
            lines += device_step_lines(parts)
    return lines


def first_wave_lines(verdicts: list) -> list:
    """Which evaluations made up the first wave, per format, with their seconds: those that waited for
    a fork server at least half as long as the longest wait (the zygote's imports, which only the
    first wave waits out in full). Each is charged its own start-up, so which formats the batch's
    order puts first moves their cold rates (the batch's own rate does not)."""
    waits = [(v["format"], v["startup_s"]["server"]) for v in verdicts
             if (v.get("startup_s") or {}).get("server") is not None]
    longest = max((wait for _, wait in waits), default=0.0)
    lines = []
    if longest > 0.0:
        first = [(fmt, wait) for fmt, wait in waits if wait >= longest / 2]
        lines.append("  the first wave (waited for a server at least half the longest wait, the zygote's imports): "
                     + counted(first) + "; each format carries its own first wave's start-up, so the batch's "
                     "order moves the formats' cold rates, not the batch's")
    return lines


def counted(seconds_by_format: list) -> str:
    """"fmt N (S s), ..." in the formats' order, from (fmt, seconds) pairs: how many and their sum."""
    tally = {}
    for fmt, seconds in seconds_by_format:
        count, summed = tally.get(fmt, (0, 0.0))
        tally[fmt] = (count + 1, summed + seconds)
    return ", ".join(f"{fmt} {tally[fmt][0]} ({tally[fmt][1]:.1f} s)" for fmt in in_format_order(tally))


def device_step_lines(parts: dict) -> list:
    steps = {part.removeprefix("device_"): seconds for part, seconds in parts.items() if part.startswith("device_")}
    if not steps:
        return []
    return ["    the device's preparation where a request waited for it: "
            + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in steps.items())]


def waits_per_device(verdicts: list) -> list:
    """With several devices: per device, its evaluations, how many waited for their worker and their
    summed start-up (where a pool's workers were not ready)."""
    by_device = {}
    for v in verdicts:
        if v.get("device") and (v.get("stage_s") or {}).get("startup") is not None:
            by_device.setdefault(v["device"], []).append(v)
    if len(by_device) < 2:
        return []
    parts = [f"{device} {len(mine)} ({sum(1 for v in mine if waited_for_worker(v))} waited, startup "
             f"{sum(v['stage_s']['startup'] for v in mine):.1f} s)" for device, mine in sorted(by_device.items())]
    return ["    per device: " + "; ".join(parts)]


def stage_section(data: dict) -> str:
    """Seconds per stage, summed per format, from each verdict's stage_s (measured by kz's
    supervisor), with each format's share; then KernelBench's split."""
    verdicts = (data.get("kz_batch") or {}).get("verdicts", [])
    rows = []
    for fmt in FORMATS:
        mine = [v for v in verdicts if v["format"] == fmt]
        if not mine:
            continue
        sums = {s: sum((v.get("stage_s") or {}).get(s, 0.0) for v in mine) for s in STAGES}
        outside = sum(v.get("wall_s") or 0.0 for v in mine) - sum(sums.values())  # static checks, spawn, scratch dir
        extra = sum(v.get("prebuild_s") or 0.0 for v in mine) + (kz_residual_s(data) if fmt == "cuda" else 0.0)
        total = sum(sums.values()) + outside + extra
        cells = [f"{sums[s]:.1f} ({100 * sums[s] / total:.0f}%)" if total else "0" for s in STAGES]
        rows.append([fmt, len(mine), *cells, f"{outside:.1f}", f"{extra:.1f}", f"{total:.1f}"])
    lines = ["kz: seconds per stage summed over the batch (share of the format's total)",
             table(["format", "n", *STAGES, "supervisor", "pre-build+start", "total"], rows) if rows else "(no verdicts)",
             "  startup: up to the worker's first message (a child forked from a ready fork server: its CUDA",
             "  context; otherwise Python and torch imports too); load_reference: the reference, and every input set and reference",
             "  output precomputed; compile: importing the candidate (load_inline loads the pre-built library,",
             "  NVRTC compiles) and building ModelNew; supervisor: static checks, spawning, scratch dir;",
             "  pre-build+start: the parallel load_inline pre-builds (each verdict's prebuild_s, run beside the",
             "  other evaluations), and the batch's wall time outside every evaluation and pre-build (kz's start)."]
    started = [v for v in verdicts if (v.get("stage_s") or {}).get("startup") is not None]
    if started:
        waits = sorted(v["stage_s"]["startup"] for v in started if waited_for_worker(v))
        lines.append(f"  workers: {len(started) - len(waits)} of {len(started)} evaluations found theirs ready "
                     "(a fork server's child, its device prepared)"
                     + (f"; the other {len(waits)} waited {waits[0]:.1f}-{waits[-1]:.1f} s" if waits else ""))
        lines += waits_per_device(verdicts)
    lines += no_worker_lines(verdicts)
    lines += startup_lines(verdicts) + first_wave_lines(verdicts)
    lines += stage_parts(verdicts, "load_reference_s", "load_reference")
    lines += stage_parts(verdicts, "compile_s", "compile (nvrtc: inside import and construct)")
    lines += stage_parts(verdicts, "correctness_s", "correctness")
    lines += stage_parts(verdicts, "timing_s", "timing (exclusive)")
    lines += stage_parts(verdicts, "timing_after_hold_s", "timing (after the hold, shared)")
    locked = [v for v in verdicts if v.get("gpu_wait_s") is not None]
    if locked:
        wait = sum(v["gpu_wait_s"] for v in locked)
        exclusive = sum(v.get("gpu_exclusive_s") or 0.0 for v in locked)
        wall = (data.get("kz_batch") or {}).get("wall_s") or 0.0
        lines.append(f"  GPU lock ({len(locked)} evaluations sharing the GPU): {wait:.1f} s waiting for it (inside the "
                     f"stages above), {exclusive:.1f} s held exclusive by timings"
                     + (f" = {100 * exclusive / wall:.0f}% of the batch's {wall:.0f} s wall time (timings never "
                        "overlap: their sum bounds the rate)" if wall else ""))
        lines.append("    waiting per format (share of its verdicts' summed wall_s): " + ", ".join(
            f"{fmt} {waited:.1f} s ({100 * waited / summed:.0f}%)" if summed else f"{fmt} {waited:.1f} s"
            for fmt, waited, summed in gpu_waits_by_format(locked)))
        lines += ["  " + line for line in stage_parts(locked, "gpu_wait_by_stage_s", "waiting by stage")]
    spins = collections.Counter(v.get("launch_spin") for v in verdicts if v.get("speedup") is not None)
    if spins:
        counts = sorted((kind or "not recorded", n) for kind, n in spins.items())
        lines.append("  launch spins: " + ", ".join(f"{kind} in {n}" for kind, n in counts)
                     + f" of {sum(spins.values())} timings (gated: ended by the host once it had issued the run, "
                     "docs/evaluation.md)")
    lines += timeline_lines(data)
    failed = [v for v in verdicts if v["format"] == "cuda" and "kernel_compile" in (v.get("checks") or [])]
    if failed:
        seconds = sum((v.get("stage_s") or {}).get("compile", 0.0) for v in failed)
        lines.append(f"  of kz's cuda compile stage, {seconds:.1f} s went to {len(failed)} load_inline build(s) that failed "
                     "(in the parallel pre-build, whose verdict kz keeps; kz before that change rebuilt them one at "
                     "a time on the GPU's critical path)")
    kb = kb_totals(data)
    if kb["count"]:
        lines.append(f"KernelBench: parallel pre-build {kb['prebuild_s']:.1f} s; {kb['count']} evaluations "
                     f"{kb['eval_s']:.1f} s, of which {kb['inside_s']:.1f} s inside eval_kernel_against_ref "
                     f"(the rest: a fresh process per sample, torch and KernelBench imports)")
        failed = [o for o in kb_outcomes(data) if prebuilt(data, o["id"]) is False]
        if failed:
            lines.append(f"  {sum(o.get('eval_s') or 0.0 for o in failed):.1f} s of its evaluations went to "
                         f"{len(failed)} sample(s) whose pre-build had failed (it builds them again)")
        prebuild = ((data.get("kb") or {}).get("prebuild") or {})
        lines += host_cpu_lines(prebuild, bucket_s=10.0, who="its pre-build ran")
    return "\n".join(lines)


def no_worker_lines(verdicts: list) -> list:
    """The verdicts the supervisor gave without starting a worker (no stage_s), by the stage that
    decided them: the format's own checks (no stage), the static checks, Python's syntax."""
    mine = [v for v in verdicts if not v.get("stage_s") and not v.get("cached")]
    if not mine:
        return []
    decided = collections.Counter((v.get("stage") or "format") if "stage" in v else "stage not recorded" for v in mine)
    longest = max(v.get("wall_s") or 0.0 for v in mine)
    return [f"  decided without a worker: {sum(decided.values())} ("
            + ", ".join(f"{stage} {n}" for stage, n in sorted(decided.items())) + f"), {longest:.3f} s at most each"]


def timeline_lines(data: dict) -> list:
    """When things ran, in seconds from kz's batch start (each verdict's started_s and
    prebuild_started_s, set by kz eval-suite): the span of the pre-builds and of each format's
    evaluations, and the batch's critical path (the last build to end, then its evaluation)."""
    batch = data.get("kz_batch") or {}
    verdicts = [v for v in batch.get("verdicts", []) if v.get("started_s") is not None]
    if not verdicts:
        return []
    builds = [(v["prebuild_started_s"], v["prebuild_started_s"] + (v.get("prebuild_s") or 0.0), v)
              for v in batch.get("verdicts", []) if v.get("prebuild_started_s") is not None]
    spans = []
    for fmt in FORMATS:
        mine = [v for v in verdicts if v["format"] == fmt]
        if mine:
            spans.append(f"{fmt} {min(v['started_s'] for v in mine):.1f}-"
                         f"{max(v['started_s'] + (v.get('wall_s') or 0.0) for v in mine):.1f}")
    lines = [f"  timeline (s from the batch's start, which took {batch.get('wall_s') or 0.0:.1f} s in all): evaluations "
             + ", ".join(spans)]
    if builds:
        begin, end, last = max(builds, key=lambda b: b[1])
        lines.append(f"    cuda pre-builds {min(b[0] for b in builds):.1f}-{end:.1f}; the last to end ({last['id']}, "
                     f"{end - begin:.1f} s) then evaluated {last['started_s']:.1f}-"
                     f"{last['started_s'] + (last.get('wall_s') or 0.0):.1f}")
        lines += build_part_lines([b[2] for b in builds], last)
    return lines + own_phase_lines(batch) + host_cpu_lines(batch) + cpu_seconds_lines(batch)


# A pre-build's parts (the verdict's build_s: worker/kz_worker/compile/load_inline.py, build_parts) in the order
# they run, as (label, part or parts summed).
_BUILD_STEPS = [("worker", "worker_start"), ("import", "import_to_build"), ("load_inline", "load_inline"),
                ("ninja", "ninja")]
_NINJA_STEPS = [("nvcc", "ninja_cuda"), ("main.cpp", "ninja_cpp"), ("link", "ninja_link")]
_NVCC_STEPS = [("plan", "nvcc_plan"), ("host chain", "nvcc_host_chain"), ("device chain waited", "nvcc_device_wait"),
               ("device chain", "nvcc_device_chain"), ("host compile", "nvcc_host_compile")]


def build_part_lines(builds: list, last: dict) -> list:
    """Where the pre-builds' seconds went: each part's median over the builds that report it, and the
    last build's in brackets (the batch's critical path), with the rest of prebuild_s (the worker's
    exit, the supervisor keeping the build)."""
    reported = [v for v in builds if v.get("build_s")]
    if not reported:
        return []

    def cell(label, part):
        values = sorted(v["build_s"][part] for v in reported if part in v["build_s"])
        if not values:
            return None
        mine = (last.get("build_s") or {}).get(part)
        return f"{label} {statistics.median(values):.1f}" + (f" [{mine:.1f}]" if mine is not None else "")

    def cells(steps):
        return ", ".join(c for c in (cell(label, part) for label, part in steps) if c)

    rest = [v["prebuild_s"] - sum(v["build_s"].get(p, 0.0) for p in ("worker_start", "import_to_build", "load_inline"))
            for v in reported if v.get("prebuild_s")]
    lines = [f"    where a pre-build's seconds went (median of {len(reported)}, the last's in brackets): "
             + cells(_BUILD_STEPS) + (f", the rest {statistics.median(rest):.1f}" if rest else "")]
    if ninja := cells(_NINJA_STEPS):
        lines.append(f"      ninja's steps (nvcc and main.cpp side by side, then the link): {ninja}")
    if nvcc := cells(_NVCC_STEPS):
        lines.append(f"      kz-nvcc (its host and device chains, the device one after waiting where it waited, then the host compile): {nvcc}")
    return lines


def host_cpu_lines(batch: dict, bucket_s: float = 2.0, who: str = "kz ran") -> list:
    """How busy the host's cores were while kz ran (kernelbench_compare.CpuSampler): on average,
    and per `bucket_s` of the batch, with the share the hypervisor gave other guests (steal)."""
    cpu = batch.get("host_cpu") or {}
    samples = cpu.get("samples") or []
    if not samples:
        return []
    buckets = {}
    for at, busy, steal in samples:
        buckets.setdefault(int(at // bucket_s), []).append((busy, steal))
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    cells = [f"{int(b * bucket_s)}-{int((b + 1) * bucket_s)} {mean([x[0] for x in v]):.0%}"
             for b, v in sorted(buckets.items())]
    steal = mean([s[2] for s in samples])
    return [f"  host CPU while {who} ({cpu.get('cores')} cores, /proc/stat every {cpu.get('interval_s')} s): busy "
            f"{mean([s[1] for s in samples]):.0%} on average, stolen by other guests {steal:.1%}; busy per "
            f"{bucket_s:g} s: " + ", ".join(cells)]


def cpu_seconds_lines(batch: dict) -> list:
    """Where the batch's CPU went: each format's workers' CPU seconds (the verdicts' cpu_s: the
    worker's own process and the subprocesses it waited for; a `cuda` pre-build that failed is its
    candidate's verdict, so it counts with the `cuda` evaluations) and the `cuda` pre-builds'
    (prebuild_cpu_s), against the host's busy CPU-seconds while kz ran (host_cpu, each sample weighted
    by the time since the one before): the rest is kz, the zygotes' imports, the fork servers, their
    spare children, the syntax checker and anything else on the host."""
    verdicts = batch.get("verdicts", [])
    rows = []  # (label, count, total CPU seconds, of which in subprocesses or None)
    builds = [v["prebuild_cpu_s"] for v in verdicts if v.get("prebuild_cpu_s") is not None]
    if builds:
        rows.append(("cuda pre-builds", len(builds), sum(builds), None))
    for fmt in FORMATS:
        mine = [v for v in verdicts if v["format"] == fmt and v.get("cpu_s")]
        if mine:
            parts = summed_parts(mine, "cpu_s")
            rows.append((f"{fmt} evaluations", len(mine), sum(parts.values()), parts.get("subprocesses", 0.0)))
    if not rows:
        return []
    cells = [f"{label} {total:.1f} ({count}: {total / count:.2f} each"
             + (f"; subprocesses {waited:.1f}" if waited is not None and waited >= 0.05 else "") + ")"
             for label, count, total, waited in rows]
    counted = sum(total for _, _, total, _ in rows)
    line = f"  CPU seconds (user + system, as each worker reported them): {', '.join(cells)}; {counted:.1f} in all"
    cpu = batch.get("host_cpu") or {}
    samples, cores = cpu.get("samples") or [], cpu.get("cores") or 0
    if samples and cores:
        busy, before = 0.0, 0.0
        for at, fraction, _ in samples:
            busy += fraction * cores * (at - before)
            before = at
        line += (f", of the host's {busy:.1f} busy CPU-seconds while kz ran (the rest, {max(0.0, busy - counted):.1f}: "
                 "kz, the zygotes' imports, the fork servers and their spare children, the syntax checker, the system)")
    return [line]


def own_phase_lines(batch: dict) -> list:
    """kz's own time around the batch, from its summary's phases_s (kz eval-suite): set-up before
    the first request, shut-down of the fork servers after the last verdict, and the rest of the
    wall time the harness measured (exec, loading, writing the results, exit)."""
    phases = batch.get("phases_s")
    if not phases:
        return []
    inside = phases["setup"] + phases["batch"] + phases["shutdown"]
    rest = (batch.get("wall_s") or 0.0) - inside
    return [f"    kz's own: set-up {phases['setup']:.2f} s before the batch, its batch {phases['batch']:.2f} s, "
            f"shut-down {phases['shutdown']:.2f} s ({phases['servers_ended']} fork servers ended at once), "
            f"the process's start and exit {rest:.2f} s"]


def kb_outcomes(data: dict) -> list:
    return ((data.get("kb") or {}).get("eval") or {}).get("outcomes", [])


def prebuilt(data: dict, sample_id: str):
    """Whether KernelBench's pre-build of a sample succeeded (None: unknown)."""
    result = (((data.get("kb") or {}).get("prebuild") or {}).get("samples") or {}).get(sample_id)
    return None if result is None else result.get("built")


def agreement_section(data: dict) -> str:
    manifest = {row["id"]: row for row in data.get("manifest", [])}
    verdicts = {v["id"]: v for v in (data.get("kz_batch") or {}).get("verdicts", [])}
    kb = {o["id"]: o for o in ((data.get("kb") or {}).get("eval") or {}).get("outcomes", [])}
    on_cpu = data.get("settings", {}).get("device") == "cpu"
    rows, kz_match, kb_match = [], 0, 0
    for cid, row in manifest.items():
        expected = expected_status(row, on_cpu)
        v = verdicts.get(cid)
        kz_status = v["status"] if v else "-"
        kz_match += kz_status == expected
        kb_cell = ""
        if cid in kb:
            kb_cell = kb[cid]["class"]
            kb_match += kb_cell == KB_CLASS.get(expected, expected)
        speed = fmt_num(v.get("speedup"), ".2f", "") if v else ""
        unchecked = "".join(f" (unchecked: {check})" for check in ((v or {}).get("unchecked") or {}))
        rows.append([cid, expected, kz_status + ("" if kz_status == expected else "  <- differs") + unchecked, speed,
                     fmt_num(v.get("wall_s") if v else None, ".1f", ""), kb_cell,
                     fmt_num(kb[cid].get("wall_s"), ".1f", "") if cid in kb else ""])
    head = f"verdicts: kz {kz_match}/{len(manifest)} as expected"
    if kb:
        head += f"; KernelBench {kb_match}/{len(kb)} as expected (its classes: ok, incorrect, runtime_error, compile_error)"
    return head + "\n" + table(["candidate", "expected", "kz status", "speedup", "kz s", "KernelBench", "KB s"], rows)


def expected_status(row: dict, on_cpu: bool) -> str:
    """The manifest's GPU expectation, or what a CPU machine gives: cuda and cuda-rtc candidates that
    compile are compiled_not_run there (nothing runs)."""
    if on_cpu and row["format"] in ("cuda", "cuda-rtc") and row["expected"] in ("ok", "incorrect", "runtime_error"):
        return "compiled_not_run"
    return row["expected"]


def stability_section(data: dict) -> str:
    st = data.get("stability") or {}
    verdicts = [v for v in st.get("verdicts", []) if v.get("runtime_ms")]
    settings = data.get("settings", {})
    name = f"{st.get('task', settings.get('stability_task', '?'))} ({st.get('format', settings.get('stability_format', '?'))})"
    if len(verdicts) < 2:
        return f"timing stability of {name}: {st.get('note') or untimed(st)}"
    return (f"timing stability: {name} in {len(verdicts)} separate kz evaluations\n"
            + table(["", "per evaluation", "max/min"], stability_rows(data)))


def stability_rows(data: dict) -> list:
    verdicts = [v for v in (data.get("stability") or {}).get("verdicts", []) if v.get("runtime_ms")]
    if len(verdicts) < 2:
        return []
    rows = []
    for label, key in (("candidate median ms", "runtime_ms"), ("reference median ms", "ref_runtime_ms"),
                       ("speedup", "speedup")):
        values = [v[key] for v in verdicts if v.get(key)]
        rows.append([label, " ".join(f"{x:.4f}" for x in values), f"{max(values) / min(values):.3f}"])
    return rows


def reference_section(data: dict) -> str:
    ref = data.get("ref_as_candidate") or {}
    verdicts = [v for v in ref.get("verdicts", []) if v.get("speedup")]
    if not verdicts:
        return f"reference as its own candidate: {ref.get('note') or untimed(ref)}"
    speedups = [v["speedup"] for v in verdicts]
    inside = sum(0.97 <= s <= 1.03 for s in speedups)
    lines = [f"reference as its own candidate (--format torch): {len(speedups)} tasks, speedup "
             f"{min(speedups):.3f}x to {max(speedups):.3f}x, geomean {geomean(speedups):.3f}x, "
             f"{inside}/{len(speedups)} within 0.97-1.03"]
    cells = [f"{v['task']} {v['speedup']:.3f}x" for v in verdicts]
    lines += ["  " + "  ".join(cells[i:i + 5]) for i in range(0, len(cells), 5)]
    if ref.get("skipped"):
        lines.append(f"  not run (time budget): {', '.join(ref['skipped'])}")
    return "\n".join(lines)


def untimed(phase: dict) -> str:
    """Why a timing phase has no figures: it did not run (no GPU), or its verdicts were not timed."""
    statuses = [v.get("status") for v in phase.get("verdicts", [])]
    if not statuses:
        return "not measured (needs a GPU)"
    counts = ", ".join(f"{s} x{statuses.count(s)}" for s in sorted(set(statuses)))
    return f"no timed verdicts ({counts}; see the kz-*.jsonl logs)"


def geomean(values: list) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def header_section(data: dict) -> str:
    s = data.get("settings", {})
    kb = data.get("kb") or {}
    counts = ", ".join(f"{f} {sum(r['format'] == f for r in data.get('manifest', []))}" for f in FORMATS)
    lines = [f"kz vs KernelBench, evaluation throughput ({'CPU: kz verification only' if s.get('device') == 'cpu' else s.get('gpu', 'GPU')})",
             f"batch: {len(data.get('manifest', []))} candidates ({counts}); kz and KernelBench both start cold "
             "(no verdict cache, empty compile caches)"]
    if s.get("kz_commit") or s.get("host"):  # runs before these were recorded have neither
        lines.append(f"kz at {s.get('kz_commit') or 'an unrecorded commit'}; host: {s.get('host') or 'unrecorded'} (its GPU's UUID)")
    if kb.get("setup"):
        setup = kb["setup"]
        lines.append(f"KernelBench (commit {setup.get('commit', '?')}): its parallel pre-build (build_cache mode) with "
                     f"{s.get('kb_workers')} workers, then one fresh process per sample; TORCH_CUDA_ARCH_LIST="
                     f"{s.get('kb_gpu_arch')}; --kb-limit {s.get('kb_limit')}; "
                     f"{setup.get('correct_trials', 5)} correctness + {setup.get('perf_trials', 100)} timed trials")
        if setup.get("stubbed"):
            lines.append(f"  stand-ins for modules KernelBench imports but does not evaluate with: {', '.join(setup['stubbed'])}")
    if s.get("shared_bytecode"):
        lines.append("both import Python from the bytecode kz's setup compiled for the interpreter, whose packages carry "
                     "none (scripts/compile_worker_bytecode.py)")
    settled = data.get("settle")
    lines.append("both ran on a settled machine: dirty pages written out (sync {:.1f} s) and {:.1f} GiB of the toolchain's "
                 "files read once{} before either was timed".format(settled["sync_s"], settled["read_bytes"] / 2**30,
                                                                   "" if settled["complete"] else " (stopped at the limit)")
                 if settled else "the machine was not settled first (--no-settle, or a run before it existed): the first "
                 "side timed may carry the build's writeback and first reads from disk")
    if kb.get("note"):
        lines.append(f"KernelBench: {kb['note']}")
    for problem in kb.get("loader_problems", []):
        lines.append(f"  KernelBench loader: {problem}")
    for name, phase in data.get("phases", {}).items():
        if phase.get("note"):
            lines.append(f"{name}: {phase['note']}")
    return "\n".join(lines)


def render(data: dict) -> str:
    sections = [header_section(data), throughput_section(data), rounds_section(data), stage_section(data),
                agreement_section(data), stability_section(data), reference_section(data)]
    return "\n\n".join(section for section in sections if section) + "\n"


def short_report(data: dict) -> str:
    """The few lines bench/gpu_suite.sh prints last: rates, goals, stability, reference check."""
    kb = kb_totals(data)
    lines = [short_table(data), *goal_lines(data, per_minute(kb["count"], kb["seconds"]))]
    lines.append(stability_section(data).splitlines()[0])
    stable = [r for r in stability_rows(data) if r[0] == "candidate median ms"]
    if stable:
        lines[-1] += f": candidate median max/min {stable[0][2]}"
    lines.append(reference_section(data).splitlines()[0])
    return "\n".join(lines) + "\n"


def short_table(data: dict) -> str:
    """Cands/min per harness and format, and the ratio to KernelBench's."""
    kb = kb_totals(data)
    kb_rate = per_minute(kb["count"], kb["seconds"])
    rows = [["KernelBench cuda", kb["count"], fmt_num(kb_rate), "1.00x" if kb_rate else "n/a"]]
    for fmt, t in kz_format_times(data).items():
        rate = per_minute(t["count"], t["seconds"])
        rows.append([f"kz {fmt}", t["count"], fmt_num(rate), fmt_ratio(rate, kb_rate)])
    return table(["harness", "candidates", "cands/min", "vs KernelBench"], rows)
