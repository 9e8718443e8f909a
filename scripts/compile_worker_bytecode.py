"""Bytecode for the worker interpreter, where its installation has none.

Run by scripts/setup.sh with the interpreter the evaluation workers use: `python
scripts/compile_worker_bytecode.py OUTDIR`. Some installations carry no .pyc files and run with
PYTHONDONTWRITEBYTECODE=1 (the GPU host's torch): every process then compiles torch's Python
sources again as it imports them, ~6.5 s for torch and torch._dynamo there, every fork server,
build and fresh worker alike. Where torch has no bytecode, this compiles the interpreter's whole
sys.path (standard library, site-packages) and kz_worker into OUTDIR, a PYTHONPYCACHEPREFIX tree
that the supervisor hands to its workers (worker_client.cpp), which only read it: they never write
bytecode, and the sandbox keeps OUTDIR read-only for them. Where torch has its own bytecode, OUTDIR
is removed: a prefix makes Python ignore every __pycache__ directory, so it would only cost.

Prints one line saying which (and a warning where some sources did not compile, which imports skip
too); the exit status is 0 either way.
"""
import compileall
import importlib.util
import os
import pathlib
import shutil
import sys
import warnings

MARKER = ".kz-complete"  # written last: a prefix without it is never used


def has_own_bytecode(module: str) -> bool:
    """Whether the installed `module` (its __init__) has a .pyc beside its source."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True  # nothing to speed up
    cached = importlib.util.cache_from_source(spec.origin)  # ignores any prefix when none is set
    return pathlib.Path(cached).exists()


def installation(roots: list) -> str:
    """What the bytecode was compiled from: the interpreter, and each root's modification time (a
    package installed, upgraded or removed changes its site-packages directory). Python checks each
    .pyc against its source anyway; this only decides whether setup compiles again."""
    lines = [f"{sys.executable} {sys.version}"] + [f"{root} {os.stat(root).st_mtime_ns}" for root in roots]
    return "\n".join(lines) + "\n"


def compile_into(prefix: pathlib.Path, roots: list) -> bool:
    """Compiles every source under `roots` into the prefix tree (in parallel: each worker process
    takes the prefix from the environment)."""
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    # Old syntax in packages' test data ("is" with a literal...): compiled all the same, unheard.
    warnings.simplefilter("ignore", SyntaxWarning)
    os.environ["PYTHONWARNINGS"] = "ignore::SyntaxWarning"
    ok = True
    for root in roots:
        ok &= bool(compileall.compile_dir(root, quiet=2, workers=0, legacy=False))
    return ok


def main(out: str) -> int:
    prefix = pathlib.Path(out).resolve()
    if has_own_bytecode("torch"):
        shutil.rmtree(prefix, ignore_errors=True)
        print(f"[setup] the worker interpreter's packages carry their own bytecode: no prefix ({sys.executable})")
        return 0
    roots = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(str(prefix))]
    roots.append(str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    identity = installation(roots)
    if (prefix / MARKER).exists() and (prefix / MARKER).read_text() == identity:
        print(f"[setup] worker bytecode up to date in {prefix}")
        return 0
    shutil.rmtree(prefix, ignore_errors=True)
    ok = compile_into(prefix, roots)
    if not ok:
        # Files Python cannot compile (tests of syntax errors in packages' own test suites, say)
        # are skipped by the import system too: the prefix serves for the rest.
        print("[setup] some sources did not compile (skipped, as imports would)", file=sys.stderr)
    (prefix / MARKER).write_text(identity)
    print(f"[setup] compiled the worker interpreter's bytecode into {prefix} (it had none)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
