"""scripts/compile_worker_bytecode.py: bytecode in a PYTHONPYCACHEPREFIX tree for an interpreter whose
packages carry none, which the workers then import from (the supervisor passes the prefix)."""
import importlib.util
import os
import pathlib
import py_compile
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("compile_worker_bytecode", ROOT / "scripts" / "compile_worker_bytecode.py")
bytecode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bytecode)


def package(root: pathlib.Path, value: int) -> pathlib.Path:
    (root / "kz_probe_pkg").mkdir(parents=True, exist_ok=True)
    (root / "kz_probe_pkg" / "__init__.py").write_text(f"VALUE = {value}\n")
    return root / "kz_probe_pkg" / "__init__.py"


def imported_value(root: pathlib.Path, prefix=None) -> str:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if prefix:
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    done = subprocess.run([sys.executable, "-c", "import kz_probe_pkg; print(kz_probe_pkg.VALUE)"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_a_package_without_bytecode_is_told_apart(tmp_path, monkeypatch):
    source = package(tmp_path, 1)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not bytecode.has_own_bytecode("kz_probe_pkg")
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert bytecode.has_own_bytecode("kz_probe_pkg")


def test_workers_import_the_compiled_bytecode_from_the_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "")  # compile_into sets both; restored after the test
    source = package(tmp_path / "site", 1)
    stat = source.stat()
    assert bytecode.compile_into(tmp_path / "prefix", [str(tmp_path / "site")])
    # The same size and modification time, other code: only an import that reads the bytecode
    # (valid by its timestamp) still sees VALUE = 1.
    source.write_text("VALUE = 2\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert imported_value(tmp_path / "site", prefix=tmp_path / "prefix") == "1"
    assert imported_value(tmp_path / "site") == "2"
    assert not (tmp_path / "site" / "kz_probe_pkg" / "__pycache__").exists(), "nothing written beside the sources"


def test_an_interpreter_with_its_own_bytecode_gets_no_prefix(tmp_path):
    if not bytecode.has_own_bytecode("torch"):
        import pytest
        pytest.skip("this interpreter's torch has no bytecode of its own")
    stale = tmp_path / "prefix"
    (stale / "x").mkdir(parents=True)
    (stale / bytecode.MARKER).write_text("old\n")
    assert bytecode.main(str(stale)) == 0
    assert not stale.exists(), "a prefix would hide the packages' own __pycache__"
