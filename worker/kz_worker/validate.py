"""Validates a module written by the Proposer (request "mode": "validate_module").

A proposed module becomes a reference task only if it is a usable target for the Coder: it
loads, builds and runs; it is deterministic (two forwards on the same inputs, and a second model
built from the same seed, give bitwise-identical outputs); its outputs are finite, non-degenerate
tensors; it depends on every floating-point input; its forward really executes the PyTorch APIs it
was asked to use (checked on the ATen ops a TorchDispatchMode records, "any of" each API's
catalogue list); and its runtime is in a band (on CUDA: enough work to time, not too slow; on the
CPU only a maximum). The checks run in that order and the first one that fails is the verdict.

Request: module_source, apis ([{name, aten}]), device, seed, scratch_dir, time_band_ms [min, max]
(CUDA), cpu_max_ms (CPU), timing_runs, use_cpu_sizes. Result (one message):
  {"type": "result", "valid", "reason", "failed_check", "checks": {check: bool}, "details",
   "aten_ops", "output_shapes", "runtime_ms", "fingerprint"}
Each check announces a stage first, so the supervisor's per-stage deadlines apply.
"""
import collections
import hashlib
import json
import pathlib
import statistics
import time

import torch

from . import correctness, gpu_lock, loading, syntax_check
from . import verdict as v
from .cheats import AuditMode

CHECKS = ("loads", "runs", "deterministic", "outputs", "uses_inputs", "apis", "runtime")
# The stage each check runs in (the supervisor's deadlines are per stage).
STAGE_CHECKS = {"load": "loads", "build": "runs", "determinism": "deterministic", "outputs": "outputs",
                "inputs": "uses_inputs", "apis": "apis", "runtime": "runtime"}
DEGENERATE_REL_STD = 1e-6   # std / mean|x| below this: the output carries no information


class Reject(Exception):
    """The module fails `check`; `reason` says why in words a person (and the Proposer) can act on."""

    def __init__(self, check: str, reason: str):
        super().__init__(reason)
        self.check = check
        self.reason = reason


