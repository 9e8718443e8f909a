"""Where a `kz evolve` run's time went: one line per iteration with its seconds by stage
(generate, evaluate, train) summed over the iteration's phases, the evaluations spent, the Coder's
reward and correct rate and the held-out pass@1, then the run's totals.

Usage: evolve_summary.py RUN_DIR [RUN_DIR ...]   (reads RUN_DIR/metrics.jsonl)
"""
import json
import pathlib
import sys


def rows(run_dir: pathlib.Path):
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def show(value, fmt="{:.3f}"):
    return "-" if value is None else fmt.format(value)


def summarize(run_dir: pathlib.Path) -> str:
    by_iteration = {}
    for row in rows(run_dir):
        it = by_iteration.setdefault(row["iteration"], {"generate": 0.0, "evaluate": 0.0, "train": 0.0})
        for stage, seconds in row.get("seconds", {}).items():
            it[stage] += seconds
        it["evaluations"] = row.get("evaluations")
        if row["phase"] == "coder":
            it["reward"], it["correct"] = row.get("reward_mean"), row.get("correct_rate")
        if row["phase"] == "heldout":
            it["pass_at_1"] = row.get("pass_at_1")
    lines = [f"{run_dir}",
             f"{'iteration':>9} {'generate s':>10} {'evaluate s':>10} {'train s':>8} {'evals':>6} "
             f"{'reward':>7} {'correct':>7} {'pass@1':>7}"]
    total = {"generate": 0.0, "evaluate": 0.0, "train": 0.0}
    for i, it in sorted(by_iteration.items()):
        for stage in total:
            total[stage] += it[stage]
        lines.append(f"{i:>9} {it['generate']:>10.1f} {it['evaluate']:>10.1f} {it['train']:>8.1f} "
                     f"{show(it.get('evaluations'), '{}'):>6} {show(it.get('reward')):>7} "
                     f"{show(it.get('correct')):>7} {show(it.get('pass_at_1')):>7}")
    lines.append(f"{'total':>9} {total['generate']:>10.1f} {total['evaluate']:>10.1f} {total['train']:>8.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(summarize(pathlib.Path(d)) for d in sys.argv[1:]))
