"""Anti-cheating checks that run inside the worker (the static ones run in the supervisor, before any
worker: eval/src/static_checks.cpp). docs/evaluation.md describes them all; in short:

  harness_patched           torch, torch.Tensor, torch.cuda, time, builtins, the harness's own modules,
                            kz_rtc's counters or the reference module changed by the candidate (identity
                            snapshot taken before the candidate is imported, compared after import,
                            construction and every forward, then restored); a TorchFunctionMode or
                            TorchDispatchMode left active; trace/profile hooks, global nn.Module hooks,
                            gc callbacks, signal handlers or timers installed; torch's TF32/default
                            dtype settings changed.
  reference_tampered        the live reference run differs from the reference output computed before
                            the candidate was imported (torch rebound below Python, weights changed...).
  torch_compute_in_forward  an ATen op outside the format's policy (POLICY below) traced with a
                            TorchDispatchMode during one extra forward.
  no_custom_kernel          that forward launched no kernel of the candidate's own (kz_rtc / Triton
                            launch counters; on a GPU, the profiler's kernel list for `cuda`).
  no_kernel_effect          policy kernelbench: the forward replayed with the candidate's own launches
                            muted gives the same output (a decoy kernel beside PyTorch compute).
  low_custom_kernel_share   the candidate's kernels' share of the audit's GPU time is below the
                            policy's min_custom_kernel_share.
  background_thread         more Python threads after candidate code ran than before it was imported.
  output_aliases_reference  an output sharing memory with a reference output.
  replayed_output           bitwise the same output for two input sets whose references differ
                            (caching by shape or by pointer, replaying an earlier result).
  wrong_during_timing       a sampled timed output is wrong (timing.py calls back after each run; the
                            harness compares its copies after the exclusive hold).

Format `torch` (baselines: the reference timed as its own candidate) is exempt from the trace and
the kernel checks. Everything here is in-process: a candidate that runs arbitrary Python in the
same process can in principle defeat any of it; docs/evaluation.md lists the holes that remain.
"""
import _thread
import builtins
import collections
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import operator
import os
import re
import signal
import statistics
import sys
import threading
import time
import traceback
import types

import torch
import torch.nn.functional
import torch.nn.modules.module as nn_module
import torch.overrides
import torch.utils._python_dispatch as python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from . import correctness, fingerprint, gpu_lock, sandbox
from . import verdict as v

# ---- the ATen policy of ModelNew.forward, per format ------------------------------------------------
#
# Overload-packet names in the `aten` namespace that a kernel format's forward may run: allocation,
# initialisation (zero/fill, for atomic accumulators and -inf/+inf starts), views and metadata,
# copies and dtype/device/layout conversion (.contiguous(), .to(), .float()), and scalar reads. Any
# other ATen op (arithmetic, reductions, matmul, conv, activations, indexing, cat/stack, pad,
# random) is the computation the kernel should do: torch_compute_in_forward. Ops of other
# namespaces (custom torch.library ops, whose insides the trace cannot see) fire it too, except
# the profiler's record_function markers.
ALLOCATION_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "scalar_tensor", "lift_fresh", "lift_fresh_copy", "arange", "resize_", "resize_as_",
})
INITIALISATION_OPS = frozenset({"fill_", "zero_"})
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "as_strided", "t", "transpose", "permute",
    "expand", "expand_as", "unsqueeze", "squeeze", "unsqueeze_", "squeeze_", "t_", "transpose_", "select", "slice",
    "narrow", "split", "split_with_sizes", "unbind", "chunk", "unflatten", "flatten", "alias", "detach",
    "detach_", "unfold", "diagonal", "movedim", "view_as_real", "view_as_complex", "_conj", "_neg_view",
})
COPY_OPS = frozenset({"clone", "contiguous", "copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize",
                      "_pin_memory"})
METADATA_OPS = frozenset({"_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type",
                          "record_stream", "is_pinned", "sym_size", "sym_stride", "sym_numel",
                          "sym_storage_offset", "size", "stride", "numel", "dim", "is_contiguous"})
KERNEL_FORMAT_ALLOWED = ALLOCATION_OPS | INITIALISATION_OPS | VIEW_OPS | COPY_OPS | METADATA_OPS
ALLOWED_NAMESPACES = frozenset({"profiler"})

# format -> the ATen ops its forward may run (None: exempt, no trace and no kernel requirement).
POLICY = {
    "cuda": KERNEL_FORMAT_ALLOWED,
    "cuda-rtc": KERNEL_FORMAT_ALLOWED,
    "triton": KERNEL_FORMAT_ALLOWED,
    "torch": None,
}


# ---- the policies: what ModelNew.forward may run besides the candidate's own kernels ---------------
#
# strict (the default): only what POLICY allows its format; any other ATen op is
# torch_compute_in_forward. kernelbench: any PyTorch op, as KernelBench's rules allow (a partial answer
# keeps cuBLAS's matmul or cuDNN's convolution and fuses the epilogue in a kernel of its own), but the
# candidate's own kernels must run (no_custom_kernel) and their work must reach the output: the forward
# replayed with their launches muted must give another output (no_kernel_effect, for the formats
# probes_kernel_effect names). Under either, min_custom_kernel_share refuses a forward whose GPU time
# is mostly not its own kernels' (low_custom_kernel_share).
STRICT = "strict"
KERNELBENCH = "kernelbench"


