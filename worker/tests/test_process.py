"""How a worker process prepares (process.py), each in a fresh interpreter, as the supervisor
starts one."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

WORKER_DIR = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import gc, json, sys
from kz_worker import fork_server, process
process.prepare_host("cpu")
import torch
print(json.dumps({"frozen": gc.get_freeze_count(), "dynamo_imported": "torch._dynamo" in sys.modules,
                  "manual_seed_wrapped": torch.manual_seed is not torch.random.manual_seed,
                  "load_inline_module": "torch.utils.cpp_extension" in sys.modules,
                  "forks_refuse_cuda": fork_server.forks_refuse_cuda(torch)}))
"""


def run_probe(source: str, role=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(WORKER_DIR), "TRITON_INTERPRET": "1"}
    env.pop("KZ_WORKER_ROLE", None)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # torch's default question, the one that poisons fork
    if role:
        env["KZ_WORKER_ROLE"] = role
    return subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=300)


def prepared(role=None) -> dict:
    done = run_probe(PROBE, role)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_evaluation_worker_freezes_what_it_imported_and_leaves_torch_as_dynamo_would():
    state = prepared()
    # torch.manual_seed as an import of torch._dynamo leaves it, without that import (~0.8 s of CPU)
    assert state["manual_seed_wrapped"] and not state["dynamo_imported"], state
    # torch, Triton, the harness: out of the collector's way (a full collection over them: ~136 ms)
    assert state["frozen"] > 100_000, state


def test_a_build_worker_skips_the_audit_machinery_and_freezes_too():
    state = prepared("build")
    assert not state["manual_seed_wrapped"] and not state["dynamo_imported"], state
    assert state["frozen"] > 50_000, state


LATE_DYNAMO = """
import json, sys
from kz_worker import cheats, process
process.prepare_host("cpu")
import torch
guard = cheats.Guard("triton")
with cheats.OpTrace() as trace:  # what an evaluation runs after the snapshot
    torch.ones(3).relu()
torch.manual_seed(1)
from torch.autograd.profiler import profile
with profile(use_kineto=True):
    torch.ones(3).relu()
imported_by_the_harness = "torch._dynamo" in sys.modules
import torch._dynamo  # as a candidate's torch.library or torch.compile does
@torch.library.custom_op("kz_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
twice(torch.ones(2))
torch.manual_seed(2)
print(json.dumps({"imported_by_the_harness": imported_by_the_harness, "changes": guard.changes(restore=False),
                  "ops": dict(trace.ops)}))
"""


def test_torch_dynamo_imported_after_the_snapshot_changes_nothing_the_guard_watches():
    # The zygote no longer imports torch._dynamo (cheats.wrap_manual_seed_as_dynamo_would): the audit's
    # dispatch mode, seeding and the profiler must not import it in every evaluation, and a candidate
    # or reference that imports it later must not look like a patched harness.
    done = run_probe(LATE_DYNAMO)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert not state["imported_by_the_harness"], state
    assert state["changes"] == [], state
    assert state["ops"].get("aten::relu") == 1, state  # the dispatch mode still sees every op


def test_load_inlines_module_is_imported_and_forks_can_still_use_cuda():
    # Every `cuda` child imports torch.utils.cpp_extension; a fork server's children inherit it. Its
    # import asks CUDA for its devices unless guarded, and then torch refuses CUDA in every fork.
    for role in (None, "build"):
        state = prepared(role)
        assert state["load_inline_module"], state
        assert not state["forks_refuse_cuda"], state


