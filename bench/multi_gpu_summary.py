"""One batch on one GPU and on several (bench/gpu_suite.sh multigpu): does a pool per GPU pay, and do
the verdicts stay the same?

    python3 bench/multi_gpu_summary.py --manifest BATCH/manifest.jsonl --walls walls.txt \
        run-one-gpu.jsonl run-two-gpus.jsonl

Each run is one `kz eval-suite --out` file; walls.txt has a line "<devices>: exit N, S s wall" per run,
in the same order. Prints, per run: wall time, candidates per minute, verdicts as the manifest
expects, and per GPU the evaluations it ran and the seconds its timings held it exclusive; then
every timed candidate's speedup in each run. Exits 1 when a verdict differs from the manifest.
"""
import argparse
import json
import pathlib
import re
import sys


def read_jsonl(path: pathlib.Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def candidate_id(verdict: dict) -> str:
    path = pathlib.PurePath(verdict.get("candidate", ""))
    return f"{path.parent.name}/{path.stem}"


def read_walls(path: pathlib.Path) -> list:
    walls = []
    for line in path.read_text().splitlines():
        match = re.match(r"(\S+): exit (\d+), (\d+(?:\.\d+)?) s wall", line.strip())
        if match:
            walls.append((match[1], int(match[2]), float(match[3])))
    return walls


def run_names(devices: list) -> list:
    """The runs' device lists, numbered where one appears more than once (the same GPU twice)."""
    return [d if devices.count(d) == 1 else f"{d} #{devices[:k + 1].count(d)}" for k, d in enumerate(devices)]


def table(header: list, rows: list) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def summarize(manifest: list, walls: list, runs: list) -> tuple:
    """(report text, number of verdicts that differ from the manifest)."""
    expected = {row["id"]: row["expected"] for row in manifest}
    rows, mismatches, speedups = [], 0, {}
    names = run_names([w[0] for w in walls])
    for (_, rc, wall), devices, verdicts in zip(walls, names, runs):
        wrong = [candidate_id(v) for v in verdicts if expected.get(candidate_id(v)) != v["status"]]
        missing = len(expected) - len(verdicts)
        mismatches += len(wrong) + max(missing, 0)
        per_gpu = {}
        for v in verdicts:
            count, exclusive = per_gpu.get(v.get("device", "?"), (0, 0.0))
            per_gpu[v.get("device", "?")] = (count + 1, exclusive + ((v.get("profile") or {}).get("gpu_exclusive_s") or 0.0))
        gpus = ", ".join(f"{d}: {n} evals, {x:.1f} s exclusive" for d, (n, x) in sorted(per_gpu.items()))
        rate = 60.0 * len(verdicts) / wall if wall > 0 else 0.0
        rows.append([devices, rc, f"{wall:.0f}", f"{rate:.1f}", f"{len(verdicts) - len(wrong)}/{len(expected)}", gpus])
        for v in verdicts:
            if v.get("speedup"):
                speedups.setdefault(candidate_id(v), {})[devices] = v["speedup"]
    text = [table(["devices", "exit", "wall s", "cands/min", "as expected", "per GPU"], rows)]
    if len(rows) >= 2 and float(rows[0][2]) > 0:
        text.append(f"{rows[-1][0]} against {rows[0][0]}: {float(rows[0][2]) / float(rows[-1][2]):.2f}x the rate")
    speed_rows = [[cid, *(f"{s[n]:.3f}" if n in s else "-" for n in names)] for cid, s in sorted(speedups.items())]
    if speed_rows:
        text.append("speedup of each timed candidate, per run")
        text.append(table(["candidate", *names], speed_rows))
    return "\n".join(text), mismatches


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", type=pathlib.Path, required=True)
    p.add_argument("--walls", type=pathlib.Path, required=True)
    p.add_argument("runs", type=pathlib.Path, nargs="+")
    args = p.parse_args()
    walls = read_walls(args.walls)
    if len(walls) != len(args.runs):
        p.error(f"{args.walls} names {len(walls)} runs, {len(args.runs)} result files given")
    runs = [read_jsonl(r) if r.exists() else [] for r in args.runs]
    text, mismatches = summarize(read_jsonl(args.manifest), walls, runs)
    print(text)
    if mismatches:
        print(f"{mismatches} verdict(s) differ from the manifest or are missing")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
