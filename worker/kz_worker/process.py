"""What every worker process does, whether started for one evaluation (__main__.py) or forked
from a fork server (fork_server.py): prepare the same way, then evaluate one request.

Every evaluation prepares the same way before any reference or candidate code: the host part
(imports, the audit's CPU machinery) and then the device part (the CUDA context, the launch spin's
clock and gate), so
the harness's identity snapshot is the same whichever way its process was made. On the CPU the
supervisor sets TRITON_INTERPRET=1 itself, since Triton reads it when imported."""
import ctypes
import os
import resource
import sys
import threading
import time


def builds_only() -> bool:
    """A worker for compile-only requests (the supervisor sets KZ_WORKER_ROLE=build for the `cuda`
    pre-builds): it imports and constructs the candidate, and never runs, audits or times one, so it
    skips Triton and the audit's machinery (~4 s of CPU per fork server on the GPU host,
    while nvcc needs every core)."""
    return os.environ.get("KZ_WORKER_ROLE") == "build"


def prepare_host(device_name: str) -> None:
    """Imports and the audit's CPU machinery (its dispatch mode, torch.manual_seed as torch._dynamo
    leaves it, without importing that: cheats.wrap_manual_seed_as_dynamo_would): no CUDA, so a fork
    server can run it once and fork children that inherit it."""
    import torch
    from . import cheats, harness, validate  # noqa: F401
    import_load_inline_module()
    if not builds_only():
        # Triton fixes interpreter mode at import: only where it is decided already (the supervisor
        # sets TRITON_INTERPRET for CPU evaluations) or where a GPU makes compiled mode the one wanted.
        if os.environ.get("TRITON_INTERPRET") == "1" or torch.device(device_name).type == "cuda":
            try:
                import triton.runtime.jit  # noqa: F401
            except ImportError:
                pass
        cheats.warm_up(torch.device("cpu"))
    freeze_heap()


def import_load_inline_module() -> None:
    """torch.utils.cpp_extension, which every `cuda` candidate and pre-build imports (~0.5-1 s of CPU
    each on the GPU host, on the pre-builds' critical path), imported once here for a fork server's
    children to inherit. Its import asks torch.cuda.is_available(), only to warn where CUDA_HOME exists
    without a runtime, and that question (cudaGetDeviceCount) makes torch refuse CUDA in every later
    fork: each child would fail with "Cannot re-initialize CUDA in forked subprocess" (what an
    unguarded import here did on the H200). So the import runs with that question answered, not
    asked; fork_server.refuse_if_fork_unsafe checks that no import asked it anyway."""
    import torch
    if "torch.utils.cpp_extension" in sys.modules:
        return
    ask = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        torch.cuda.is_available = ask


class EarlyContext:
    """The device's CUDA context made in a thread while the main thread imports (a process that
    evaluates one request and never forks: __main__.py). cuDevicePrimaryCtxRetain through the driver
    API makes the primary context torch's runtime then takes instead of making it (0.4 s on an idle
    H200, ~3 s with eight made at once beside a cold batch's builds); the imports take as long again,
    and the two hardly contend. Any failure is left for prepare_device's own context step, which then
    fails in its stage the way it would have; join() before any reference or candidate code."""

    def __init__(self, device_name: str):
        self.seconds, self.error = None, None
        self.context = ctypes.c_void_p()  # the primary context, once retained
        ordinal = _cuda_ordinal(device_name)
        self.thread = threading.Thread(target=self._retain, args=(ordinal,), daemon=True)
        if ordinal is not None and not builds_only():
            self.thread.start()

    def _retain(self, ordinal: int) -> None:
        started = time.monotonic()
        try:
            driver = ctypes.CDLL("libcuda.so.1")
            device = ctypes.c_int()
            for call, args in ((driver.cuInit, (0,)), (driver.cuDeviceGet, (ctypes.byref(device), ordinal)),
                               (driver.cuDevicePrimaryCtxRetain, (ctypes.byref(self.context), device))):
                status = call(*args)
                if status != 0:
                    raise OSError(f"{call.__name__} returned CUresult {status}")
        except OSError as error:
            self.error = str(error)
        self.seconds = time.monotonic() - started

    def join(self) -> None:
        if self.thread.ident is not None:  # started
            self.thread.join()


def _cuda_ordinal(device_name: str):
    """The CUDA device ordinal of "cuda" or "cuda:N" (as CUDA_VISIBLE_DEVICES numbers them), else None."""
    kind, _, index = device_name.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


# Seconds of prepare_device's steps in this process (context, clock, launch_gate, kernels), for the
# verdict profile's startup_s where a request waited for them (fork_server.run_child).
device_steps_s = {}