@dataclasses.dataclass(frozen=True)
class Policy:
    mode: str = STRICT
    min_custom_kernel_share: float = 0.0  # 0: off

    @classmethod
    def of(cls, request: dict) -> "Policy":
        policy = request.get("policy") or {}
        return cls(policy.get("mode", STRICT), float(policy.get("min_custom_kernel_share", 0.0)))

    @property
    def allows_torch_compute(self) -> bool:
        return self.mode == KERNELBENCH

    @property
    def wants_kernel_share(self) -> bool:
        """Whether every kernel format's audit is profiled on a GPU, for custom_kernel_share."""
        return self.mode == KERNELBENCH or self.min_custom_kernel_share > 0


# The formats whose kernels the effect probe can mute: the launches the harness makes (the launch
# hooks: kz_rtc, Triton), and a `cuda` extension's functions (muteable_extension).
MUTABLE_FORMATS = frozenset({"triton", "cuda-rtc", "cuda"})


def probes_kernel_effect(fmt: str, policy: Policy) -> bool:
    """Whether the forward is replayed with the candidate's launches muted (policy kernelbench)."""
    return policy.mode == KERNELBENCH and fmt in MUTABLE_FORMATS


def disallowed_ops(fmt: str, ops: dict) -> dict:
    """The traced ops (\"namespace::name\" -> count) that the format's policy does not allow."""
    allowed = POLICY.get(fmt)
    if allowed is None:
        return {}
    bad = {}
    for op, count in ops.items():
        namespace, _, name = op.partition("::")
        if namespace in ALLOWED_NAMESPACES or (namespace == "aten" and name in allowed):
            continue
        bad[op] = count
    return bad


# GPU kernels that are not the candidate's own: ATen (at::native ..., cub), cuBLAS/cuBLASLt (gemv2T,
# nvjet, sm90_xmma, ampere_sgemm ...), cuDNN, CUTLASS, flash attention, Inductor's generated Triton
# kernels (triton_poi_/per_/red_/tem_), copies and memsets. A heuristic on (demangled) names.
_LIBRARY_KERNEL = re.compile(
    r"at::|at_cuda_detail|c10::|cub::|cublas|cutlass|cudnn|xmma|nvjet|pytorch_flash|flash_fwd|fmha"
    r"|^(void )?(ampere|volta|turing|hopper|blackwell|sm\d+)_"
    r"|^(void )?(gemv2|gemvx|gemvNSP|gemmk1|gemmSN|splitKreduce|dot_kernel|reduce_1Block|scal_kernel|axpy_kernel"
    r"|implicit_convolve|explicit_convolve|winograd|fft|nchwToNhwc|nhwcToNchw|generateWinogradTiles)"
    r"|^triton_(poi|per|red|tem)_|^(cuda)?mem(cpy|set)|^Mem(cpy|set)", re.IGNORECASE)


def is_library_kernel(name: str) -> bool:
    return bool(_LIBRARY_KERNEL.search(name.strip()))


# ---- launch counters and the op trace ----------------------------------------------------------------


class _State:
    """Mutable state of the checks (one object, so the snapshot sees its identity stay put)."""

    def __init__(self):
        self.launches = 0  # successful kz_rtc / Triton launches
        # Whether the warm-up, before any candidate code, got a kernel list from the profiler: where it
        # did, an audit without one means the candidate's code stopped the profiler.
        self.profiler_worked = False
        self.suspended = 0  # > 0 while inside a launcher: its own torch calls are not the candidate's
        self.muted = False  # the effect probe's replay: launches run nothing (muted_launches)
        self.muted_calls = 0  # launches and extension calls muted so far
        self.installed = set()


_state = _State()


def _counting(original, count_if=lambda result, kwargs: True, muted=lambda original, args, kwargs: None):
    """A launcher that counts its launches (those count_if accepts) and, inside muted_launches(),
    calls muted(original, args, kwargs) instead: no launch, and what a launch would return."""
    def launch(*args, **kwargs):
        _state.suspended += 1
        try:
            if _state.muted:
                _state.muted_calls += 1
                return muted(original, args, kwargs)
            result = original(*args, **kwargs)
        finally:
            _state.suspended -= 1
        if count_if(result, kwargs):
            _state.launches += 1
        return result

    launch.__wrapped__ = original
    launch.__kz_launch_hook__ = True
    return launch


def _suspending(original):
    def run(*args, **kwargs):
        _state.suspended += 1
        try:
            return original(*args, **kwargs)
        finally:
            _state.suspended -= 1

    run.__wrapped__ = original
    run.__kz_launch_hook__ = True
    return run


def _loading_handles(do_compile):
    """Triton's JITFunction._do_compile, then the compiled kernel's launcher and module
    (CompiledKernel._init_handles): Triton builds the launcher with gcc (its own cache is the
    request's, so every evaluation builds one per kernel signature) and loads the module at the first
    `kernel.run` after the compile, which in a forward is inside kz's shared GPU hold, where a waiting
    timing waits it out. Run here, with the compile, they are mostly CPU work (the module's load
    writes a little device memory) with the lock let go of. An error they raise (OutOfResources)
    comes out of the same launch as before. A warm-up compile (JITFunction.warmup, preload, the
    autotuner's) launches nothing, so it loads nothing here either, as in Triton; nor does a kernel
    compiled asynchronously (a future, no _init_handles): both load at their first run."""
    parameters = inspect.signature(do_compile)

    def compile_and_load(*args, **kwargs):
        kernel = do_compile(*args, **kwargs)
        init_handles = getattr(kernel, "_init_handles", None)
        if callable(init_handles) and not parameters.bind(*args, **kwargs).arguments.get("warmup", False):
            init_handles()
        return kernel

    compile_and_load.__wrapped__ = do_compile
    return compile_and_load


