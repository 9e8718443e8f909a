"""kz_rtc: compile CUDA kernels with NVRTC at run time and launch them on torch tensors.

This is KernelZero's "cuda-rtc" candidate format. torch.utils.cpp_extension.load_inline builds a
whole C++ extension with nvcc and a host compiler (about 50 s per candidate); NVRTC compiles one
CUDA source to a CUBIN in tens of milliseconds, and the driver API launches it directly. The module
needs nothing but ctypes and torch:

    import kz_rtc
    mod = kz_rtc.compile(r'''
    extern "C" __global__ void relu_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = fmaxf(x[i], 0.f);
    }''', name="relu")
    mod.relu_kernel(x, y, x.numel(), grid=((x.numel() + 255) // 256,), block=(256,))

Kernels must have C linkage (``extern "C" __global__ ...`` or inside an ``extern "C" { }`` block):
templates and C++-linkage kernels are not found. Launches are asynchronous, on torch's current
stream of the first tensor argument's device (or of the current device) unless ``stream`` is given.

Argument conversion uses each parameter's byte size from cuFuncGetParamInfo (CUDA >= 12.4):
CUDA tensor -> 64-bit data pointer; int -> int32/int64 (OverflowError if it does not fit, signed);
float -> float/double; bool -> 1 byte; ctypes objects are passed as given (their size must match).
The parameter types parsed from the source refine this: an int given for a float/double parameter
is passed as a float, a float given for an integer or pointer parameter raises TypeError.
Without cuFuncGetParamInfo (older drivers) the argument count is not checked and int -> int64,
float -> float32 (a ``double`` parameter then needs ctypes.c_double).

Set ``set_compile_only(True)`` on machines without a GPU: compile() still runs NVRTC for real
(for the GPU if torch sees one, else $KZ_RTC_ARCH or sm_90), and any launch raises NotRunnable.
"""

from __future__ import annotations

import ctypes
import hashlib
import numbers
import os
import threading
import time
from typing import Sequence

import torch

from . import _driver
from ._nvrtc import CompileError, compile_to_cubin, default_include_dirs, load_library
from ._parse import find_kernel_params

__all__ = ["compile", "Module", "Kernel", "CompileError", "NotRunnable", "set_compile_only",
           "launch_count", "compiled_modules", "compile_seconds"]

_lock = threading.RLock()
_compile_only = False
_launches = 0
_compile_seconds = 0.0  # NVRTC's, summed over this process's compiles (cache hits take none)
_cubins: dict[str, tuple[bytes, str]] = {}
_modules: dict[tuple[str, str], "Module"] = {}
_DEFAULT_ARCH = "sm_90"


class NotRunnable(RuntimeError):
    """A kernel launch was asked for in compile-only mode (a machine without a GPU)."""


CompileError.__module__ = NotRunnable.__module__ = "kz_rtc"  # shown as kz_rtc.CompileError


def set_compile_only(flag: bool) -> None:
    """In compile-only mode compile() works and every launch raises NotRunnable."""
    global _compile_only
    _compile_only = bool(flag)


def launch_count() -> int:
    """Number of successful kernel launches in this process."""
    return _launches


def compile_seconds() -> float:
    """Seconds NVRTC took in this process so far (failed compiles included)."""
    return _compile_seconds


def compiled_modules() -> list:
    """Every Module compile() returned so far in this process, in compilation order."""
    with _lock:
        return list(_modules.values())


def _normalise_arch(arch: str) -> str:
    arch = arch.strip().lower().replace(".", "")
    return arch if arch.startswith("sm_") else f"sm_{arch}"


def target_arch() -> str:
    """sm_XX of torch's current CUDA device; else $KZ_RTC_ARCH; else sm_90."""
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:
        pass
    return _normalise_arch(os.environ.get("KZ_RTC_ARCH", _DEFAULT_ARCH))


def compile(source: str, *, name: str = "kernels", options: Sequence[str] = ()) -> "Module":
    """Compile ``source`` with NVRTC to a CUBIN for this device; cached by (source, options, arch)."""
    global _compile_seconds
    if not isinstance(source, str):
        raise TypeError(f"kz_rtc.compile: source must be a str, not {type(source).__name__}")
    arch, options = target_arch(), [str(o) for o in options]
    key = hashlib.sha256("\0".join([arch, source, *options]).encode()).hexdigest()
    with _lock:
        module = _modules.get((key, name))
        if module is None:
            if key not in _cubins:
                started = time.perf_counter()
                try:
                    load_library()
                    full = [f"--gpu-architecture={arch}", *(f"-I{d}" for d in default_include_dirs()), *options]
                    _cubins[key] = compile_to_cubin(source, name, full)
                finally:
                    _compile_seconds += time.perf_counter() - started
            module = _modules[(key, name)] = Module(name, source, options, arch, *_cubins[key])
    module._preload()
    return module


