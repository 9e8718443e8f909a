"""What the workers' lighter `load_inline` builds read, prepared once at setup for the worker
interpreter (kz_worker/compile/lighter_headers.py): `python scripts/prepare_lighter_builds.py OUTDIR`.

  - the names the full torch header declares: a lightened build that fails is built again as
    written only when a name it misses could come from <torch/extension.h>
    (lighter_headers.may_need_the_full_header), which needs every name the header declares: ~2.6 s of the
    preprocessor and a walk of torch's header tree;
  - main.cpp's prelude precompiled (lighter_headers.keep_main_prelude_pch): pybind11 and torch's casters,
    ~3 s of the host compiler in every build, ~1.6 s with the precompiled header (~200 MB).

The supervisor hands OUTDIR to its workers (KZ_LIGHTER_BUILDS_DIR), so even a cold batch's builds
read them. Each is named by the compiler, torch and the include paths the workers will see (CUDA_HOME
as the supervisor sets it, no CXX), so another interpreter or toolkit does without, as before.

Prints a line for each; the exit status is 0 even where one cannot be made (no compiler): the
workers then compute the names on their first failing build, and compile main.cpp's headers.
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
    out = str(pathlib.Path(out).resolve())
    try:
        from kz_worker.compile import lighter_headers
    except Exception as error:
        print(f"[setup] lighter builds not prepared ({type(error).__name__}: {error})", file=sys.stderr)
        return 0
    for what, prepare in (("the full header's names", lighter_headers.keep_full_header_names),
                          ("main.cpp's prelude, precompiled", lighter_headers.keep_main_prelude_pch)):
        try:
            print(f"[setup] for the workers' lighter builds, {what}: {prepare(out)}")
        except Exception as error:  # no compiler, no torch headers...: the workers do without
            print(f"[setup] {what} not prepared ({type(error).__name__}: {error}); workers do without",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: prepare_lighter_builds.py OUTDIR")
    raise SystemExit(main(sys.argv[1]))