def install_launch_hooks(fmt: str) -> None:
    """Counts the candidate's kernel launches, and hides the launchers' own torch calls (the Triton
    interpreter copies tensors; the autotuner benchmarks) from the trace. Installed before the
    candidate is imported, so the snapshot protects them."""
    if fmt == "triton":
        import triton.runtime.autotuner as autotuner
        import triton.runtime.jit as jit
        _wrap(jit.JITFunction, "run", lambda f: _counting(
            f, lambda result, kwargs: not kwargs.get("warmup") and result is not None, _as_warm_up))
        if hasattr(jit.JITFunction, "_do_compile"):  # Triton 3.3+: the compile at a first launch
            _wrap(jit.JITFunction, "_do_compile", lambda f: gpu_lock.releasing(_loading_handles(f)))
        try:
            import triton.runtime.interpreter as interpreter
            _wrap(interpreter.InterpretedFunction, "run", lambda f: _counting(
                f, lambda result, kwargs: not kwargs.get("warmup"), _as_warm_up))
        except ImportError:
            pass
        _wrap(autotuner.Autotuner, "run", _suspending)
    elif fmt == "cuda-rtc":
        import kz_rtc
        _wrap(kz_rtc.Kernel, "__call__", _counting)
        _wrap(kz_rtc, "compile", gpu_lock.releasing)


def _as_warm_up(run, args, kwargs):
    """A muted Triton launch: the run as a warm-up, which compiles and returns the compiled kernel (the
    interpreter: None) as a launch does, but launches nothing, so the candidate cannot tell it apart by
    what it returns."""
    return run(*args, **{**kwargs, "warmup": True})


def muteable_extension(module):
    """A `cuda` candidate's extension module (load_inline's), each of its functions wrapped so that
    inside muted_launches() its call is undone: its kernels launch from C++, out of the harness's
    reach, so the function runs, then every tensor it returns is overwritten (NaN) and every tensor
    argument gets back what it held before, as though its kernels had not run. ATen ops the
    function calls from C++ are undone with them (docs/evaluation.md says what that leaves open)."""
    for name in dir(module):
        function = getattr(module, name, None)
        if not name.startswith("_") and isinstance(function, types.BuiltinFunctionType):
            setattr(module, name, _undone_when_muted(function))
    return module


def _undone_when_muted(function):
    def call(*args, **kwargs):
        if not _state.muted:
            return function(*args, **kwargs)
        _state.muted_calls += 1
        tensors = [x for x in (*args, *kwargs.values()) if type(x) is torch.Tensor]
        before = [x.clone() for x in tensors]
        result = function(*args, **kwargs)
        poison(leaves(result))  # first: a result that is an argument (an in-place op) gets it back below
        with torch.no_grad():
            for tensor, saved in zip(tensors, before):
                tensor.copy_(saved)
        return result

    call.__wrapped__ = function
    return call


@contextlib.contextmanager
def muted_launches():
    """Meanwhile the candidate's kernel launches (kz_rtc, Triton: the launch hooks) run nothing and
    count nothing, and its extension functions' calls are undone (muteable_extension): the effect
    probe. Yields a dict whose "calls" is, on exit, how many launches and calls were muted."""
    before, muted = _state.muted_calls, {"calls": 0}
    _state.muted = True
    try:
        yield muted
    finally:
        _state.muted = False
        muted["calls"] = _state.muted_calls - before


def _wrap(cls, name, make):
    key = (cls, name)
    if key in _state.installed:
        return
    setattr(cls, name, make(getattr(cls, name)))
    _state.installed.add(key)


def profiles_audit(fmt: str, device: torch.device, kernel_share: str, policy: Policy = Policy()) -> bool:
    """Whether the audit forward runs under the profiler ([eval] kernel_share): on a GPU, for `cuda`,
    whose no_custom_kernel check needs its kernel list, and for every format with "all" or where the
    policy wants the verdict's custom_kernel_share (a report, or min_custom_kernel_share's input: the
    launch counters decide cuda-rtc's and triton's no_custom_kernel)."""
    return device.type == "cuda" and (fmt == "cuda" or kernel_share == "all" or policy.wants_kernel_share)


def warm_up(device: torch.device, profiler: bool = True) -> None:
    """Runs the audit's machinery once before the snapshot (the dispatch mode, and where the audit will
    profile, the profiler loads its modules on the GPU), and leaves torch.manual_seed as a later import
    of torch._dynamo would."""
    wrap_manual_seed_as_dynamo_would()
    with OpTrace():
        torch.empty(1).zero_()
    if device.type == "cuda" and profiler:
        try:
            _state.profiler_worked = _profiled_kernels(lambda: None)[2] is None
        except Exception:
            pass


