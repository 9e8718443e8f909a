"""The names the full torch header declares, for the worker interpreter, computed once at setup.

Run by scripts/setup.sh with the interpreter the evaluation workers use: `python
scripts/index_header_names.py OUTDIR`. A lightened `load_inline` build that fails is built again as
written only when a name it misses could come from <torch/extension.h>
(kz_worker.formats.may_need_the_full_header), and that test needs every name the header declares:
~2.6 s of the preprocessor and a walk of torch's header tree. Computed here, the supervisor hands
OUTDIR to its workers (KZ_HEADER_NAMES_DIR), so even a cold batch's first failing build reads it.
The file is named by the compiler, torch and the include paths the workers will see (CUDA_HOME as
the supervisor sets it, no CXX), so another interpreter or toolkit computes its own as before.

Prints one line; the exit status is 0 even where the names cannot be computed (no compiler): the
workers then compute them on their first failing build, as without this step.
"""
import os
import pathlib
import sys


def main(out: str) -> int:
    # As worker_client.cpp sets up a worker's environment: CUDA_HOME, else /usr/local/cuda; no CXX.
    if "CUDA_HOME" not in os.environ and os.path.isdir("/usr/local/cuda"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    os.environ.pop("CXX", None)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    try:
        from kz_worker import formats
        path = formats.keep_full_header_names(str(pathlib.Path(out).resolve()))
    except Exception as error:  # no compiler, no torch headers...: the workers compute it themselves
        print(f"[setup] the full header's names were not indexed ({type(error).__name__}: {error}); "
              "workers will compute them on their first failing build", file=sys.stderr)
        return 0
    print(f"[setup] the full header's names for the workers' lighter builds: {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: index_header_names.py OUTDIR")
    raise SystemExit(main(sys.argv[1]))
