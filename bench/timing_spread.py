"""Spread of timed medians across separate processes: reads several bench/timing_probe.py JSON
outputs (one per process) and prints, per task and timing protocol, the candidate's and the
reference's medians across the runs (max/min) and the speedup's max/min.

    for i in 1 2 3 4 5; do python3 bench/timing_probe.py ... --spin-us 200 --out runs/probe$i.json; done
    python3 bench/timing_spread.py runs/probe*.json

A protocol to trust gives max/min near 1 for the same kernel in different processes.
"""
import argparse
import json
import statistics
import sys


def spread(values) -> float:
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def summarize(runs: list) -> list:
    """Rows (task, kind, candidate max/min, reference max/min, speedup max/min, speedup median)."""
    measured = [r for run in runs for r in run["rows"] if "error" not in r]
    kinds = list(dict.fromkeys(k[len("speedup_"):] for r in measured for k in r if k.startswith("speedup_")))
    tasks = list(dict.fromkeys(r["task"] for r in measured))
    rows = []
    for task in tasks:
        found = [r for r in measured if r["task"] == task]
        for kind in kinds:
            speedups = [r[f"speedup_{kind}"] for r in found if f"speedup_{kind}" in r]
            if not speedups:
                continue
            cand = [r[f"cand_{kind}_ms"] for r in found if f"cand_{kind}_ms" in r]
            ref = [r[f"ref_{kind}_ms"] for r in found if f"ref_{kind}_ms" in r]
            rows.append((task, kind, spread(cand), spread(ref), spread(speedups), statistics.median(speedups)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probes", nargs="+", help="timing_probe.py --out files, one per process")
    args = parser.parse_args()
    runs = [json.load(open(path)) for path in args.probes]
    if not any("error" not in r for run in runs for r in run["rows"]):
        print("no probe rows without an error", file=sys.stderr)
        return 1
    print(f"{len(runs)} processes; max/min across them (1.000 = the same every time)")
    print(f"{'task':24} {'protocol':11} {'cand':>7} {'ref':>7} {'speedup':>8} {'median x':>9}")
    for task, kind, cand, ref, speedup, median in summarize(runs):
        cand_text = f"{cand:7.3f}" if cand == cand else "      -"  # abba has no medians of its own
        ref_text = f"{ref:7.3f}" if ref == ref else "      -"
        print(f"{task:24} {kind:11} {cand_text} {ref_text} {speedup:8.3f} {median:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