def wrap_manual_seed_as_dynamo_would() -> None:
    """Does to torch.manual_seed what importing torch._dynamo does (wraps it in torch._disable_dynamo and
    registers the wrapper as TorchScript's aten::manual_seed), without that import: ~0.8 s of CPU, which
    was on every cold batch's path before its first evaluation could start (the zygote's imports). The
    import wraps only an unwrapped torch.manual_seed, so a reference or candidate that imports
    torch._dynamo later (torch.compile, torch.library) changes nothing the Guard watches
    (test_process.py). The wrapper's first call would import torch._dynamo to make its disabled copy,
    so it is handed the function itself: the harness never seeds under torch.compile."""
    raw = torch.random.manual_seed
    if torch.manual_seed is not raw or not hasattr(torch, "_disable_dynamo"):
        return  # wrapped already (torch._dynamo is imported), or a torch without the wrapper
    setattr(raw, "__dynamo_disable", raw)
    torch.manual_seed = torch._disable_dynamo(raw)
    torch.jit._builtins._register_builtin(torch.manual_seed, "aten::manual_seed")


class AuditMode(TorchDispatchMode):
    """A dispatch mode of kz's own (the audit's OpTrace, validate.OpRecorder), whose __torch_dispatch__
    torch does not wrap in torch._disable_dynamo: that wrapper's first call would import torch._dynamo
    (~0.8 s of CPU) in every evaluation, and these modes never run under torch.compile's tracing. A
    torch without the _should_skip_dynamo hook wraps it, and the import then costs time, not a verdict."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class OpTrace(AuditMode):
    """Records every ATen op (namespace::name -> count) dispatched while active, except inside
    launchers."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if not _state.suspended:
            self.ops[f"{func.namespace}::{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _profiled_kernels(run, gpu_hold=contextlib.nullcontext):
    """(result, [(kernel name, GPU us)], why_no_list) for run() under the profiler (CUDA activity);
    why_no_list is None, or says why the profiler gave no kernel list.

    A known ATen kernel is launched first: when the profiler does not list it (no CUPTI), it sees
    no kernels at all, and the list is missing. Only the GPU work is inside gpu_hold(): the
    profiler's start and its processing of the trace are ~0.5 s of CPU, and a shared hold that long
    keeps a waiting timing, and every worker queued behind it, off the GPU."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler import profile
    with gpu_hold():
        probe = torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    try:
        # The Kineto profiler that torch.profiler.profile runs, without that wrapper: its start asks
        # hasattr(torch, "_inductor"), which imports torch._inductor and torch._dynamo (~1 s of CPU in
        # every fresh process; wrap_manual_seed_as_dynamo_would says why none is imported before).
        prof = profile(use_device="cuda", use_kineto=True)
        prof.__enter__()
    except Exception as exc:
        with gpu_hold():
            return run(), [], f"the profiler did not start ({type(exc).__name__}: {exc})"
    try:
        with gpu_hold():
            probe.add_(1)
            result = run()
            torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    events = [e for e in prof.function_events if getattr(e, "device_type", None) == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    if not events or not is_library_kernel(events[0].name):
        return result, [], ("the profiler listed no kernel, not even the harness's own before the forward "
                            "(CUPTI unavailable or busy)")
    return result, [(e.name, float(e.time_range.elapsed_us())) for e in events[1:]], None


class AuditReport:
    def __init__(self):
        self.ops = {}
        self.disallowed = {}
        self.launches = 0
        self.kernels = None  # GPU: [(name, us)] from the profiler
        self.no_kernel_list = None  # profiled, but no kernel list: why
        self.custom_kernels = []
        self.custom_share = None


def audit_forward(fmt: str, model, inputs, device: torch.device, gpu_hold=contextlib.nullcontext,
                  profiled: bool = None):
    """One extra forward, traced: (output, AuditReport). Where `profiled` (default: on a GPU) it runs
    under the profiler too, for the kernel list; the forward runs inside gpu_hold(), the profiler's own
    work outside it."""
    report = AuditReport()
    trace = OpTrace()
    before = _state.launches

    def run():
        with trace:
            return model(*inputs)

    if profiled is None:
        profiled = device.type == "cuda"
    if profiled:
        out, kernels, report.no_kernel_list = _profiled_kernels(run, gpu_hold)
        if report.no_kernel_list is None:
            report.kernels = kernels
            report.custom_kernels = sorted({name for name, _ in kernels if not is_library_kernel(name)})
            total = sum(us for _, us in kernels)
            custom = sum(us for name, us in kernels if not is_library_kernel(name))
            report.custom_share = custom / total if total > 0 else 0.0
    else:
        with gpu_hold():
            out = run()
    report.launches = _state.launches - before
    report.ops = dict(trace.ops)
    report.disallowed = disallowed_ops(fmt, trace.ops)
    return out, report


def audit_failure(fmt: str, report: AuditReport, policy: Policy = Policy()):
    """The Failure (or None) for an audit: torch compute in forward (policy strict), no custom kernel,
    a custom kernel share below the policy's minimum."""
    if POLICY.get(fmt) is None:
        return None
    checks, parts = [], []
    if report.disallowed and not policy.allows_torch_compute:
        ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(report.disallowed.items()))
        checks.append(v.TORCH_COMPUTE_IN_FORWARD)
        parts.append(f"ModelNew.forward ran PyTorch compute ops: {ops} (format {fmt} allows allocation, "
                     "views, copies and zero/fill only; docs/evaluation.md)")
    if fmt in ("triton", "cuda-rtc"):
        launched = report.launches > 0
        how = "no Triton kernel was launched" if fmt == "triton" else "no kz_rtc kernel was launched"
    else:  # cuda: only the profiler can tell
        launched = report.kernels is None or bool(report.custom_kernels)
        how = ("the GPU ran no kernel of the candidate's own (" +
               (", ".join(sorted({n for n, _ in report.kernels})[:8]) or "no kernel at all") + ")"
               if report.kernels is not None else "")
    if fmt == "cuda" and _profiler_stopped(report):
        checks.append(v.NO_CUSTOM_KERNEL)
        parts.append("whether ModelNew.forward launched a custom kernel cannot be told: the profiler listed "
                     f"kernels at the harness's warm-up but gave no list for the forward ({report.no_kernel_list}), "
                     "so the candidate's code stopped it")
    elif not launched:
        checks.append(v.NO_CUSTOM_KERNEL)
        parts.append(f"ModelNew.forward launched no custom kernel: {how}")
    minimum = policy.min_custom_kernel_share
    if minimum > 0 and report.custom_share is not None and report.custom_share < minimum:
        checks.append(v.LOW_CUSTOM_KERNEL_SHARE)
        parts.append(f"the candidate's own kernels took {report.custom_share:.1%} of ModelNew.forward's GPU time, "
                     f"below the policy's min_custom_kernel_share of {minimum:.1%}")
    if not checks:
        return None
    return v.Failure(v.CHEAT_DETECTED, "; ".join(parts), checks)