def prepare_device(device_name: str) -> None:
    """On a GPU: the CUDA context, the launch spin's clock and gate, the checks' kernels loaded. Never
    in a fork server: a CUDA context does not survive a
    fork. Not the profiler: only a request whose audit is profiled (cheats.profiles_audit: `cuda` by
    default) starts it, in its load_reference stage, so a cold batch's first wave of other formats
    does not wait for it (~0.5 s each with eight at once)."""
    import torch
    device = torch.device(device_name)
    if device.type == "cuda" and not builds_only():  # a build's CUDA context comes when it needs one
        from . import harness, timing
        # set_device makes the context already (torch's lazy init): both count as "context".
        steps = (("context", lambda: (torch.cuda.set_device(device), torch.empty(1, device=device))),
                 # The launch spin's clock and gate, before any candidate code.
                 ("clock", lambda: timing.cycles_per_us(device)),
                 ("launch_gate", lambda: timing.launch_gate(device)),
                 # The harness's own checks once, so their kernels are loaded before the request.
                 ("kernels", lambda: harness.load_check_kernels(device)))
        for name, step in steps:
            started = time.monotonic()
            step()
            device_steps_s[name] = time.monotonic() - started
        freeze_heap()


def prepare_fresh(device_name: str, early: "EarlyContext") -> dict:
    """Both preparations in a process started for one request (__main__.py), `early` making the
    context meanwhile; the verdict profile's startup_s: "imports" (prepare_host), "device" (the wait for the
    device after them), where it waited the device steps as in a fork server's child, and
    "early_context" (the thread's own seconds, beside the imports)."""
    started = time.monotonic()
    quietly(prepare_host, device_name)
    imported = time.monotonic()
    early.join()
    quietly(prepare_device, device_name)
    startup = {"imports": imported - started, "device": time.monotonic() - imported}
    startup.update({f"device_{step}": s for step, s in device_steps_s.items()})
    if early.seconds is not None:
        startup["early_context"] = early.seconds
    return startup


def freeze_heap() -> None:
    """Moves every object made so far out of the garbage collector's generations (gc.freeze): a full
    collection then walks only what the evaluation made, not the imports' ~260,000 objects (~136 ms
    each time on this project's CPU: a pause that may land in a timed run or in the exclusive GPU
    hold), and a fork server's children do not copy the memory pages that walk would touch."""
    import gc
    gc.freeze()


def quietly(step, device_name: str) -> None:
    try:
        step(device_name)
    except Exception:  # the evaluation redoes each step and fails in its own stage, rightly classified
        pass


def _link_triton_helpers() -> None:
    """Triton's driver helper from setup into the request's own Triton cache (triton_helpers.py),
    before any reference or candidate code. Without it Triton builds the helper itself."""
    from . import triton_helpers
    try:
        triton_helpers.link_into(os.environ.get("TRITON_CACHE_DIR", ""))
    except OSError:
        pass


def cpu_seconds() -> dict:
    """The verdict profile's cpu_s: user + system seconds of this process ("worker": every thread; a fork
    server's child counts from its fork, its device preparation included, a worker started for the
    request its imports too) and of the subprocesses it waited for ("subprocesses": a build's ninja
    with nvcc and the compilers under it, Triton's ptxas and launcher builds). Diagnostics: candidate
    code runs in this process and could change it, and no reward reads it."""
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"worker": own.ru_utime + own.ru_stime, "subprocesses": waited.ru_utime + waited.ru_stime}


def evaluate(request: dict) -> None:
    """Runs one request after its process is prepared; sends the result and exits."""
    from . import protocol, sandbox
    channel = protocol.Channel(request.pop("message_token", None))  # before any candidate code
    startup = request.pop("startup_s", None)  # a fork server's child: where its start-up went
    _link_triton_helpers()
    protocol.silence_stdout()
    sandbox.install(request)  # request["sandbox"]: the audit hook, before any reference or candidate code
    if request.get("mode") == "validate_module":  # a Proposer's module (validate.py)
        from .validate import reject_sandbox_violations, validate_module
        result = validate_module(request, channel)
        reject_sandbox_violations(result)
    else:
        from .harness import Evaluation
        result = Evaluation(request, channel).run()
        sandbox.apply(result)  # a recorded violation makes the verdict sandbox_violation
        result["profile"]["cpu_s"] = cpu_seconds()
    result["type"] = "result"
    if startup:
        result.setdefault("profile", {})["startup_s"] = startup
    channel.send(result)
    # Skip interpreter teardown: a candidate's broken destructors must not turn a verdict
    # into a crash after it was sent.
    sys.stderr.flush()
    os._exit(0)
