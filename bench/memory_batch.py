#!/usr/bin/env python3
"""KernelBench's largest problems on one GPU: does every evaluation fit, at the default concurrency?

    python3 bench/memory_batch.py make OUTDIR --kernelbench KB [--level1 10 --level2 2 --rtc 6]
    python3 bench/memory_batch.py report OUTDIR
    python3 bench/memory_batch.py budgets --kernelbench KB [--card-gib 79.2]

`make` picks the level-1 and level-2 problems of a KernelBench checkout (KB/KernelBench/levelN) whose
reference holds the most memory (weights, one input set and its forward's peak, on the meta device:
kz_worker.gpu_memory.estimate_on_meta) and writes two batches for `kz eval-suite`:

  OUTDIR/suite/<task>.py          the references (KernelBench's files, unchanged)
  OUTDIR/torch/<task>.py          each reference as its own candidate (`--format torch`): an honest
                                  candidate whose memory is exactly the reference's
  OUTDIR/cuda-rtc/<task>.py       hand-written cuda-rtc kernels for the elementwise problems among them

`budgets` needs no GPU: every level-1 and level-2 problem's meta estimate and the budget the harness
reserves for it (gpu_memory.budget_bytes), the largest first, against what one evaluation alone may
use on a card of --card-gib (an H100's 79.2 GiB by default, the fraction 0.9, --processes contexts).

`report` reads OUTDIR/<run>.jsonl (one eval-suite run each: `default-torch`, `default-rtc` at the
default concurrency, `alone-torch`, `alone-rtc` with --jobs 1) and OUTDIR/walls.txt (`<run> <seconds>`),
and prints per task: the status of each run, the reference's peak, the budget reserved, the measured
peak and the wait for memory; then the out-of-memory verdicts (the goal: none), and the wall time of
the batch at the default concurrency against one at a time. It writes OUTDIR/memory.json.
"""
import argparse
import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Elementwise level-1 problems and the CUDA expression of each (x: the input element, a float).
ELEMENTWISE = {
    "19_ReLU": "x > 0.f ? x : (x != x ? x : 0.f)",
    "21_Sigmoid": "1.f / (1.f + expf(-x))",
    "22_Tanh": "tanhf(x)",
    "25_Swish": "x / (1.f + expf(-x))",
    "26_GELU_": "0.5f * x * (1.f + erff(x * 0.70710678118654752f))",
    "30_Softsign": "x / (1.f + fabsf(x))",
}

RTC_TEMPLATE = '''"""cuda-rtc candidate for {task} (KernelBench level 1): one elementwise pass."""
import torch
import torch.nn as nn

import kz_rtc

SOURCE = r"""
extern "C" __global__ void op_kernel(const float* __restrict__ in, float* __restrict__ out, long long n) {{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        const float x = in[i];
        out[i] = {expression};
    }}
}}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = kz_rtc.compile(SOURCE, name="{task}")

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        if n:
            blocks = min((n + 255) // 256, 132 * 32)
            self.kernels.op_kernel(x, y, n, grid=(blocks,), block=(256,))
        return y
'''


