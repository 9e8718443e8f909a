#!/usr/bin/env python3
"""The learning experiment's table and curves (bench/learn.sh; bench/README.md "Learning").

    bench/learn_summary.py RUNS_DIR --out OUTDIR

RUNS_DIR holds `kz evolve` runs named ABLATION-SEED (ca_grpo-1, static-2, ...). For each run, from
its metrics.jsonl and provenance.jsonl, at every held-out point (iteration 0 is the supervised
start): the training evaluations spent so far (the judge's and the Coder phase's), held-out pass@1,
fast_1 and the geomean speedup of the correct kernels, and the share of fused kernels (one
`__global__` function) among the correct ones of multi-op modules. For the frontier runs, the
Proposer's p-hat (the judge's pass rate of each valid module) per iteration: the share of modules
inside the band, at 0 and at 1. Writes OUTDIR/learn.json (every series), OUTDIR/learn.html (the
curves, self-contained SVG) and prints the table: each run's start and end, then each ablation's
mean over its seeds, then every run's training dynamics per iteration: the Proposer phase's valid
share, frontier size and mean p-hat; the Coder phase's correct rate, entropy, approximate KL, clip
fraction, zero-variance groups and gate-on share (the metrics.jsonl rows of each phase).
"""
import argparse
import html
import json
import pathlib
import statistics
import sys
import tomllib

ORDER = ["ca_grpo", "ungated", "correctness_only", "static"]
COLOURS = {"ca_grpo": "#1f77b4", "ungated": "#d62728", "correctness_only": "#2ca02c", "static": "#9467bd"}


def read_jsonl(path: pathlib.Path) -> list:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill; the checkpoint's resume rewrites it
            pass
    return rows


def kernel_count(run: pathlib.Path, row: dict):
    """`__global__` functions of a logged kernel's source, or None without a file."""
    if not row.get("file"):
        return None
    path = run / row["file"]
    return path.read_text(errors="replace").count("__global__") if path.exists() else None


def multi_op_tasks(heldout_suite: pathlib.Path) -> set:
    """Task ids of the held-out suite's level-2 modules (more than one op: fusion is possible)."""
    return {p.stem for p in (heldout_suite / "level2").glob("*.py")} if heldout_suite.is_dir() else set()


def heldout_points(run: pathlib.Path, provenance: list, multi_op: set) -> list:
    metrics = read_jsonl(run / "metrics.jsonl")
    kernels = [r for r in provenance if r.get("kind") == "kernel" and r["phase"] == "heldout"]
    points = []
    for row in metrics:
        if row["phase"] != "heldout":
            continue
        i = row["iteration"]
        fused = total = 0
        for k in kernels:
            if k["iteration"] != i or not k.get("correct") or k["task_id"] not in multi_op:
                continue
            count = kernel_count(run, k)
            if count:
                total += 1
                fused += count == 1
        points.append({"iteration": i,
                       "training_evaluations": row.get("training_evaluations", 0),
                       "pass_at_1": row.get("pass_at_1"), "fast_1": row.get("fast_1"),
                       "geomean_speedup": row.get("geomean_speedup"),
                       "fused_share": fused / total if total else None, "correct_multi_op": total})
    return points


def proposer_bands(provenance: list, low: float, high: float) -> list:
    by_iteration = {}
    for r in provenance:
        if r.get("kind") == "module" and r.get("pass_rate") is not None:
            by_iteration.setdefault(r["iteration"], []).append(r["pass_rate"])
    out = []
    for i, rates in sorted(by_iteration.items()):
        n = len(rates)
        out.append({"iteration": i, "judged": n,
                    "in_band": sum(low <= p <= high for p in rates) / n,
                    "at_0": sum(p == 0 for p in rates) / n, "at_1": sum(p == 1 for p in rates) / n,
                    "mean": statistics.mean(rates)})
    return out


PHASE_KEYS = {"proposer": ("valid_rate", "frontier_size", "judged", "joined_frontier", "pass_rate_mean"),
              "coder": ("correct_rate", "entropy", "kl", "clip_fraction", "zero_variance_groups", "gate_on_share",
                        "optimizer_steps")}


def phase_rows(run: pathlib.Path) -> list:
    """The Proposer's and the Coder's metrics.jsonl rows, each cut to the keys learn.json keeps."""
    out = []
    for row in read_jsonl(run / "metrics.jsonl"):
        keys = PHASE_KEYS.get(row.get("phase"))
        if keys:
            out.append({"iteration": row["iteration"], "phase": row["phase"],
                        "training_evaluations": row.get("training_evaluations", 0),
                        **{k: row.get(k) for k in keys}})
    return out