class Module:
    """One compiled source: its CUBIN, NVRTC log and kernels (``mod.kernels``, ``mod.<name>``)."""

    def __init__(self, name: str, source: str, options: list, arch: str, cubin: bytes, log: str):
        self.name, self.source, self.options, self.arch = name, source, list(options), arch
        self.cubin, self.log = cubin, log
        self.kernels = {k: Kernel(self, k, kinds) for k, kinds in find_kernel_params(source).items()}
        self._loaded: dict[int, int] = {}  # device ordinal -> CUmodule

    def __getattr__(self, attr: str) -> "Kernel":
        kernels = self.__dict__.get("kernels", {})
        if attr in kernels:
            return kernels[attr]
        known = ", ".join(kernels) or 'none (only extern "C" __global__ functions are found)'
        raise AttributeError(f"kz_rtc module {self.__dict__.get('name')!r} has no kernel {attr!r}; kernels: {known}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.kernels))

    def __repr__(self) -> str:
        return f"<kz_rtc.Module {self.name!r} {self.arch} kernels={list(self.kernels)}>"

    def _preload(self) -> None:
        """Loads the CUBIN and looks up every kernel on torch's current device (kz: a worker's one
        device) now, where torch has initialised CUDA, so that the first launch only launches. In kz's
        harness a compile runs with the GPU lock let go of and a forward inside a shared hold, which a
        waiting timing (and every worker queued behind it) waits out: the module's load, mostly CPU
        work, belongs with the compile. A failure is left to the first launch, which raises it naming
        its kernel."""
        if _compile_only or not torch.cuda.is_initialized():
            return
        try:
            device = torch.cuda.current_device()
            if all(device in kernel._functions for kernel in self.kernels.values()):
                return  # loaded by an earlier compile of the same source
            pushed = _driver.enter_context(device)
        except Exception:
            return
        try:
            for kernel in self.kernels.values():
                kernel._function(device)
        except Exception:
            pass
        finally:
            if pushed:
                _driver.leave_context()

    def _cu_module(self, device: int) -> int:
        """The CUmodule on ``device``, loaded on first use (the device's context must be current)."""
        with _lock:
            if device not in self._loaded:
                self._loaded[device] = _driver.load_module(self.cubin)
            return self._loaded[device]


def _dims(value, what: str, kernel: str) -> tuple[int, int, int]:
    """1 to 3 positive ints (an int or a tuple) -> a 3-tuple padded with 1."""
    if type(value) is tuple and 1 <= len(value) <= 3 and all(type(d) is int and d > 0 for d in value):
        return value + (1,) * (3 - len(value))  # the common case, without the ABC checks below
    dims = (value,) if isinstance(value, numbers.Integral) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, numbers.Integral) and d > 0 for d in dims):
        raise ValueError(f"kz_rtc kernel {kernel!r}: {what} must be 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class Kernel:
    """One ``extern "C" __global__`` function; calling it launches it asynchronously."""

    def __init__(self, module: Module, name: str, kinds: list | None = None):
        self.module, self.name, self.kinds = module, name, kinds  # kinds: parsed parameter types
        self._functions: dict[int, tuple[int, list | None]] = {}  # device -> (CUfunction, param sizes)
        self._max_shared: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<kz_rtc.Kernel {self.name!r} of module {self.module.name!r}>"

    def __call__(self, *args, grid, block, shared_mem: int = 0, stream=None) -> None:
        if _compile_only:
            raise NotRunnable(f"kz_rtc: kernel {self.name!r} cannot be launched in compile-only mode")
        grid3, block3 = _dims(grid, "grid", self.name), _dims(block, "block", self.name)
        device = _launch_device(args)
        pushed = _driver.enter_context(device)
        try:
            function, sizes = self._function(device)
            params = _convert_args(self.name, args, sizes, self.kinds)
            self._ensure_shared(device, function, int(shared_mem))
            _driver.launch(function, grid3, block3, int(shared_mem), _stream_handle(stream, device), params,
                           self.name)
        finally:
            if pushed:
                _driver.leave_context()
        global _launches
        with _lock:
            _launches += 1

    def _function(self, device: int) -> tuple[int, list | None]:
        """(CUfunction, parameter sizes) on ``device``, looked up once."""
        if device not in self._functions:
            function = _driver.get_function(self.module._cu_module(device), self.name)
            self._functions[device] = (function, _driver.param_sizes(function, self.name))
        return self._functions[device]

    def _ensure_shared(self, device: int, function: int, nbytes: int) -> None:
        """Raise the dynamic shared memory limit when a launch asks for more than 48 KiB."""
        if nbytes > 48 * 1024 and nbytes > self._max_shared.get(device, 0):
            _driver.set_max_dynamic_shared(function, nbytes, self.name)
            self._max_shared[device] = nbytes


def _launch_device(args) -> int:
    """The device of the first CUDA tensor argument, else torch's current device (CUDA initialised)."""
    if not torch.cuda.is_initialized():
        torch.cuda.init()
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device.index if a.device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_device()


def _stream_handle(stream, device: int) -> int:
    """CUstream handle: torch's current stream on ``device`` unless a torch.cuda.Stream or int is given."""
    if stream is None:
        if _raw_stream is not None:  # the same value as current_stream(device).cuda_stream, without the object
            return _raw_stream(device)
        stream = torch.cuda.current_stream(device)
    return int(getattr(stream, "cuda_stream", stream) or 0)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


_INTS = {1: ctypes.c_int8, 2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}
_FLOATS = {4: ctypes.c_float, 8: ctypes.c_double}


def _convert_args(kernel: str, args, sizes: list | None, kinds: list | None) -> list:
    """ctypes objects holding each argument, sized by the kernel's parameters."""
    if sizes is not None and len(args) != len(sizes):
        raise TypeError(f"kz_rtc kernel {kernel!r} takes {len(sizes)} arguments but {len(args)} were given")
    if kinds is None or len(kinds) != len(args):
        kinds = [None] * len(args)
    return [_convert(kernel, i, a, sizes[i] if sizes is not None else None, kinds[i]) for i, a in enumerate(args)]


def _convert(kernel: str, index: int, arg, size: int | None, kind: str | None):
    """One argument -> a ctypes object (size None: no parameter info, use the fallback widths).

    ``kind`` is the parameter's type as parsed from the source ('float', 'double', 'int', ...): an int
    given for a float/double parameter is converted to a float, a float given for an integer one refused.
    """
    where = (kernel, index)
    if isinstance(arg, torch.Tensor):
        if not arg.is_cuda:
            raise TypeError(f"{_where(where)}: tensor is on {arg.device}, a CUDA tensor is needed")
        return _sized(where, ctypes.c_uint64(arg.data_ptr()), size)
    if type(arg) is int or (isinstance(arg, numbers.Integral) and not isinstance(arg, bool)):
        if kind not in ("float", "double"):
            return _int(where, int(arg), 8 if size is None else size)
    elif isinstance(arg, bool):
        return ctypes.c_bool(arg) if size in (None, 1) else _int(where, int(arg), size)
    elif isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return _sized(where, arg, size)
    elif isinstance(arg, numbers.Real):
        if kind in ("int", "bool", "pointer"):
            raise TypeError(f"{_where(where)}: a {type(arg).__name__} given for an integer or pointer parameter")
    else:
        raise TypeError(f"{_where(where)}: cannot pass a {type(arg).__name__} "
                        "(tensor, int, float, bool or ctypes value)")
    return _float(where, float(arg), size or (8 if kind == "double" else 4))


def _where(where: tuple) -> str:
    return f"kz_rtc kernel {where[0]!r} argument {where[1]}"


def _sized(where: tuple, obj, size: int | None):
    if size is not None and ctypes.sizeof(obj) != size:
        raise TypeError(f"{_where(where)}: parameter is {size} bytes, the value given is {ctypes.sizeof(obj)}")
    return obj


def _int(where: tuple, value: int, size: int):
    if size not in _INTS:
        raise TypeError(f"{_where(where)}: an int cannot fill a {size}-byte parameter")
    bits = 8 * size
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise OverflowError(f"{_where(where)}: {value} does not fit the {bits}-bit integer parameter "
                            f"(pass a ctypes.c_uint{bits} for an unsigned one)")
    return _INTS[size](value)


def _float(where: tuple, value: float, size: int):
    if size not in _FLOATS:
        raise TypeError(f"{_where(where)}: a float cannot fill a {size}-byte parameter")
    return _FLOATS[size](value)
