#!/usr/bin/env python3
"""Extracts KernelBench generations (the runs/ folder of KernelBench's own scripts) into a folder
for bench/kernelbench_agreement.py, with a manifest; bench/fetch-kb-samples.sh calls it.

    python3 bench/kb_samples.py --source CHECKOUT --repo OWNER/NAME --commit SHA \
        --kernelbench .kb/KernelBench --out .kb-samples

A run folder (runs/<run>/) holds `level_<L>_problem_<P>_sample_<S>_kernel.py` files and
eval_results.json, KernelBench's verdicts for them ({problem: sample or [samples]}, each with
`compiled`, `correctness`, `metadata.hardware`). Kept: samples with a `ModelNew` that builds CUDA
through load_inline, whose problem exists in the KernelBench checkout. Written:

  OUT/kernels/<run>/<file>       the sample, unchanged
  OUT/manifest.jsonl             one line per sample: id, level, problem_id, problem (the
                                 reference's stem), reference (its path in the KernelBench
                                 checkout), kernel (its path under OUT), recorded (KernelBench's
                                 verdict in the source run: class, hardware), source (repo, commit,
                                 path)

The manifest's order is the evaluation order: runs and recorded classes (correct, incorrect,
compile_error) interleaved, each group in a fixed pseudo-random order (by the sample's hash), so
that its first N samples mix levels, models and outcomes for any N.
"""
import argparse
import hashlib
import json
import pathlib
import re
import shutil
import sys

RUNS = ("gemini_level1_run", "gemini_level2_run", "qwencoder_level1_run", "qwencoder_level2_run", "qwen3_level1_run")
CLASSES = ("correct", "incorrect", "compile_error")
SAMPLE_FILE = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


def recorded_class(result: dict) -> str:
    if not result.get("compiled"):
        return "compile_error"
    return "correct" if result.get("correctness") else "incorrect"


def sample_result(results: dict, problem: int, sample: int):
    """KernelBench's verdict for one sample; None where the run has none."""
    entry = results.get(str(problem))
    for candidate in entry if isinstance(entry, list) else [entry]:
        if isinstance(candidate, dict) and int(candidate.get("sample_id", 0)) == sample:
            return candidate
    return None


def references(kernelbench: pathlib.Path) -> dict:
    """{(level, problem_id): path} of the checkout's level-1 and level-2 problems."""
    found = {}
    for level in (1, 2):
        for path in sorted((kernelbench / "KernelBench" / f"level{level}").glob("*.py")):
            number = path.stem.split("_", 1)[0]
            if number.isdigit():
                found[(level, int(number))] = path
    return found


def collect(source: pathlib.Path, kernelbench: pathlib.Path, runs=RUNS) -> tuple:
    """The eligible samples (unordered) and what was left out, with why."""
    refs = references(kernelbench)
    samples, skipped = [], []
    for run in runs:
        folder = source / "runs" / run
        results_path = folder / "eval_results.json"
        if not results_path.is_file():
            skipped.append({"run": run, "why": "no eval_results.json"})
            continue
        results = json.loads(results_path.read_text())
        for path in sorted(folder.glob("level_*_kernel.py")):
            match = SAMPLE_FILE.search(path.name)
            if not match:
                continue
            level, problem, sample = (int(g) for g in match.groups())
            text = path.read_text(errors="replace")
            result = sample_result(results, problem, sample)
            why = ("no verdict in eval_results.json" if result is None else
                   "no ModelNew" if "ModelNew" not in text else
                   "no load_inline (not a cuda sample)" if "load_inline" not in text else
                   "problem not in the KernelBench checkout" if (level, problem) not in refs else None)
            if why:
                skipped.append({"run": run, "file": path.name, "why": why})
                continue
            ref = refs[(level, problem)]
            samples.append({
                "id": f"{run}-p{problem}-s{sample}", "level": level, "problem_id": problem,
                "problem": ref.stem, "reference": str(ref.relative_to(kernelbench)),
                "kernel": f"kernels/{run}/{path.name}", "run": run,
                "recorded": {"class": recorded_class(result),
                             "hardware": (result.get("metadata") or {}).get("hardware")},
                "source": {"path": str(path.relative_to(source))},
                "sha1": hashlib.sha1(text.encode()).hexdigest(),
                "_path": path,
            })
    return samples, skipped


def interleave(samples: list, runs=RUNS) -> list:
    """Round-robin over (run, recorded class) groups, each group in order of its samples' hashes."""
    groups = {}
    for s in sorted(samples, key=lambda s: hashlib.sha1(s["id"].encode()).hexdigest()):
        groups.setdefault((s["run"], s["recorded"]["class"]), []).append(s)
    order = [(run, cls) for run in runs for cls in CLASSES]
    ordered = []
    for rank in range(max((len(g) for g in groups.values()), default=0)):
        for key in order:
            group = groups.get(key, [])
            if rank < len(group):
                ordered.append(group[rank])
    return ordered


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=pathlib.Path, required=True, help="a checkout holding runs/<run>/")
    p.add_argument("--repo", required=True, help="the source repository, owner/name (for the manifest)")
    p.add_argument("--commit", required=True, help="its commit (for the manifest)")
    p.add_argument("--kernelbench", type=pathlib.Path, required=True, help="the KernelBench checkout")
    p.add_argument("--out", type=pathlib.Path, required=True)
    args = p.parse_args(argv)
    samples, skipped = collect(args.source, args.kernelbench)
    if not samples:
        print(f"no samples found under {args.source}/runs", file=sys.stderr)
        return 1
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "kernels").mkdir(parents=True)
    lines = []
    for s in interleave(samples):
        dest = args.out / s["kernel"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(s.pop("_path"), dest)
        s["source"].update(repo=args.repo, commit=args.commit)
        lines.append(json.dumps(s, sort_keys=True))
    (args.out / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    (args.out / "skipped.json").write_text(json.dumps(skipped, indent=1) + "\n")
    by = {}
    for line in lines:
        s = json.loads(line)
        key = f"level {s['level']} {s['recorded']['class']}"
        by[key] = by.get(key, 0) + 1
    print(f"{len(lines)} samples from {args.repo}@{args.commit[:12]} in {args.out} "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))}); {len(skipped)} left out (skipped.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