def test_an_unguarded_import_of_load_inlines_module_would_poison_forks():
    # What import_load_inline_module guards against, and what forks_refuse_cuda sees.
    done = run_probe("import torch, torch.utils.cpp_extension\n"
                     "from kz_worker import fork_server\n"
                     "print(fork_server.forks_refuse_cuda(torch))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "True", done.stdout


def test_a_fork_server_refuses_to_serve_where_forks_would_refuse_cuda():
    done = run_probe("import torch\n"
                     "torch.cuda.is_available()  # cudaGetDeviceCount: torch marks every later fork as bad\n"
                     "from kz_worker import fork_server\n"
                     "fork_server.refuse_if_fork_unsafe()\n"
                     "print('served')")
    assert done.returncode != 0 and "served" not in done.stdout
    assert "asked CUDA for its devices" in done.stderr, done.stderr


EARLY_CONTEXT_PROBE = """
import ctypes, json
from kz_worker import process
early = process.EarlyContext(%r)
startup = process.prepare_fresh(%r, early)
state = {"startup": startup, "error": early.error, "started": early.thread.ident is not None}
import torch
if torch.cuda.is_available() and early.error is None:
    driver = ctypes.CDLL("libcuda.so.1")
    current = ctypes.c_void_p()
    driver.cuCtxGetCurrent(ctypes.byref(current))
    state["same_context"] = current.value == early.context.value  # torch took the thread's primary context
    state["sum"] = float(torch.ones(4, device="cuda:0").sum())
print(json.dumps(state))
"""


def test_a_process_of_its_own_on_the_cpu_makes_no_early_context():
    done = run_probe(EARLY_CONTEXT_PROBE % ("cpu", "cpu"))
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert not state["started"] and state["error"] is None
    assert state["startup"]["imports"] > 0 and state["startup"]["device"] >= 0
    assert "early_context" not in state["startup"]


def test_the_early_context_is_the_one_torch_then_uses_or_its_failure_is_left_to_torch():
    # On a GPU the thread's primary context is current once torch made its own; without one (CI) the
    # thread's failure is recorded, and prepare_device's own context step fails as it would have.
    done = run_probe(EARLY_CONTEXT_PROBE % ("cuda:0", "cuda:0"))
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert state["started"]
    if state["error"] is None:
        assert state["same_context"] and state["sum"] == 4.0, state
        assert state["startup"]["early_context"] > 0 and "device_context" in state["startup"]
    else:
        assert "libcuda" in state["error"] or "CUresult" in state["error"], state


def test_a_cuda_ordinal_is_read_as_torch_reads_the_device():
    sys.path.insert(0, str(WORKER_DIR))
    from kz_worker import process
    assert process._cuda_ordinal("cuda") == 0 and process._cuda_ordinal("cuda:3") == 3
    assert process._cuda_ordinal("cpu") is None


ON_THE_GPU = """
import json, os, torch
from kz_worker import harness, process
os.environ["KZ_CHECK_KERNELS_WHILE_AWAITED"] = "0"
process.prepare_host("cuda:0")
process.prepare_device("cuda:0", request_waiting=lambda: True)
steps = sorted(process.device_steps_s)
harness.load_check_kernels(torch.device("cuda:0"))  # what the request's checks then load at first use
print(json.dumps({"steps": steps}))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_suite.sh checks)")
def test_an_awaited_gpu_worker_skips_the_check_kernels_where_configured():
    done = run_probe(SKIPPED_ON_THE_GPU)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"steps": ["clock", "context", "launch_gate"]}


ON_THE_GPU = """
import json, sys
from kz_worker import cheats, process
process.prepare_host("cuda:0")
process.prepare_device("cuda:0")
import torch
a = torch.ones(64, 64, device="cuda")
(a @ a).sum().item()  # the reference's work (a cuBLAS GEMM) comes first, as in load_reference
cheats.warm_up(torch.device("cuda:0"))  # then a profiled request's warm-up (cheats.profiles_audit)
x = torch.randn(1 << 20, device="cuda")
_, kernels, why_no_list = cheats._profiled_kernels(lambda: torch.relu(x))
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "inductor": "torch._inductor" in sys.modules,
                  "why_no_list": why_no_list, "kernels": len(kernels), "steps": sorted(process.device_steps_s),
                  "warm_up_listed_kernels": cheats._state.profiler_worked}))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_suite.sh checks)")
def test_a_prepared_gpu_worker_profiles_kernels_without_importing_torch_dynamo():
    # The device part too (the CUDA context, then a profiled request's warm-up) and a profiled forward leave
    # torch._dynamo and torch._inductor out: torch.profiler.profile's start would import both.
    done = run_probe(ON_THE_GPU)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert state == {"dynamo": False, "inductor": False, "why_no_list": None, "kernels": 1,
                     "steps": ["clock", "context", "kernels", "launch_gate"], "warm_up_listed_kernels": True}, state
