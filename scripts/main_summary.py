"""The main job's summary: held-out pass@1 before and after the RL iterations of a kz evolve run,
the supervised starts' losses and each stage's seconds, printed as a table and written as JSON.

    python3 scripts/main_summary.py --run runs/main/evolve --stages runs/main/stages.tsv \
        --sft runs/sft-coder runs/sft-proposer --out runs/main/summary.json
"""
import argparse
import json
import pathlib
import sys


def read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        sys.exit(f"main_summary: {path}: {exc}")


def heldout_points(run: pathlib.Path):
    """(iteration, pass@1) of every held-out measurement of the run, in order."""
    points = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "heldout":
            points.append((row["iteration"], row.get("pass_at_1")))
    return points


def sft_summary(run: pathlib.Path):
    summary = read_json(run / "summary.json")
    keep = ("steps", "pairs", "first_loss", "last_loss", "first_eval_loss", "last_eval_loss", "seconds")
    return {key: summary[key] for key in keep if key in summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=pathlib.Path, required=True, help="the kz evolve run dir")
    parser.add_argument("--stages", type=pathlib.Path, help="stage<TAB>seconds lines")
    parser.add_argument("--sft", type=pathlib.Path, nargs="*", default=[], help="kz sft run dirs")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()

    points = heldout_points(args.run)
    if not points or points[0][0] != 0:
        sys.exit(f"main_summary: {args.run} has no held-out measurement before its first iteration "
                 "([heldout] at_start)")
    summary = {
        "heldout_pass_at_1_before": points[0][1],
        "heldout_pass_at_1_after": points[-1][1],
        "heldout_pass_at_1": [{"iteration": i, "pass_at_1": p} for i, p in points],
        "iterations": points[-1][0],
        "report": str(args.run / "report.html"),
        "sft": {run.name: sft_summary(run) for run in args.sft},
        "stage_seconds": {},
    }
    if args.stages and args.stages.exists():
        for line in args.stages.read_text().splitlines():
            name, seconds = line.split("\t")
            summary["stage_seconds"][name] = int(seconds)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")

    print()
    print(f"{'stage':<34} {'seconds':>7}")
    for name, seconds in summary["stage_seconds"].items():
        print(f"{name:<34} {seconds:>7}")
    for name, sft in summary["sft"].items():
        print(f"{name}: loss {sft.get('first_loss')} -> {sft.get('last_loss')}, "
              f"eval loss {sft.get('first_eval_loss')} -> {sft.get('last_eval_loss')}")
    print(f"held-out pass@1: {summary['heldout_pass_at_1_before']} before the RL iterations, "
          f"{summary['heldout_pass_at_1_after']} after {summary['iterations']}")
    print(f"report: {summary['report']}")
    print(f"summary: {args.out}")


if __name__ == "__main__":
    main()