def dynamics(runs: dict) -> str:
    """Per run and iteration: its Proposer phase, its Coder phase and its held-out point."""
    lines = ["per iteration: Proposer valid share, frontier size, mean p-hat of the judged | Coder correct "
             "rate, entropy, approx KL, clip fraction, zero-variance groups, gate-on share | held-out pass@1; "
             "training evaluations so far"]
    for name, run in runs.items():
        heldout = {p["iteration"]: p for p in run["heldout"]}

        def heldout_line(i):
            p = heldout[i]
            return (f"{name:<20} it {i:>3} heldout  pass@1 {fmt(p['pass_at_1'])} fast_1 {fmt(p['fast_1'])} "
                    f"geomean {fmt(p['geomean_speedup'], '{:.2f}x')} evals {p['training_evaluations']}")
        if 0 in heldout:  # the supervised start
            lines.append(heldout_line(0))
        for row in run["phases"]:
            i = row["iteration"]
            if row["phase"] == "proposer":
                detail = (f"proposer valid {fmt(row['valid_rate'], '{:.2f}')} frontier {fmt(row['frontier_size'], '{}')} "
                          f"p-hat {fmt(row['pass_rate_mean'], '{:.2f}')}")
            else:
                detail = (f"coder    correct {fmt(row['correct_rate'], '{:.3f}')} entropy {fmt(row['entropy'], '{:.4f}')} "
                          f"kl {fmt(row['kl'], '{:.5f}')} clip {fmt(row['clip_fraction'], '{:.4f}')} "
                          f"zero-var {fmt(row['zero_variance_groups'], '{}')} gate-on {fmt(row['gate_on_share'], '{:.2f}')}")
            lines.append(f"{name:<20} it {i:>3} {detail} evals {row['training_evaluations']}")
            if row["phase"] == "coder" and i in heldout:
                lines.append(heldout_line(i))
    return "\n".join(lines)


def fmt(value, spec="{:.3f}"):
    return "-" if value is None else spec.format(value)


def table(runs: dict) -> str:
    head = (f"{'run':<20} {'iters':>5} {'train evals':>11} {'pass@1 start':>12} {'pass@1 end':>10} "
            f"{'fast_1 end':>10} {'geomean end':>11} {'fused end':>9} {'p-hat in band':>13}")
    lines = [head, "-" * len(head)]
    for name, run in runs.items():
        pts = run["heldout"]
        if not pts:
            lines.append(f"{name:<20} (no held-out point yet)")
            continue
        start, end = pts[0], pts[-1]
        band = run["proposer"]
        in_band = statistics.mean(b["in_band"] for b in band) if band else None
        lines.append(f"{name:<20} {end['iteration']:>5} {end['training_evaluations']:>11} "
                     f"{fmt(start['pass_at_1']):>12} {fmt(end['pass_at_1']):>10} {fmt(end['fast_1']):>10} "
                     f"{fmt(end['geomean_speedup'], '{:.2f}x'):>11} {fmt(end['fused_share'], '{:.2f}'):>9} "
                     f"{fmt(in_band, '{:.2f}'):>13}")
    lines.append("")
    lines.append(f"{'ablation (mean of seeds)':<26} {'runs':>4} {'pass@1 start':>12} {'pass@1 end':>10} "
                 f"{'fast_1 end':>10} {'geomean end':>11}")
    for ablation in ORDER:
        ends = [r["heldout"] for n, r in runs.items() if r["ablation"] == ablation and r["heldout"]]
        if not ends:
            continue
        mean = lambda key, at: (statistics.mean(v) if (v := [p[at][key] for p in ends if p[at][key] is not None])
                                else None)
        lines.append(f"{ablation:<26} {len(ends):>4} {fmt(mean('pass_at_1', 0)):>12} {fmt(mean('pass_at_1', -1)):>10} "
                     f"{fmt(mean('fast_1', -1)):>10} {fmt(mean('geomean_speedup', -1), '{:.2f}x'):>11}")
    return "\n".join(lines)


