#!/usr/bin/env python3
"""Writes the fixed evaluation batch of the throughput benchmark (bench/kernelbench_compare.py).

    python3 bench/make_eval_batch.py OUTDIR [--formats cuda,cuda-rtc,triton]

OUTDIR/candidates/<task-id>/<format>__<kind>.py   one candidate each (`kz eval-suite --candidates`
                                                  takes this layout; formats are auto-detected)
OUTDIR/manifest.jsonl                             one line per candidate: id, task, format, kind,
                                                  expected kz status on a GPU, paths

The batch is the bundled examples (suite/examples/<format>) plus broken variants of them made by
suite/candidate_variants.py: wrong result, wrong shape, Python syntax error, kernel compile error,
exception in forward, no ModelNew. Every candidate's kernel source carries its own id as a comment,
so no two candidates share a compiled artefact. The output is the same bytes on every run.
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "suite"))
from candidate_variants import EXPECTED, FORMATS, make_variant  # noqa: E402

# (format, task, kind), in the order KernelBench's side takes `cuda` candidates under --kb-limit:
# correct and broken ones alternate so that any prefix is a mix.
# `cuda` candidates are only on tasks whose reference has no parameters: KernelBench's harness
# does not copy the reference's weights into ModelNew (kz does), so on the others our examples
# would be wrong for it. 07_softmax has two `cuda` samples (same extension name, other sources),
# as a group of samples of one task has.
BATCH = [
    ("cuda", "01_add_mul", "correct"),
    ("cuda", "07_softmax", "wrong_result"),
    ("cuda", "07_softmax", "correct"),
    ("cuda", "08_log_softmax", "kernel_compile_error"),
    ("cuda", "14_maxpool2d", "correct"),
    ("cuda", "04_silu", "python_syntax"),
    ("cuda", "15_avgpool2d", "correct"),
    ("cuda", "20_mse_loss", "runtime_error"),
    ("cuda", "19_scale_residual_gelu", "correct"),
    ("cuda", "02_relu", "wrong_shape"),
    ("cuda-rtc", "01_add_mul", "correct"),
    ("cuda-rtc", "03_gelu", "wrong_result"),
    ("cuda-rtc", "07_softmax", "correct"),
    ("cuda-rtc", "05_sum_dim1", "kernel_compile_error"),
    ("cuda-rtc", "10_rmsnorm", "correct"),
    ("cuda-rtc", "06_amax_lastdim", "python_syntax"),
    ("cuda-rtc", "12_linear", "correct"),
    ("cuda-rtc", "16_linear_relu", "runtime_error"),
    ("cuda-rtc", "14_maxpool2d", "correct"),
    ("cuda-rtc", "09_layernorm", "wrong_shape"),
    ("cuda-rtc", "19_scale_residual_gelu", "correct"),
    ("cuda-rtc", "20_mse_loss", "no_model_new"),
    ("triton", "02_relu", "correct"),
    ("triton", "04_silu", "wrong_result"),
    ("triton", "08_log_softmax", "correct"),
    ("triton", "17_conv2d_relu_bias", "kernel_compile_error"),
    ("triton", "11_matmul", "correct"),
    ("triton", "10_rmsnorm", "python_syntax"),
    ("triton", "15_avgpool2d", "correct"),
    ("triton", "05_sum_dim1", "runtime_error"),
    ("triton", "18_add_layernorm", "correct"),
    ("triton", "13_conv2d", "wrong_shape"),
    ("triton", "20_mse_loss", "correct"),
    ("triton", "12_linear", "no_model_new"),
]


def reference_paths(suite: pathlib.Path) -> dict:
    return {p.stem: p for p in sorted(suite.rglob("*.py"))}


def candidate_entry(fmt, task, kind, references, examples, root, salt="") -> tuple:
    """(manifest row, source) for one batch entry. `salt` makes other bytes (other builds)."""
    cid = f"{task}/{fmt}__{kind}"
    source = make_variant((examples / fmt / f"{task}.py").read_text(), kind, fmt, salt=f"{cid} {salt}".strip())
    row = {"id": cid, "task": task, "format": fmt, "kind": kind, "expected": EXPECTED[kind],
           "path": f"candidates/{cid}.py", "reference": _relative(references[task], root),
           "example": _relative(examples / fmt / f"{task}.py", root)}
    return row, source


def _relative(path: pathlib.Path, root: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def write_batch(out: pathlib.Path, formats=FORMATS, suite=ROOT / "suite" / "kzbench",
                examples=ROOT / "suite" / "examples", salt="") -> list:
    """Writes the batch (only `formats`) into `out`; returns the manifest rows. A `salt` gives the
    same batch in other bytes (bench/service_batch.py: a second round with nothing compiled yet)."""
    references = reference_paths(suite)
    rows = []
    for fmt, task, kind in BATCH:
        if fmt not in formats:
            continue
        row, source = candidate_entry(fmt, task, kind, references, examples, ROOT, salt)
        path = out / row["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        rows.append(row)
    (out / "manifest.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return rows


def read_manifest(out: pathlib.Path) -> list:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]


def describe(rows) -> str:
    """A short count table: format x expected status."""
    statuses = sorted({r["expected"] for r in rows})
    lines = ["format    " + "".join(f"{s:>15}" for s in statuses) + "      all"]
    for fmt in FORMATS:
        mine = [r for r in rows if r["format"] == fmt]
        if mine:
            counts = "".join(f"{sum(r['expected'] == s for r in mine):>15}" for s in statuses)
            lines.append(f"{fmt:<10}{counts}{len(mine):>9}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="output directory (created; existing candidates replaced)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of " + ",".join(FORMATS))
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}")
    if (args.out / "candidates").exists():
        import shutil
        shutil.rmtree(args.out / "candidates")  # a stale candidate would join the batch
    rows = write_batch(args.out, formats)
    print(f"{len(rows)} candidates in {args.out / 'candidates'}, manifest {args.out / 'manifest.jsonl'}")
    print(describe(rows))


if __name__ == "__main__":
    main()
