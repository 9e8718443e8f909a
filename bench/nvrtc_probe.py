"""NVRTC alone on the bundled `cuda-rtc` examples: the seconds kz_rtc's compile of each example's
SOURCE takes on this machine's CPU, with the options an evaluation uses (the target architecture and
the toolkit's include dir), outside any worker or batch. Needs libnvrtc, no GPU. Set against the
`compile` stage of a batch's `cuda-rtc` verdicts, it says how much of that stage is NVRTC and how much
is waiting for the CPU.

    python3 bench/nvrtc_probe.py [--examples suite/examples/cuda-rtc] [--arch sm_90] [--repeat 3]

Each example keeps its CUDA source in a module-level SOURCE string (the examples' convention); one
without it is an error, not a skip.
"""
import argparse
import ast
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "worker"))

import kz_rtc  # noqa: E402
from kz_rtc import _nvrtc  # noqa: E402


def example_source(path: pathlib.Path) -> str:
    """The module-level SOURCE string constant of a candidate file."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SOURCE" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    raise SystemExit(f"{path}: no module-level SOURCE string")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=pathlib.Path, default=ROOT / "suite" / "examples" / "cuda-rtc")
    p.add_argument("--arch", default="sm_90", help="the --gpu-architecture an H100/H200 evaluation compiles for")
    p.add_argument("--repeat", type=int, default=3, help="compiles per example; the median is printed")
    args = p.parse_args()
    options = [f"--gpu-architecture={args.arch}", *(f"-I{d}" for d in kz_rtc.default_include_dirs())]
    _nvrtc.load_library()
    library = pathlib.Path(_nvrtc._lib_path)
    shown = library.relative_to(ROOT) if library.is_relative_to(ROOT) else library  # no machine paths in results
    print(f"libnvrtc: {shown}; options: {' '.join(options)}")
    medians = []
    for path in sorted(args.examples.glob("*.py")):
        source, seconds = example_source(path), []
        for _ in range(args.repeat):
            started = time.perf_counter()
            _nvrtc.compile_to_cubin(source, path.stem, options)
            seconds.append(time.perf_counter() - started)
        medians.append(statistics.median(seconds))
        print(f"{path.stem:<24} {medians[-1]:6.3f} s  (of {args.repeat}: {min(seconds):.3f}-{max(seconds):.3f})")
    print(f"{len(medians)} examples: median {statistics.median(medians):.3f} s, "
          f"{min(medians):.3f}-{max(medians):.3f} s, {sum(medians):.2f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