def svg_chart(title: str, series: list, x_label: str, y_label: str) -> str:
    """series: [(label, colour, dashed, [(x, y), ...])] as one SVG line chart."""
    w, h, left, bottom, top, right = 520, 300, 56, 40, 28, 16
    points = [p for _, _, _, ps in series for p in ps if p[1] is not None]
    if not points:
        return f"<p>{html.escape(title)}: no data yet</p>"
    x_max = max(p[0] for p in points) or 1
    y_min = min(0.0, min(p[1] for p in points))
    y_max = max(p[1] for p in points)
    y_max = 1.0 if y_max <= 1.0 and y_min >= 0 else y_max * 1.05
    sx = lambda x: left + (w - left - right) * x / x_max
    sy = lambda y: h - bottom - (h - bottom - top) * (y - y_min) / ((y_max - y_min) or 1)
    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#444"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#444"/>',
           f'<text x="{(w + left) / 2}" y="{h - 8}" text-anchor="middle">{html.escape(x_label)}</text>',
           f'<text x="14" y="{(h - bottom + top) / 2}" transform="rotate(-90 14 {(h - bottom + top) / 2})" '
           f'text-anchor="middle">{html.escape(y_label)}</text>']
    for k in range(5):
        y = y_min + (y_max - y_min) * k / 4
        x = x_max * k / 4
        out.append(f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        out.append(f'<text x="{sx(x):.1f}" y="{h - bottom + 14}" text-anchor="middle">{x:.0f}</text>')
    for label, colour, dashed, ps in series:
        ps = [p for p in ps if p[1] is not None]
        if not ps:
            continue
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash}>'
                   f'<title>{html.escape(label)}</title></polyline>')
    for n, (label, colour, dashed, _) in enumerate(series):
        y = top + 4 + 13 * n
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        out.append(f'<line x1="{w - 150}" y1="{y}" x2="{w - 130}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{w - 126}" y="{y + 4}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def page(runs: dict, text: str) -> str:
    first_seed = min(r["seed"] for r in runs.values())

    def line(name, run, points):  # svg_chart's series: colour by ablation, later seeds dashed
        return name, COLOURS.get(run["ablation"], "#555"), run["seed"] != first_seed, points

    def series(key):
        return [line(name, run, [(p["training_evaluations"], p[key]) for p in run["heldout"]])
                for name, run in runs.items()]
    charts = [svg_chart("held-out pass@1", series("pass_at_1"), "training evaluations", "pass@1"),
              svg_chart("held-out fast_1", series("fast_1"), "training evaluations", "fast_1"),
              svg_chart("held-out geomean speedup (correct kernels)", series("geomean_speedup"),
                        "training evaluations", "speedup"),
              svg_chart("fused share among correct multi-op kernels", series("fused_share"),
                        "training evaluations", "share"),
              svg_chart("Coder phase: correct rate of its samples",
                        [line(name, r, [(p["training_evaluations"], p["correct_rate"])
                                        for p in r["phases"] if p["phase"] == "coder"]) for name, r in runs.items()],
                        "training evaluations", "correct rate")]
    bands = [line(name, r, [(b["iteration"], b["in_band"]) for b in r["proposer"]])
             for name, r in runs.items() if r["proposer"]]
    charts.append(svg_chart("Proposer: share of judged modules with p-hat in the band", bands, "iteration", "share"))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>kz learning experiment</title></head>"
            "<body style='font-family:sans-serif'><h1>Learning experiment</h1>"
            f"<pre>{html.escape(text)}</pre><div style='display:flex;flex-wrap:wrap;gap:12px'>"
            + "".join(f"<div>{c}</div>" for c in charts) + "</div></body></html>\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    runs = {}
    for run in sorted(p for p in args.runs_dir.iterdir() if (p / "metrics.jsonl").exists()):
        ablation, _, seed = run.name.rpartition("-")
        if not ablation or not seed.isdigit():
            continue
        config = tomllib.loads((run / "config.toml").read_text())  # the run's resolved config, every key
        provenance = read_jsonl(run / "provenance.jsonl")
        multi_op = multi_op_tasks(pathlib.Path(config["heldout"]["suite"]))
        runs[run.name] = {"ablation": ablation, "seed": int(seed),
                          "heldout": heldout_points(run, provenance, multi_op),
                          "proposer": proposer_bands(provenance, config["frontier"]["band_low"],
                                                     config["frontier"]["band_high"]),
                          "phases": phase_rows(run)}
    if not runs:
        print(f"no runs under {args.runs_dir}", file=sys.stderr)
        return 1
    runs = dict(sorted(runs.items(), key=lambda kv: (ORDER.index(kv[1]["ablation"]) if kv[1]["ablation"] in ORDER
                                                     else len(ORDER), kv[1]["seed"])))
    text = table(runs) + "\n\n" + dynamics(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learn.json").write_text(json.dumps(runs, indent=1) + "\n")
    (args.out / "learn.html").write_text(page(runs, text))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
