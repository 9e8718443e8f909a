"""The Proposer's module validator (kz_worker/validate.py), run as the supervisor runs it: a real
`python -m kz_worker` process with the JSON request on stdin and the messages read from fd 3.

One module per rule: a good gelu+matmul module passes; randomness in forward, an ignored input, a
constant or NaN output, a requested API that never runs, a syntax error and a runtime over the
CPU maximum are each rejected by the check that names them.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

WORKER_DIR = pathlib.Path(__file__).resolve().parents[1]
GELU = {"name": "torch.nn.functional.gelu", "aten": ["gelu", "gelu_"]}
MATMUL = {"name": "torch.matmul", "aten": ["mm", "bmm", "mv", "dot"]}

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""
FOOTER = """
batch = 64
k = 128
n = 96
cpu_sizes = {"batch": 8, "k": 32}

def get_inputs():
    return [torch.randn(batch, k)]

def get_init_inputs():
    return [k, n]
"""
GOOD_FORWARD = """
class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)

    def forward(self, x):
        return F.gelu(torch.matmul(x, self.weight))
"""


def module(forward_class: str, footer: str = FOOTER) -> str:
    return HEADER + textwrap.dedent(forward_class) + footer


def run_worker(request: dict, timeout: float = 300) -> list:
    """Starts the worker with a pipe as its fd 3; returns every message it sent."""
    read_end, write_end = os.pipe()
    messages = []
    reader = threading.Thread(target=lambda: messages.extend(_read_lines(read_end)))
    reader.start()
    env = dict(os.environ, PYTHONPATH=str(WORKER_DIR))
    try:
        subprocess.run([sys.executable, "-m", "kz_worker"], input=json.dumps(request).encode(), env=env,
                       capture_output=True, timeout=timeout, pass_fds=(3,),
                       preexec_fn=lambda: os.dup2(write_end, 3))
    finally:
        os.close(write_end)
        reader.join(timeout=30)
    return messages


def _read_lines(fd: int) -> list:
    with os.fdopen(fd, "r") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def validate(source: str, apis=(GELU, MATMUL), **overrides) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        request = {"mode": "validate_module", "module_source": source, "apis": list(apis), "device": "cpu",
                   "seed": 42, "scratch_dir": scratch, "time_band_ms": [0.05, 50.0], "cpu_max_ms": 10_000,
                   "timing_runs": 3}
        request.update(overrides)
        messages = run_worker(request)
    assert messages and messages[-1]["type"] == "result", messages
    assert all(m["type"] == "stage" for m in messages[:-1])
    return messages[-1]


def rejected_by(result: dict, check: str) -> str:
    assert result["valid"] is False, result
    assert result["failed_check"] == check, result["reason"]
    assert result["checks"][check] is False
    return result["reason"]


def test_good_gelu_matmul_module_is_valid():
    result = validate(module(GOOD_FORWARD))
    assert result["valid"] is True, result["reason"]
    assert all(result["checks"][name] for name in
               ("loads", "runs", "deterministic", "outputs", "uses_inputs", "apis", "runtime"))
    assert {"gelu", "mm"} <= set(result["aten_ops"])
    assert result["aten_ops"] == sorted(set(result["aten_ops"]))
    assert result["output_shapes"] == [[8, 96]]  # cpu_sizes applied on the CPU
    assert result["runtime_ms"] > 0
    assert len(result["fingerprint"]) == 32


def test_fingerprint_ignores_names_but_not_ops():
    renamed = GOOD_FORWARD.replace("self.weight", "self.w").replace("(x, ", "(inp, ").replace("(self, x)", "(self, inp)")
    first, second = validate(module(GOOD_FORWARD)), validate(module(renamed))
    assert second["valid"], second["reason"]
    assert first["fingerprint"] == second["fingerprint"]
    other = validate(module(GOOD_FORWARD.replace("F.gelu", "F.silu")), apis=[MATMUL])
    assert other["valid"], other["reason"]
    assert other["fingerprint"] != first["fingerprint"]


def test_random_op_in_forward_is_rejected():
    source = module(GOOD_FORWARD.replace("return F.gelu(torch.matmul(x, self.weight))",
                                         "return F.gelu(torch.matmul(x, self.weight)) + torch.rand(1)"))
    assert "different outputs" in rejected_by(validate(source), "deterministic")


def test_output_independent_of_an_input_is_rejected():
    source = module(GOOD_FORWARD.replace("def forward(self, x):", "def forward(self, x, y):"),
                    FOOTER.replace("return [torch.randn(batch, k)]", "return [torch.randn(batch, k), torch.randn(batch, k)]"))
    reason = rejected_by(validate(source), "uses_inputs")
    assert "input 1 (8, 32)" in reason


def test_constant_output_is_rejected():
    source = module(GOOD_FORWARD.replace("return F.gelu(torch.matmul(x, self.weight))",
                                         "return torch.zeros_like(F.gelu(torch.matmul(x, self.weight))) + 3.0"))
    assert "constant" in rejected_by(validate(source), "outputs")


def test_nan_output_is_rejected():
    source = module(GOOD_FORWARD.replace("return F.gelu(torch.matmul(x, self.weight))",
                                         "return torch.log(F.gelu(torch.matmul(x, self.weight)) - 100.0)"))
    assert "NaN/Inf" in rejected_by(validate(source), "outputs")


def test_requested_api_not_executed_is_rejected_and_named():
    source = module(GOOD_FORWARD.replace("F.gelu", "F.relu"))
    result = validate(source)
    reason = rejected_by(result, "apis")
    assert "torch.nn.functional.gelu" in reason and "torch.matmul" not in reason.split(";")[0]
    assert result["details"]["missing_apis"] == ["torch.nn.functional.gelu"]
    assert "relu" in result["aten_ops"]


def test_syntax_error_is_rejected():
    source = module(GOOD_FORWARD.replace("def forward(self, x):", "def forward(self, x)"))
    assert "not valid Python" in rejected_by(validate(source), "loads")


def test_missing_get_inputs_is_rejected():
    source = module(GOOD_FORWARD, FOOTER.replace("def get_inputs():", "def make_inputs():"))
    assert "get_inputs" in rejected_by(validate(source), "loads")


def test_forward_exception_is_rejected():
    source = module(GOOD_FORWARD.replace("torch.matmul(x, self.weight)", "torch.matmul(self.weight, x)"))
    assert "forward failed" in rejected_by(validate(source), "runs")


def test_runtime_over_the_cpu_maximum_is_rejected():
    result = validate(module(GOOD_FORWARD), cpu_max_ms=1e-6)
    assert "above the maximum" in rejected_by(result, "runtime")
    assert result["runtime_ms"] > 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_cuda_time_band():
    low = validate(module(GOOD_FORWARD), device="cuda:0", time_band_ms=[1000.0, 2000.0])
    assert "below the band's minimum" in rejected_by(low, "runtime")
    ok = validate(module(GOOD_FORWARD), device="cuda:0", time_band_ms=[0.0, 1000.0])
    assert ok["valid"], ok["reason"]
    assert ok["output_shapes"] == [[64, 96]]  # GPU sizes


def test_non_tensor_output_is_rejected_not_crashed():
    source = module(GOOD_FORWARD.replace("return F.gelu(torch.matmul(x, self.weight))",
                                         "return {'y': F.gelu(torch.matmul(x, self.weight))}"))
    assert "is a dict, not a torch.Tensor" in rejected_by(validate(source), "outputs")


def test_a_missing_gpu_lock_file_is_no_verdict_on_the_module(monkeypatch):
    # The machine's fault (the supervisor's lock files missing): reported as infra_error, which the
    # supervisor turns into an error, never a rejected module (curriculum/src/validation.cpp).
    sys.path.insert(0, str(WORKER_DIR))
    from kz_worker import gpu_lock
    from kz_worker import validate as validate_py

    def missing(request, device):
        raise gpu_lock.LockFileMissing("GPU lock file /x/gpu-aaaa.lock is missing")

    monkeypatch.setattr(validate_py.gpu_lock, "for_request", missing)
    result = validate_py.validate_module({"module_source": module(GOOD_FORWARD), "apis": [GELU], "device": "cpu",
                                          "scratch_dir": "/tmp"}, channel=None)
    assert result == {"valid": False, "infra_error": "GPU lock file /x/gpu-aaaa.lock is missing"}