def footprint(path: pathlib.Path):
    sys.path.insert(0, str(ROOT / "worker"))
    from kz_worker import gpu_memory, loading
    spec = importlib.util.spec_from_file_location(f"kb_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reference = loading.Reference(module, {})
    return gpu_memory.estimate_on_meta(reference, reference.init_inputs(), seed=0)


def budgets(args) -> None:
    sys.path.insert(0, str(ROOT / "worker"))
    from kz_worker import gpu_memory
    capacity = gpu_memory.capacity_bytes(int(args.card_gib * 2**30), 0.9, args.processes)
    rows, failed = [], []
    for level in ("level1", "level2"):
        for path in sorted((pathlib.Path(args.kernelbench) / "KernelBench" / level).glob("*.py")):
            try:
                fp = footprint(path)
            except Exception as exc:
                failed.append(f"{level}/{path.name} ({type(exc).__name__})")
                continue
            sets = gpu_memory.timing_sets(4, fp.inputs)
            rows.append((gpu_memory.budget_bytes(fp, sets), fp.reference_peak, f"{level}/{path.stem}"))
    rows.sort(reverse=True)
    gib = 2**30
    print(f"{len(rows)} problems estimated; capacity alone on a {args.card_gib:g} GiB card: {capacity / gib:.1f} GiB")
    print(f"{'problem':50s} {'reference GiB':>13s} {'budget GiB':>10s} {'budget/ref':>10s}")
    for budget, peak, name in rows[:args.top]:
        print(f"{name[:50]:50s} {peak / gib:13.2f} {budget / gib:10.2f} {budget / max(peak, 1):10.2f}")
    over = [name for budget, _, name in rows if budget > capacity]
    print(f"over the capacity: {len(over)} {over}")
    print(f"no meta estimate (measured on the GPU instead): {len(failed)} {failed}")


def largest(level_dir: pathlib.Path, count: int) -> list:
    sized = []
    for path in sorted(level_dir.glob("*.py")):
        try:
            sized.append((footprint(path).reference_peak, path))
        except Exception as exc:  # no meta estimate: the harness measures it; not picked here
            print(f"  {path.name}: no meta estimate ({type(exc).__name__})", file=sys.stderr)
    return [path for _, path in sorted(sized, key=lambda x: -x[0])[:count]]


def make(args) -> None:
    out = pathlib.Path(args.outdir)
    levels = pathlib.Path(args.kernelbench) / "KernelBench"
    picked = largest(levels / "level1", args.level1) + largest(levels / "level2", args.level2)
    for folder in ("suite", "torch", "cuda-rtc"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for path in picked:
        (out / "suite" / path.name).write_text(path.read_text())
        (out / "torch" / path.name).write_text(path.read_text())
    for task, expression in list(ELEMENTWISE.items())[:args.rtc]:
        source = levels / "level1" / f"{task}.py"
        if source.exists():
            (out / "suite" / source.name).write_text(source.read_text())
            (out / "cuda-rtc" / source.name).write_text(RTC_TEMPLATE.format(task=task, expression=expression))
    print(f"{len(picked)} references as candidates, {len(list((out / 'cuda-rtc').glob('*.py')))} cuda-rtc kernels")


def read_runs(out: pathlib.Path) -> dict:
    runs = {}
    for path in sorted(out.glob("*.jsonl")):
        runs[path.stem] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def is_out_of_memory(verdict: dict) -> bool:
    checks = set(verdict.get("checks") or [])
    text = (verdict.get("message") or "").lower()
    return bool(checks & {"out_of_memory_shared", "exceeds_gpu_memory", "memory_limit"}) or "out of memory" in text


def report(args) -> None:
    out = pathlib.Path(args.outdir)
    runs = read_runs(out)
    walls = {}
    if (out / "walls.txt").exists():
        for line in (out / "walls.txt").read_text().splitlines():
            name, seconds = line.split()
            walls[name] = float(seconds)
    names = sorted(runs)
    tasks = sorted({v["task_id"] for verdicts in runs.values() for v in verdicts})
    mib = (lambda x: f"{x / 1024:6.1f}" if isinstance(x, (int, float)) else "     -")
    print(f"{'task':42s} " + " ".join(f"{n:>14s}" for n in names) + "   ref GiB budget GiB peak GiB  wait s")
    rows = []
    for task in tasks:
        by_run = {n: next((v for v in runs[n] if v["task_id"] == task), None) for n in names}
        first = next((v for v in by_run.values() if v and v.get("memory")), None)
        memory = (first or {}).get("memory", {})
        statuses = {n: (v["status"] if v else "-") for n, v in by_run.items()}
        waits = [v.get("memory", {}).get("wait_s", 0) or 0 for v in by_run.values() if v]
        print(f"{task[:42]:42s} " + " ".join(f"{statuses[n]:>14s}" for n in names)
              + f"   {mib(memory.get('reference_peak_mb'))}     {mib(memory.get('budget_mb'))}   "
              f"{mib(memory.get('peak_mb'))}  {max(waits, default=0):6.1f}")
        rows.append({"task": task, "statuses": statuses, "memory": memory,
                     "retried_alone": {n: bool(v and v.get("retried_alone")) for n, v in by_run.items()}})
    oom = {n: [v["task_id"] for v in runs[n] if is_out_of_memory(v)] for n in names}
    print("\nout-of-memory verdicts: " + ", ".join(f"{n} {len(t)}" for n, t in oom.items()))
    for n, t in oom.items():
        if t:
            print(f"  {n}: {', '.join(t)}")
    retried = {n: sum(1 for v in runs[n] if v.get("retried_alone")) for n in names}
    print("retried alone: " + ", ".join(f"{n} {c}" for n, c in retried.items()))
    default = sum(s for n, s in walls.items() if n.startswith("default"))
    alone = sum(s for n, s in walls.items() if n.startswith("alone"))
    if default and alone:
        print(f"wall: default concurrency {default:.1f} s, one at a time {alone:.1f} s ({alone / default:.2f}x)")
    summary = {"runs": names, "walls_s": walls, "out_of_memory": oom, "retried_alone": retried, "tasks": rows,
               "statuses": {n: {s: sum(1 for v in runs[n] if v['status'] == s) for s in {v['status'] for v in runs[n]}}
                            for n in names}}
    (out / "memory.json").write_text(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("outdir")
    m.add_argument("--kernelbench", default=str(ROOT / ".kb" / "KernelBench"))
    m.add_argument("--level1", type=int, default=10)
    m.add_argument("--level2", type=int, default=2)
    m.add_argument("--rtc", type=int, default=len(ELEMENTWISE), help="cuda-rtc kernels, at most %(default)s")
    r = sub.add_parser("report")
    r.add_argument("outdir")
    b = sub.add_parser("budgets")
    b.add_argument("--kernelbench", default=str(ROOT / ".kb" / "KernelBench"))
    b.add_argument("--card-gib", type=float, default=79.2)
    b.add_argument("--top", type=int, default=12)
    b.add_argument("--processes", type=int, default=10, help="CUDA contexts on the card (8 jobs, 2 spares)")
    args = parser.parse_args()
    {"make": make, "report": report, "budgets": budgets}[args.command](args)


if __name__ == "__main__":
    main()
