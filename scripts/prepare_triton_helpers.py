"""Triton's driver helper for the workers, built once at setup for the worker interpreter
(kz_worker.triton_helpers): `python scripts/prepare_triton_helpers.py OUTDIR`.

Prints what it did; the exit status is 0 even where it cannot build (no GPU driver here): the
workers then build the helper in each Triton evaluation, as Triton does by itself.
"""
import pathlib
import sys


def main(out: str) -> int:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    try:
        from kz_worker import triton_helpers
        print(f"[setup] Triton's driver helper, for the workers: {triton_helpers.prepare(out)}")
    except Exception as error:  # no libcuda (a CPU machine), no triton, no compiler
        print(f"[setup] Triton's driver helper not prepared ({type(error).__name__}: {str(error).splitlines()[0]}); "
              "Triton evaluations build it themselves", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: prepare_triton_helpers.py OUTDIR")
    raise SystemExit(main(sys.argv[1]))