def _profiler_stopped(report: AuditReport) -> bool:
    """The audit got no kernel list where the warm-up, before any candidate code, got one."""
    return report.no_kernel_list is not None and _state.profiler_worked


def unchecked(fmt: str, report: AuditReport, policy: Policy = Policy()) -> dict:
    """check -> why, for the audit's checks that could not run (the verdict's `unchecked`): `cuda`'s
    no_custom_kernel reads the profiler's kernel list, and where the profiler gave none at the
    warm-up either (no CUPTI) it passes (such a host must not cost the Coder its correct answers) but
    says so. Where the warm-up got a list, the candidate stopped the profiler: audit_failure. Likewise
    min_custom_kernel_share without a kernel share (the CPU, no CUPTI), and the effect probe for a
    kernel format whose kernels it cannot mute."""
    if POLICY.get(fmt) is None:
        return {}
    missing = {}
    if fmt == "cuda" and report.no_kernel_list is not None and not _state.profiler_worked:
        missing[v.NO_CUSTOM_KERNEL] = f"{report.no_kernel_list}, so the kernels ModelNew.forward ran are unknown"
    if policy.min_custom_kernel_share > 0 and report.custom_share is None:
        missing[v.LOW_CUSTOM_KERNEL_SHARE] = ("no kernel profile of ModelNew.forward (the CPU, or no CUPTI), so its "
                                              "custom kernel share is unknown")
    if policy.mode == KERNELBENCH and fmt not in MUTABLE_FORMATS:
        missing[v.NO_KERNEL_EFFECT] = (f"format {fmt} launches its kernels from C++, which the harness cannot mute, "
                                       "so whether their work reaches the output is not probed")
    return missing


def unprobed(fmt: str, muted_calls: int) -> dict:
    """The verdict's `unchecked` entry where the effect probe muted nothing of a `cuda` candidate's: its
    kernels were reached otherwise than through its load_inline modules' functions (a torch.ops
    registration), so muting could not reach them and the output says nothing."""
    if fmt != "cuda" or muted_calls:
        return {}
    return {v.NO_KERNEL_EFFECT: "no function of the candidate's load_inline modules ran in the forward, so none was "
                                "muted: whether its kernels' work reaches the output is not known"}


def kernel_effect_failure(muted_out, out, tolerance: dict):
    """The Failure (or None) of the effect probe: `muted_out`, the forward's output with the candidate's
    launches muted (None: that forward raised, so it needed their work), against `out`, its output with
    them. The same output within tolerance: their work never reached it."""
    if muted_out is None:
        return None
    try:
        correctness.compare_outputs(muted_out, out, tolerance)
    except v.Failure:
        return None
    return v.Failure(v.CHEAT_DETECTED,
                     "with the candidate's own kernel launches turned into no-ops, ModelNew.forward returned the same "
                     "output (within tolerance): its kernels' work never reaches the output (policy kernelbench "
                     "allows PyTorch compute beside the candidate's kernels, not instead of them)", [v.NO_KERNEL_EFFECT])


# ---- the identity snapshot ---------------------------------------------------------------------------

_MISSING = object()


def _behavioural(value) -> bool:
    """Values whose replacement changes behaviour: functions, classes, modules, descriptors."""
    return (callable(value) or isinstance(value, (types.ModuleType, property, classmethod, staticmethod))
            or hasattr(type(value), "__get__"))


