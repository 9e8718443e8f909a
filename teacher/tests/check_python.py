"""The teacher's Python, checked without the evaluator: every .py file under ROOT compiles, and every
reference named in ROOT/expected.json ({path: output shape}) imports, runs at its cpu_sizes (as the
worker applies them on the CPU) and returns that shape. Prints one line per failure; exit 1 if any.

Usage: check_python.py ROOT   (teacher/tests/render_test.cpp runs it with the worker's interpreter)
"""
import importlib.util
import json
import pathlib
import sys

import torch


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location("reference_" + path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_reference(path: pathlib.Path) -> list:
    module = load(path)
    for name, value in getattr(module, "cpu_sizes", {}).items():
        if not hasattr(module, name):
            raise AssertionError(f"cpu_sizes names {name}, which is no module-level constant")
        setattr(module, name, value)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        out = model(*module.get_inputs())
    if not torch.isfinite(out).all():
        raise AssertionError("the output is not finite")
    return list(out.shape)


def main(root: pathlib.Path) -> int:
    failures = []
    for path in sorted(root.rglob("*.py")):
        try:
            compile(path.read_text(), str(path), "exec")
        except SyntaxError as error:
            failures.append(f"{path}: {error}")
    expected = json.loads((root / "expected.json").read_text())
    for relative, shape in expected.items():
        try:
            got = run_reference(root / relative)
            if got != shape:
                failures.append(f"{relative}: output shape {got}, expected {shape}")
        except Exception as error:  # every failure is reported, not just the first
            failures.append(f"{relative}: {type(error).__name__}: {error}")
    print("\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