class OpRecorder(AuditMode):
    """Records the ATen op (overload packet name, e.g. "mm") of every call that reaches dispatch."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(op_name(func))
        return func(*args, **(kwargs or {}))


def op_name(func) -> str:
    name = func._overloadpacket.__name__
    name = name[len("aten."):] if name.startswith("aten.") else name
    return name.split(".")[0]


def reject_sandbox_violations(result: dict) -> None:
    """A module that tried what the sandbox refuses (or records) is invalid, whatever else it did."""
    from . import sandbox
    if not sandbox.violations():
        return
    result.update(valid=False, failed_check="sandbox", reason=f"sandbox: {sandbox.summary()}")
    result.setdefault("checks", {})["sandbox"] = False


def validate_module(request: dict, channel) -> dict:
    """Runs every check; never raises for a bad module (the verdict says why). A machine that cannot
    run it (its GPU lock file missing) gives {"infra_error": why}: no verdict on the module."""
    try:
        run = Validation(request, channel)
    except gpu_lock.LockFileMissing as exc:
        return {"valid": False, "infra_error": str(exc)}
    try:
        run.check_all()
        run.result.update(valid=True, reason="valid")
    except Reject as rejected:
        run.reject(rejected)
    except Exception as exc:  # the module broke something the checks did not expect
        run.reject(Reject(STAGE_CHECKS.get(run.stage, "runs"), "unexpected error:\n" + v.describe_exception(exc)))
    run.result["checks"] = run.checks
    run.result["stage"] = run.stage
    return run.result


class Validation:
    def __init__(self, request: dict, channel):
        self.request = request
        self.channel = channel
        self.device = torch.device(request["device"])
        self.seed = int(request.get("seed", 1234))
        self.scratch = pathlib.Path(request["scratch_dir"])
        self.stage = "start"
        self.checks = {}
        self.result = {"valid": False, "reason": "", "failed_check": "", "details": {}, "aten_ops": [],
                       "output_shapes": [], "runtime_ms": None, "fingerprint": ""}
        # Evaluations may share the GPU: the module's GPU work holds the lock shared, its timed
        # runs exclusive, so neither disturbs the other's timings.
        self.gpu = gpu_lock.for_request(request, self.device)

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.channel.stage(stage)

    def passed(self, check: str) -> None:
        self.checks[check] = True

    def reject(self, rejected: Reject) -> None:
        self.checks[rejected.check] = False
        self.result.update(valid=False, reason=f"{rejected.check}: {rejected.reason}", failed_check=rejected.check)

    def check_all(self) -> None:
        reference = self.check_loads()
        with self.gpu.shared():
            model, inputs, output = self.check_runs(reference)
            self.check_deterministic(reference, model, inputs, output)
            self.check_outputs(output)
            self.check_uses_inputs(reference, model, inputs, output)
            ops = self.check_apis(model, inputs)
        self.check_runtime(model, inputs)
        self.result["fingerprint"] = fingerprint(ops, self.result["output_shapes"])

    # -- loads ------------------------------------------------------------------------------
    def check_loads(self) -> loading.Reference:
        self.enter("load")
        source = self.request["module_source"]
        error = syntax_check.syntax_error(source, "module.py")  # as the supervisor's check before any worker
        if error is not None:
            raise Reject("loads", f"not valid Python: {error}")
        on_cpu = self.device.type == "cpu"
        try:
            # The module is a reference-to-be: load it exactly as the evaluation will.
            reference = loading.load_reference(source, self.scratch, on_cpu and self.request.get("use_cpu_sizes", True),
                                               {})
        except v.Failure as failure:
            raise Reject("loads", failure.message.replace("reference module", "module"))
        if not isinstance(reference.module.Model, type) or not issubclass(reference.module.Model, torch.nn.Module):
            raise Reject("loads", "`Model` is not an nn.Module subclass")
        self.passed("loads")
        return reference

    # -- builds and runs -----------------------------------------------------------------------
    def check_runs(self, reference):
        self.enter("build")
        model = self.build(reference)
        inputs = self.inputs(reference, self.seed + 1)
        output = self.forward(model, inputs)
        self.passed("runs")
        return model, inputs, output

    def build(self, reference):
        try:
            return reference.build(reference.init_inputs(), self.seed, self.device)
        except Exception as exc:
            raise Reject("runs", "Model(*get_init_inputs()) failed:\n" + v.describe_exception(exc))

    def inputs(self, reference, seed: int):
        try:
            inputs = reference.inputs(seed, self.device)
        except Exception as exc:
            raise Reject("runs", "get_inputs() failed:\n" + v.describe_exception(exc))
        if not inputs:
            raise Reject("runs", "get_inputs() returned no inputs")
        return inputs

    def forward(self, model, inputs):
        try:
            with torch.no_grad():
                output = model(*loading.clone_all(inputs))
            correctness.synchronize(self.device)
            return output
        except Exception as exc:
            raise Reject("runs", "forward failed:\n" + v.describe_exception(exc))

    # -- deterministic -------------------------------------------------------------------------
    def check_deterministic(self, reference, model, inputs, output) -> None:
        self.enter("determinism")
        if not all(isinstance(t, torch.Tensor) for t in correctness.flatten(output)):
            return  # not comparable bit for bit: the outputs check rejects it with the real reason
        # A different RNG state before the repeat: random ops in forward draw different values.
        torch.random.manual_seed(self.seed + 7_777)
        again = self.forward(model, inputs)
        if not bitwise_equal(output, again):
            raise Reject("deterministic", "two forward passes on the same inputs give different outputs "
                                          "(random ops or state changing between calls in forward?)")
        rebuilt = self.build(reference)
        if not bitwise_equal(output, self.forward(rebuilt, self.inputs(reference, self.seed + 1))):
            raise Reject("deterministic", "a second model built from the same seed, on inputs from the same seed, "
                                          "gives different outputs (randomness not drawn from torch's seeded RNG?)")
        self.passed("deterministic")

    # -- outputs -------------------------------------------------------------------------------
    def check_outputs(self, output) -> None:
        self.enter("outputs")
        tensors = correctness.flatten(output)
        if not tensors:
            raise Reject("outputs", "forward returned an empty tuple/list")
        for index, tensor in enumerate(tensors):
            what = f"output[{index}]" if isinstance(output, (tuple, list)) else "output"
            check_tensor(tensor, what)
        self.result["output_shapes"] = [list(t.shape) for t in tensors]
        self.passed("outputs")

    # -- depends on every input ----------------------------------------------------------------
    def check_uses_inputs(self, reference, model, inputs, output) -> None:
        self.enter("inputs")
        fresh = self.inputs(reference, self.seed + 99_991)
        unused = []
        for index, x in enumerate(inputs):
            if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
                continue
            changed = list(inputs)
            changed[index] = perturbed(x, fresh[index] if index < len(fresh) else None)
            if bitwise_equal(output, self.forward(model, changed)):
                unused.append(f"input {index} {tuple(x.shape)}")
        if unused:
            self.result["details"]["unused_inputs"] = unused
            raise Reject("uses_inputs", "the output does not depend on " + ", ".join(unused) +
                                        " (new random values leave it unchanged)")
        self.passed("uses_inputs")

    # -- executes the requested APIs -----------------------------------------------------------
    def check_apis(self, model, inputs) -> collections.Counter:
        self.enter("apis")
        recorder = OpRecorder()
        cloned = loading.clone_all(inputs)  # outside the recorder: only forward's own ops count
        try:
            with torch.no_grad(), recorder:
                model(*cloned)
            correctness.synchronize(self.device)
        except Exception as exc:
            raise Reject("runs", "forward failed while tracing ATen ops:\n" + v.describe_exception(exc))
        ops = collections.Counter(recorder.ops)
        self.result["aten_ops"] = sorted(ops)
        missing = [api["name"] for api in self.request.get("apis", []) if not set(api["aten"]) & ops.keys()]
        if missing:
            self.result["details"]["missing_apis"] = missing
            wanted = "; ".join(f"{api['name']} (any of {', '.join(api['aten'])})"
                               for api in self.request["apis"] if api["name"] in missing)
            raise Reject("apis", f"requested API not executed by forward: {wanted}; "
                                 f"ATen ops executed: {', '.join(sorted(ops)) or 'none'}")
        self.passed("apis")
        return ops

    # -- runtime -------------------------------------------------------------------------------
    def check_runtime(self, model, inputs) -> None:
        self.enter("runtime")
        runs = max(1, int(self.request.get("timing_runs", 5)))
        with self.gpu.shared():
            self.forward(model, inputs)  # warm-up (lazy init, cuDNN autotuning)
        with self.gpu.exclusive():  # alone on the GPU, like an evaluation's timing
            samples = [self.time_once(model, inputs) for _ in range(runs)]
        median = statistics.median(samples)
        self.result["runtime_ms"] = median
        if self.device.type == "cuda":
            low, high = self.request.get("time_band_ms", [0.0, float("inf")])
            self.result["details"]["runtime_band_ms"] = [low, high]
            if median < low:
                raise Reject("runtime", f"median forward time {median:.4f} ms is below the band's minimum {low:g} ms "
                                        "(too little work: launch overhead would dominate any kernel)")
            if median > high:
                raise Reject("runtime", f"median forward time {median:.3f} ms is above the band's maximum {high:g} ms")
        else:
            limit = float(self.request.get("cpu_max_ms", float("inf")))
            self.result["details"]["cpu_max_ms"] = limit
            if median > limit:
                raise Reject("runtime", f"median forward time {median:.3f} ms on the CPU is above the maximum "
                                        f"{limit:g} ms (shrink cpu_sizes)")
        self.passed("runtime")

    def time_once(self, model, inputs) -> float:
        inputs = loading.clone_all(inputs)
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.no_grad():
                start.record()
                model(*inputs)
                end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end)
        began = time.perf_counter()
        with torch.no_grad():
            model(*inputs)
        return (time.perf_counter() - began) * 1000.0


def check_tensor(tensor, what: str) -> None:
    """Raises Reject("outputs") for a non-tensor, empty, non-finite or degenerate output."""
    if type(tensor) is not torch.Tensor:
        raise Reject("outputs", f"{what} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.numel() == 0:
        raise Reject("outputs", f"{what} is empty (shape {tuple(tensor.shape)})")
    values = tensor.detach().abs() if tensor.is_complex() else tensor.detach()
    values = values.to("cpu", torch.float64)
    if not torch.isfinite(values).all():
        bad = int((~torch.isfinite(values)).sum())
        raise Reject("outputs", f"{what} has {bad} NaN/Inf values of {values.numel()}")
    mean_abs = float(values.abs().mean())
    if mean_abs == 0.0:
        raise Reject("outputs", f"{what} is all zeros")
    if values.numel() > 1:
        rel_std = float(values.std()) / mean_abs
        if rel_std <= DEGENERATE_REL_STD:
            raise Reject("outputs", f"{what} is constant (every element equals {float(values.flatten()[0]):g})")


def perturbed(x: torch.Tensor, fresh):
    """The input with new random values: get_inputs()'s own distribution under another seed, or
    Gaussian noise on top when get_inputs() ignores the seed (constant inputs)."""
    if isinstance(fresh, torch.Tensor) and fresh.shape == x.shape and fresh.dtype == x.dtype \
            and not bitwise_equal(fresh, x):
        return fresh.to(x.device)
    scale = float(x.abs().mean()) if x.numel() else 1.0
    return x + torch.randn_like(x) * (scale if scale > 0 else 1.0)


def bitwise_equal(a, b) -> bool:
    """Same structure, shapes, dtypes and bytes (NaN == NaN when the bits agree)."""
    a_items, b_items = correctness.flatten(a), correctness.flatten(b)
    if type(a) is not type(b) or len(a_items) != len(b_items):
        return False
    for x, y in zip(a_items, b_items):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            try:
                if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or not bool(x == y):
                    return False
            except Exception:  # e.g. dicts of tensors: not comparable, so not provably equal
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not torch.equal(as_bytes(x), as_bytes(y)):
            return False
    return True


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().contiguous().reshape(-1)
    if x.dtype == torch.bool:
        return x.to(torch.uint8)
    return x.view(torch.uint8)


def fingerprint(ops: collections.Counter, output_shapes) -> str:
    """Equal for modules that execute the same ATen ops as often and return the same shapes:
    the dedup key that survives renaming, reordering and rewriting the Python."""
    key = json.dumps({"ops": sorted(ops.items()), "shapes": output_shapes}, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:32]