def _watched_namespaces(fmt: str):
    """(label, object, watch_data) for every namespace whose attributes the harness relies on."""
    watched = [
        ("builtins", builtins, False), ("time", time, False), ("math", math, False), ("json", json, False),
        ("json.encoder", sys.modules.get("json.encoder"), False), ("os", os, False), ("sys", sys, False),
        ("statistics", statistics, False), ("traceback", traceback, False), ("threading", threading, False),
        ("_thread", _thread, False), ("gc", gc, False), ("signal", signal, False), ("contextlib", contextlib, False),
        ("collections", collections, False),
        ("torch", torch, False), ("torch._C", torch._C, False),
        ("torch.nn.functional", torch.nn.functional, False), ("torch.Tensor", torch.Tensor, False),
        ("torch._C.TensorBase", torch._C.TensorBase, False), ("torch.nn.Module", torch.nn.Module, False),
        ("torch.nn.modules.module", nn_module, False), ("torch.overrides", torch.overrides, False),
        ("torch.utils._python_dispatch", python_dispatch, False),
        ("torch.utils._python_dispatch.TorchDispatchMode", TorchDispatchMode, False),
        ("torch.autograd.grad_mode", sys.modules.get("torch.autograd.grad_mode"), False),
        ("torch.autograd.grad_mode.no_grad", torch.no_grad, False),
        ("torch.random", sys.modules.get("torch.random"), False),
        ("torch.cuda", torch.cuda, False), ("torch.cuda.Event", torch.cuda.Event, False),
        ("torch.cuda.Stream", torch.cuda.Stream, False),
        ("torch.backends.cuda", sys.modules.get("torch.backends.cuda"), False),
        ("torch.backends.cudnn", sys.modules.get("torch.backends.cudnn"), False),
    ]
    for name in ("torch.profiler", "torch.profiler.profiler", "torch.autograd.profiler", "kz_rtc", "triton",
                 "triton.runtime.jit", "triton.runtime.interpreter", "triton.runtime.autotuner"):
        if name in sys.modules:
            watched.append((name, sys.modules[name], False))
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if name == "kz_worker" or name.startswith("kz_worker.") or name == "kz_reference":
            watched.append((name, module, True))
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    watched.append((f"{name}.{attr}", value, True))
    for label, cls in (("kz_rtc.Kernel", "Kernel"), ("kz_rtc.Module", "Module")):
        if "kz_rtc" in sys.modules:
            watched.append((label, getattr(sys.modules["kz_rtc"], cls), False))
    for label, module_name, cls in (("triton JITFunction", "triton.runtime.jit", "JITFunction"),
                                    ("triton InterpretedFunction", "triton.runtime.interpreter",
                                     "InterpretedFunction"),
                                    ("triton Autotuner", "triton.runtime.autotuner", "Autotuner")):
        if module_name in sys.modules and hasattr(sys.modules[module_name], cls):
            watched.append((label, getattr(sys.modules[module_name], cls), False))
    return [(label, obj, data) for label, obj, data in watched if obj is not None]


# Data attributes of the watched harness modules that change on their own.
_MUTABLE = {("kz_rtc", "_launches")}

_MODULE_HOOK_DICTS = [name for name in dir(nn_module) if name.startswith("_global_") and name.endswith("hooks")]


# Listed once: signal.valid_signals() costs more than reading every handler (the Guard reads them
# after the timed runs).
_CATCHABLE_SIGNALS = tuple(sig for sig in signal.valid_signals() if sig not in (signal.SIGKILL, signal.SIGSTOP))


