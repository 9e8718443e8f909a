"""An A/B's runs side by side (bench/gpu_suite.sh ab): for each cold kz batch, its wall time, when
the last `cuda` pre-build ended, each format's rate (its verdicts' share of the batch's wall time,
as the compare report charges it) and each format's start-up summed over its verdicts; then each
side's medians, and pair by pair (round by round) how far B is from A.

  python3 bench/ab_summary.py OUT [--b-label bench/configs/X.toml]

OUT holds the runs' dirs A-1, B-1, A-2, B-2, ... (since session 29 gpu_suite.sh runs A first in odd
rounds and B first in even ones; the tables list A first either way), each with the compare.json that
bench/kernelbench_compare.py wrote. Runs that are missing or incomplete are named and left out."""
import argparse
import json
import pathlib
import re
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_report import FORMATS, fmt_num, kz_format_times, per_minute, table  # noqa: E402

RUN_DIR = re.compile(r"^([AB])-(\d+)$")


def prebuilds_end_s(verdicts: list):
    """When the last `cuda` pre-build ended, in seconds from the batch's start (None: no pre-build)."""
    ends = [v["prebuild_started_s"] + (v.get("prebuild_s") or 0.0)
            for v in verdicts if v.get("prebuild_started_s") is not None]
    return max(ends) if ends else None


def run_figures(data: dict) -> dict:
    """What the summary shows of one run's compare.json."""
    batch = data.get("kz_batch") or {}
    verdicts = batch.get("verdicts", [])
    rates = {fmt: per_minute(t["count"], t["seconds"]) for fmt, t in kz_format_times(data).items()}
    startup = {fmt: sum((v.get("stage_s") or {}).get("startup", 0.0) for v in verdicts if v["format"] == fmt)
               for fmt in rates}
    return {"batch_s": batch.get("wall_s"), "prebuilds_end_s": prebuilds_end_s(verdicts), "rates": rates,
            "startup_s": startup, "complete": bool(batch.get("complete"))}


def load_runs(out: pathlib.Path):
    """{(side, round): figures} for every complete run under `out`, and a line for each left out."""
    runs, skipped = {}, []
    for path in sorted(out.iterdir()):
        match = RUN_DIR.match(path.name)
        if not match or not path.is_dir():
            continue
        try:
            figures = run_figures(json.loads((path / "compare.json").read_text()))
        except (OSError, ValueError, KeyError) as exc:
            skipped.append(f"{path.name}: no usable compare.json ({exc})")
            continue
        if not figures["complete"] or figures["batch_s"] is None:
            skipped.append(f"{path.name}: its kz batch did not complete")
            continue
        runs[(match[1], int(match[2]))] = figures
    for side, n in sorted(runs):
        other = "B" if side == "A" else "A"
        if (other, n) not in runs:
            skipped.append(f"{other}-{n}: not there or not usable, so {side}-{n} is in its side's median "
                           "but in no pair")
    return runs, skipped


def columns(runs: dict) -> list:
    """(label, getter) for every figure shown: the batch, the pre-builds' end, then per format its
    rate and its summed start-up (only the formats some run has)."""
    formats = [f for f in FORMATS if any(f in r["rates"] for r in runs.values())]
    cols = [("batch s", lambda r: r["batch_s"]), ("pre-builds end s", lambda r: r["prebuilds_end_s"])]
    for fmt in formats:
        cols.append((f"{fmt} /min", lambda r, f=fmt: r["rates"].get(f)))
    for fmt in formats:
        cols.append((f"{fmt} start-up s", lambda r, f=fmt: r["startup_s"].get(f)))
    return cols


def median_of(runs: list, get):
    values = [get(r) for r in runs if get(r) is not None]
    return statistics.median(values) if values else None


def change(a, b) -> str:
    """B against A in percent ("n/a" where either is missing or A is 0)."""
    return "n/a" if a in (None, 0) or b is None else f"{100.0 * (b - a) / a:+.0f}%"


def render(runs: dict, skipped: list, b_label: str = "") -> str:
    if not runs:
        return "no complete A/B run found\n" + "".join(f"  left out: {s}\n" for s in skipped)
    cols = columns(runs)
    header = ["run"] + [label for label, _ in cols]
    rows = [[f"{side}-{n}"] + [fmt_num(get(figures)) for _, get in cols] for (side, n), figures in sorted(
        runs.items(), key=lambda item: (item[0][1], item[0][0]))]
    for side in ("A", "B"):  # over every complete run of the side, paired or not
        mine = [f for (s, _), f in runs.items() if s == side]
        if mine:
            rows.append([f"{side} median ({len(mine)})"] + [fmt_num(median_of(mine, get)) for _, get in cols])
    pairs = sorted(n for (side, n) in runs if side == "A" and ("B", n) in runs)
    lines = [f"A/B: A = the defaults, B = {b_label or 'the config given'}; {len(pairs)} pair(s)",
             table(header, rows)]
    if pairs:
        pair_rows = [[f"round {n}"] + [change(get(runs[("A", n)]), get(runs[("B", n)])) for _, get in cols]
                     for n in pairs]
        lines += ["B against A, pair by pair (for rates + is B faster; for seconds - is B shorter):",
                  table(header, pair_rows)]
    lines += [f"  left out: {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=pathlib.Path, help="the A/B's output dir (A-1, B-1, ... inside)")
    parser.add_argument("--b-label", default="", help="what B is (the config's path), for the heading")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        print(f"ab_summary: {args.out} is not a directory", file=sys.stderr)
        return 2
    runs, skipped = load_runs(args.out)
    sys.stdout.write(render(runs, skipped, args.b_label))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
