"""Issue #3's goals over several compares: one compare is one host's sample (its KernelBench rate has
moved 4.2-5.4/min between fresh H200 hosts, kz's ratios ~15%), so a goal is judged on every complete
cold kz batch of several runs of the same code.

    python3 bench/goal_summary.py compare.json[=CODE] ... [--json OUT]

Per run: its code version, its host, KernelBench's rate, and kz's ratio per goal format in each
complete cold batch. Then per code version (CODE where given, else the commit kernelbench_compare.py
recorded, else "unrecorded"): every batch pooled, its median, range, how many batches met the line,
and on how many hosts its runs were (GPU UUIDs; a run without one counts as a host of its own). The
ratios are compare_report's own (goal_rate over the run's KernelBench rate)."""
import argparse
import json
import pathlib
import statistics
import sys

import compare_report
from compare_report import GOALS, fmt_num, per_minute, table


def load(argument: str) -> dict:
    """One run: `path` or `path=code`. Raises ValueError naming the file where it is not a compare.json."""
    path_text, _, code = argument.partition("=")
    path = pathlib.Path(path_text)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable compare.json ({exc})") from exc
    if not isinstance(data, dict) or "kz_batch" not in data:
        raise ValueError(f"{path}: no kz_batch (not kernelbench_compare.py's compare.json)")
    settings = data.get("settings") or {}
    kb = compare_report.kb_totals(data)
    # The path as given: gpu_suite.sh names every run's file compare/compare.json, in its own folder.
    return {"file": path_text, "code": code or settings.get("kz_commit") or "unrecorded",
            "host": settings.get("host") or "unrecorded", "host_key": settings.get("host") or path_text,
            "kb_rate": per_minute(kb["count"], kb["seconds"]), "batches": batches(data)}


def batches(data: dict) -> list:
    """Each complete cold kz batch's rate per goal format (a cut batch's rate would count only what
    finished)."""
    return [{fmt: compare_report.goal_rate(r, fmt)[0] for fmt in GOALS}
            for r in compare_report.kz_rounds(data) if (r["kz_batch"] or {}).get("complete")]


def ratios(run: dict, fmt: str) -> list:
    return [b[fmt] / run["kb_rate"] for b in run["batches"] if b[fmt] and run["kb_rate"]]


def run_rows(runs: list) -> list:
    rows = []
    for run in runs:
        cells = [run["file"], run["code"], run["host"][:16], fmt_num(run["kb_rate"], ".2f")]
        for fmt in GOALS:
            cells.append(", ".join(f"{r:.2f}" for r in ratios(run, fmt)) or "n/a")
        rows.append(cells)
    return rows


def pooled(runs: list) -> dict:
    """Per code version and goal format: the batches' ratios pooled over its runs."""
    summary = {}
    for run in runs:
        entry = summary.setdefault(run["code"], {"runs": 0, "hosts": set(), "ratios": {fmt: [] for fmt in GOALS}})
        entry["runs"] += 1
        entry["hosts"].add(run["host_key"])
        for fmt in GOALS:
            entry["ratios"][fmt] += ratios(run, fmt)
    return summary


def pooled_rows(summary: dict) -> list:
    rows = []
    for code, entry in summary.items():
        for fmt, goal in GOALS.items():
            values = entry["ratios"][fmt]
            met = sum(v >= goal for v in values)
            rows.append([code, entry["runs"], len(entry["hosts"]), fmt, f">= {goal:g}x", len(values),
                         fmt_num(statistics.median(values) if values else None, ".2f"),
                         f"{min(values):.2f}-{max(values):.2f}" if values else "n/a", f"{met} of {len(values)}"])
    return rows


def render(runs: list) -> str:
    per_run = table(["run", "code", "host", "KB /min", *(f"{fmt} x (each batch)" for fmt in GOALS)], run_rows(runs))
    summary = table(["code", "runs", "hosts", "format", "goal", "batches", "median x", "range", "met"],
                    pooled_rows(pooled(runs)))
    return (f"{per_run}\n\nevery complete cold kz batch pooled per code version:\n{summary}\n"
            "  host: the start of the GPU's UUID where the run recorded it; an unrecorded host counts as one per run\n"
            "  (each earlier compare ran on a fresh host)\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="compare.json files, each optionally =CODE (the code version it ran)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the pooled figures here")
    args = parser.parse_args(argv)
    try:
        runs = [load(argument) for argument in args.runs]
    except ValueError as exc:
        print(f"goal_summary: {exc}", file=sys.stderr)
        return 2
    print(render(runs), end="")
    if args.json:
        summary = pooled(runs)
        args.json.write_text(json.dumps({code: {"runs": e["runs"], "hosts": sorted(e["hosts"]), "ratios": e["ratios"]}
                                         for code, e in summary.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
