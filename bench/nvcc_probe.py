#!/usr/bin/env python3
"""nvcc against kz-nvcc on one `cuda` candidate's build, alone and N side by side.

    PYTHONPATH=worker python3 bench/nvcc_probe.py --out OUTDIR [--copies 1,10] [--rounds 2]

Builds suite/examples/cuda/07_softmax.py once through kz's load_inline (its lighter build, with
nvcc itself), then compiles that build's cuda.cu with the flags load_inline's ninja gave it: with
nvcc and with kz-nvcc (build/eval/kz-nvcc), alternating, N copies at once. Prints wall seconds per
wave and whether every kz-nvcc object is nvcc's byte for byte; kz-nvcc's own report (host and device
chains' seconds, whether it ran them at once) is OUTDIR/kz-nvcc.jsonl.
"""
import argparse
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def lighter_build(ext_dir: pathlib.Path) -> pathlib.Path:
    """The 07_softmax example's build directory, made by kz's load_inline with nvcc itself."""
    script = ("import importlib.util, sys\n"
              "from kz_worker import formats\n"
              "formats._count_extension_builds()\n"
              "spec = importlib.util.spec_from_file_location('cand', sys.argv[1])\n"
              "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir), PYTHONPATH=str(ROOT / "worker"))
    env.pop("PYTORCH_NVCC", None)
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # the H200's, as torch would take it from the device
    env.setdefault("KZ_LIGHTER_BUILDS_DIR", str(ROOT / "build" / "lighter-builds"))
    subprocess.run([sys.executable, "-c", script, str(ROOT / "suite/examples/cuda/07_softmax.py")],
                   env=env, check=True)
    return next(p.parent for p in ext_dir.glob("*/cuda.cu"))


def cuda_flags(build: pathlib.Path) -> list:
    text = (build / "build.ninja").read_text()
    return shlex.split(re.search(r"^cuda_cflags = (.*)$", text, re.M)[1])


def wave(tool: str, flags: list, build: pathlib.Path, out: pathlib.Path, copies: int, env: dict, keep: bool) -> float:
    """Wall seconds of `copies` compiles at once. With `keep`, nvcc's intermediates go to a dir of
    their own (--keep): its temporary names otherwise reach the object, which then differs run to run."""
    def command(i):
        kept = ["--keep", "--keep-dir", str(out / f"keep{i}")] if keep else []
        if keep:
            (out / f"keep{i}").mkdir()
        return [tool, "-MD", "-MF", str(out / f"{i}.d"), *flags, "-c", "cuda.cu", "-o", str(out / f"{i}.o"), *kept]
    started = time.monotonic()
    procs = [subprocess.Popen(command(i), cwd=build, env=env) for i in range(copies)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"{tool} failed")
    return time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--copies", default="1,10")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tool", default=str(ROOT / "build" / "eval" / "kz-nvcc"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="nvcc-probe-"))
    build = lighter_build(work / "ext")
    flags = cuda_flags(build)
    from torch.utils import cpp_extension
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    env = dict(os.environ, KZ_REAL_NVCC=nvcc, KZ_NVCC_REPORT=str(args.out / "kz-nvcc.jsonl"))
    rows, identical = [], True
    for copies in (int(c) for c in args.copies.split(",")):
        for round_ in range(args.rounds):
            walls = {}
            for name, tool in (("nvcc", nvcc), ("kz-nvcc", args.tool)):
                out = work / f"{name}-{copies}-{round_}"
                out.mkdir()
                walls[name] = wave(tool, flags, build, out, copies, env, keep=name == "nvcc")
            for i in range(copies):
                same = ((work / f"nvcc-{copies}-{round_}" / f"{i}.o").read_bytes()
                        == (work / f"kz-nvcc-{copies}-{round_}" / f"{i}.o").read_bytes())
                identical &= same
            rows.append({"copies": copies, "round": round_ + 1, **{f"{k}_s": round(v, 2) for k, v in walls.items()}})
            print(f"{copies:3d} at once, round {round_ + 1}: nvcc {walls['nvcc']:.2f} s, kz-nvcc {walls['kz-nvcc']:.2f} s,"
                  f" ratio {walls['nvcc'] / walls['kz-nvcc']:.2f}x", flush=True)
    reports = [json.loads(line) for line in (args.out / "kz-nvcc.jsonl").read_text().splitlines()]
    ran_at_once = sum(1 for r in reports if r.get("parallel") and r.get("module_ids_agree"))
    print(f"objects identical to nvcc's: {identical}; kz-nvcc ran both chains at once in {ran_at_once} of {len(reports)}")
    (args.out / "nvcc-probe.json").write_text(json.dumps({"rows": rows, "identical": identical,
                                                          "ran_at_once": ran_at_once, "compiles": len(reports)}))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
