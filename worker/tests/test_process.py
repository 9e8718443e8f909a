"""How a worker process prepares (process.py), each in a fresh interpreter, as the supervisor
starts one."""
import json
import os
import pathlib
import subprocess
import sys

WORKER_DIR = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import gc, json
from kz_worker import process
process.prepare_host("cpu")
import torch
print(json.dumps({"frozen": gc.get_freeze_count(), "audit_machinery": "_dynamo" in vars(torch)}))
"""


def prepared(role=None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(WORKER_DIR), "TRITON_INTERPRET": "1"}
    env.pop("KZ_WORKER_ROLE", None)
    if role:
        env["KZ_WORKER_ROLE"] = role
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_evaluation_worker_freezes_what_it_imported_and_has_the_audit_machinery():
    state = prepared()
    assert state["audit_machinery"]
    # torch, Triton, the harness: out of the collector's way (a full collection over them: ~136 ms)
    assert state["frozen"] > 100_000, state


def test_a_build_worker_skips_the_audit_machinery_and_freezes_too():
    state = prepared("build")
    assert not state["audit_machinery"], state
    assert state["frozen"] > 50_000, state