def _signals():
    result = {}
    for sig in _CATCHABLE_SIGNALS:
        try:
            result[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            pass
    return result


class _Setting:
    def __init__(self, name, get, set_):
        self.name, self.get, self.set = name, get, set_


def _settings():
    matmul = torch.backends.cuda.matmul
    return [
        _Setting("torch.backends.cuda.matmul.allow_tf32", lambda: matmul.allow_tf32,
                 lambda x: setattr(matmul, "allow_tf32", x)),
        _Setting("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32,
                 lambda x: setattr(torch.backends.cudnn, "allow_tf32", x)),
        _Setting("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision,
                 torch.set_float32_matmul_precision),
        _Setting("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        _Setting("sys.gettrace()", sys.gettrace, sys.settrace),
        _Setting("sys.getprofile()", sys.getprofile, sys.setprofile),
        _Setting("threading.gettrace()", threading.gettrace, threading.settrace),
        _Setting("threading.getprofile()", threading.getprofile, threading.setprofile),
        _Setting("sys.modules", lambda: sys.modules, lambda x: setattr(sys, "modules", x)),
        _Setting("gc.callbacks", lambda: list(gc.callbacks), lambda x: gc.callbacks.__setitem__(slice(None), x)),
        _Setting("signal handlers", _signals, lambda x: [signal.signal(s, h) for s, h in x.items() if h is not None]),
    ]


def _same(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict) and a is not sys.modules:
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return a is b or (isinstance(a, (str, bool, int, float, torch.dtype)) and a == b)


class Guard:
    """The identity snapshot and the other invariants the harness relies on; verify() compares,
    restores what changed and raises harness_patched (or background_thread)."""

    def __init__(self, fmt: str):
        self.format = fmt
        self.entries = []  # (label, obj, key, value)
        self.codes = []  # (label, function, __code__, __defaults__, __kwdefaults__)
        self.class_keys = []  # (label, cls, set of own keys)
        for label, obj, watch_data in _watched_namespaces(fmt):
            own = dict(vars(obj))
            if isinstance(obj, type):
                self.class_keys.append((label, obj, set(own)))
            for key, value in own.items():
                if (label, key) in _MUTABLE or not (watch_data or _behavioural(value)):
                    continue
                self.entries.append((label, obj, key, value))
                function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                if isinstance(function, types.FunctionType):
                    self.codes.append((f"{label}.{key}", function, function.__code__, function.__defaults__,
                                       function.__kwdefaults__))
        self.identities = _identity_checks(self.entries)
        # With the sandbox's audit hook, writes to these functions' code are refused as they happen,
        # and a verify inside the timing's exclusive hold reads none of them (~1,000 audited reads,
        # ~1.5 ms a verify on the H200). Every other verify still reads them: the hook's own state is
        # within a candidate's reach (sys.modules), and one that turned it off for a write is caught
        # before its verdict, at the first verify after the hold at the latest.
        self.codes_protected = sandbox.protect_functions([function for _, function, *_ in self.codes])
        # What the functions keep that is changed in place, with no audit event: their closure cells
        # (a context manager's generator, a decorator's target) and their keyword defaults' dict.
        self.cells = [(label, cell, _cell_contents(cell)) for label, function, *_ in self.codes
                      for cell in function.__closure__ or ()]
        self.kwdefaults = [(label, kwdefaults, dict(kwdefaults)) for label, _, _, _, kwdefaults in self.codes
                           if kwdefaults]
        self.settings = [(s, s.get()) for s in _settings()]
        self.module_hooks = {name: dict(getattr(nn_module, name)) for name in _MODULE_HOOK_DICTS}
        self.modules = {name: module for name, module in sys.modules.items()
                        if name in ("torch", "builtins", "time", "os", "json", "kz_rtc", "kz_reference")
                        or name.startswith("kz_worker")}
        self.threads = _thread._count()
        self.itimers = [getattr(signal, n) for n in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
                        if hasattr(signal, n)]

    def changes(self, restore: bool = True, in_hold: bool = False) -> list:
        """What changed since the snapshot (restored unless restore=False); in_hold: the functions' code
        is left to the audit hook where it guards it (above)."""
        changed = []
        if not _identities_unchanged(self.identities):  # the fast check; the loop names and restores
            for label, obj, key, value in self.entries:
                now = vars(obj).get(key, _MISSING)
                if now is not value:
                    changed.append(f"{label}.{key}")
                    if restore:
                        _try(lambda: setattr(obj, key, value))
        for label, cls, keys in self.class_keys:
            for key in set(vars(cls)) - keys:
                now = vars(cls)[key]
                if _behavioural(now) or any(key in vars(base) for base in cls.__mro__[1:]):
                    changed.append(f"{label}.{key}")
                    if restore:
                        _try(lambda: delattr(cls, key))
        for label, function, code, defaults, kwdefaults in () if in_hold and self.codes_protected else self.codes:
            if (function.__code__ is not code or function.__defaults__ is not defaults
                    or function.__kwdefaults__ is not kwdefaults):
                changed.append(f"{label}.__code__")
                if restore:
                    with sandbox.unaudited():
                        function.__code__, function.__defaults__, function.__kwdefaults__ = code, defaults, kwdefaults
        for label, cell, contents in self.cells:
            if _cell_contents(cell) is not contents:
                changed.append(f"{label} (a variable of its closure)")
                if restore:
                    _try(lambda: _set_cell_contents(cell, contents))
        for label, kwdefaults, saved in self.kwdefaults:
            if len(kwdefaults) != len(saved) or any(kwdefaults.get(key, _MISSING) is not value
                                                    for key, value in saved.items()):
                changed.append(f"{label}.__kwdefaults__ (changed in place)")
                if restore:
                    kwdefaults.clear()
                    kwdefaults.update(saved)
        for setting, value in self.settings:
            if not _same(setting.get(), value):
                changed.append(setting.name)
                if restore:
                    _try(lambda: setting.set(value))
        for name, hooks in self.module_hooks.items():
            now = getattr(nn_module, name)
            if not _same(dict(now), hooks):
                changed.append(f"torch.nn.modules.module.{name} (global module hooks)")
                if restore:
                    now.clear()
                    now.update(hooks)
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                changed.append(f"sys.modules[{name!r}]")
                if restore:
                    sys.modules[name] = module
        for which in self.itimers:
            if signal.getitimer(which) != (0.0, 0.0):
                changed.append("signal.setitimer (a timer interrupts the harness)")
                if restore:
                    signal.setitimer(which, 0)
        changed += [f"{kind} left active: {mode}" for kind, mode in active_modes()]
        if restore:
            pop_modes()
        return changed

    def verify(self, where: str, in_hold: bool = False) -> None:
        changed = self.changes(in_hold=in_hold)
        if changed:
            shown = ", ".join(changed[:12]) + (f" and {len(changed) - 12} more" if len(changed) > 12 else "")
            raise v.Failure(v.CHEAT_DETECTED, f"{where}: the candidate changed what the harness relies on: {shown}",
                            [v.HARNESS_PATCHED])
        threads = _thread._count()
        if threads > self.threads:
            names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
            raise v.Failure(v.CHEAT_DETECTED,
                            f"{where}: the candidate started {threads - self.threads} thread(s) "
                            f"that are still running ({', '.join(names) or 'not threading.Thread'})",
                            [v.BACKGROUND_THREAD])

    @contextlib.contextmanager
    def comparing(self, where: str, in_hold: bool = False):
        """Verifies the snapshot, then runs the body with torch function handling and any dispatch mode
        disabled, so nothing left behind can reach the harness's own torch calls."""
        self.verify(where, in_hold)
        with torch._C.DisableTorchFunction(), python_dispatch._disable_current_modes():
            yield


def _identity_checks(entries) -> list:
    """Per namespace: (obj, a getter of its watched keys' values, the values snapshotted). Comparing
    ~5,000 identities after the timed runs (inside the timing's exclusive GPU hold) then runs in C,
    ~110 µs, where the Python loop over Guard.entries (in Guard.changes) takes ~400 µs."""
    by_namespace = {}
    for _, obj, key, value in entries:
        by_namespace.setdefault(id(obj), (obj, []))[1].append((key, value))
    checks = []
    for obj, watched in by_namespace.values():
        keys = [key for key, _ in watched] + [watched[0][0]]  # two keys at least: itemgetter returns a tuple
        checks.append((obj, operator.itemgetter(*keys), tuple(value for _, value in watched) + (watched[0][1],)))
    return checks


def _identities_unchanged(checks) -> bool:
    """By identity (operator.is_): == would be the candidate's own __eq__ to define."""
    try:
        return all(all(map(operator.is_, getter(vars(obj)), snapshot)) for obj, getter, snapshot in checks)
    except KeyError:  # a watched name was deleted
        return False


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # not set yet
        return _MISSING


def _set_cell_contents(cell, contents) -> None:
    if contents is _MISSING:
        del cell.cell_contents
    else:
        cell.cell_contents = contents


def _try(action):
    try:
        action()
    except Exception:
        pass


def active_modes():
    """(kind, mode) for every torch function mode and dispatch mode on the stacks."""
    modes = [("TorchFunctionMode", m) for m in torch.overrides._get_current_function_mode_stack()]
    modes += [("TorchDispatchMode", m) for m in python_dispatch._get_current_dispatch_mode_stack()]
    return modes


def pop_modes() -> None:
    while torch._C._len_torch_function_stack() > 0:
        torch._C._pop_torch_function_stack()
    while torch._C._len_torch_dispatch_stack() > 0:
        torch._C._pop_torch_dispatch_stack()


# ---- checks on outputs -------------------------------------------------------------------------------


def leaves(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def check_output_types(out, ref) -> None:
    """Exact torch.Tensor where the reference has one, before any method of the output is called
    (a subclass's __torch_function__ would run inside the harness)."""
    outs, refs = leaves(out), leaves(ref)
    if isinstance(ref, torch.Tensor):
        outs, refs = [out], [ref]
    elif type(out) is not type(ref) or len(outs) != len(refs):
        return  # compare_outputs names the structure
    for index, (o, r) in enumerate(zip(outs, refs)):
        if isinstance(r, torch.Tensor) and type(o) is not torch.Tensor:
            what = "output" if isinstance(ref, torch.Tensor) else f"output[{index}]"
            raise v.Failure(v.INCORRECT, f"{what}: type {type(o).__module__}.{type(o).__name__}, "
                                         "expected torch.Tensor", [v.OUTPUT_TYPE])


def _storages(values):
    result = set()
    for x in values:
        if isinstance(x, torch.Tensor) and x.untyped_storage().size() > 0:  # outputs: exact type checked before
            result.add((x.device, x.untyped_storage().data_ptr()))
    return result


def check_aliases_reference(out, reference_outputs) -> None:
    """reference_outputs: every reference output alive (precomputed and live)."""
    refs = set()
    for r in reference_outputs:
        refs |= _storages(leaves(r))
    if _storages(leaves(out)) & refs:
        raise v.Failure(v.CHEAT_DETECTED, "the output shares memory with a reference output",
                        [v.OUTPUT_ALIASES_REFERENCE])


def clone_output(out):
    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, (tuple, list)):
        return type(out)(clone_output(x) for x in out)
    return out


class ReplayDetector:
    """Remembers the digest of the candidate's first output per input set (fingerprint.digest: its
    bytes, not a copy); an output bitwise equal to the one of a different set, where the two
    references differ beyond tolerance, is a replay."""

    def __init__(self, references_differ):
        self.references_differ = references_differ  # (set_a, set_b) -> bool
        self.outputs = {}

    def check(self, set_id, out) -> None:
        digest = fingerprint.digest(out)
        for other, previous in self.outputs.items():
            if other != set_id and previous == digest and self.references_differ(set_id, other):
                raise v.Failure(v.CHEAT_DETECTED,
                                f"the output for input set {set_id} is bit for bit the output for input set "
                                f"{other}, whose reference differs (results cached by shape or by pointer, "
                                "or replayed)", [v.REPLAYED_OUTPUT])
        self.outputs.setdefault(set_id, digest)


def poison(values, keep=()) -> None:
    """Overwrites tensors the harness is about to drop (NaN, or all ones bits for integers), so the
    next allocation that reuses their memory holds nothing correct (on the CPU too, where the caching
    allocator's free-memory poisoning does not apply). Tensors sharing memory with `keep` (model
    parameters) are left alone."""
    kept = _storages(keep)
    for x in values:
        if type(x) is not torch.Tensor or x.numel() == 0:
            continue
        if (x.device, x.untyped_storage().data_ptr()) in kept:
            continue
        try:
            with torch.no_grad():
                if x.dtype.is_floating_point or x.dtype.is_complex:
                    x.fill_(float("nan"))
                elif x.dtype == torch.bool:
                    x.fill_(True)
                else:
                    x.fill_(-1)
        except RuntimeError:
            pass  # e.g. an expanded (overlapping) view
