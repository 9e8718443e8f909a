"""The CUDA driver API through ctypes (libcuda.so.1): contexts, module loading, launches.

Only what kz_rtc needs: torch's primary context for a device, cuModuleLoadData of a CUBIN,
cuModuleGetFunction, cuFuncGetParamInfo (CUDA >= 12.4) and cuLaunchKernel. Every CUresult is
checked; a failure raises RuntimeError with cuGetErrorName/cuGetErrorString text.
Nothing here is touched before the first launch, so machines without a GPU never load libcuda.
"""

from __future__ import annotations

import ctypes
import threading

CUDA_ERROR_INVALID_VALUE = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

_lock = threading.Lock()
_lib = None
_primary: dict[int, int] = {}  # device ordinal -> retained primary CUcontext

_vp, _u, _sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
_P = ctypes.POINTER
_SIGNATURES = {
    "cuInit": [_u],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_P(_vp), ctypes.c_int],
    "cuCtxGetCurrent": [_P(_vp)],
    "cuCtxSetCurrent": [_vp],
    "cuCtxPushCurrent_v2": [_vp],
    "cuCtxPopCurrent_v2": [_P(_vp)],
    "cuModuleLoadData": [_P(_vp), ctypes.c_char_p],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuFuncSetAttribute": [_vp, ctypes.c_int, ctypes.c_int],
    "cuLaunchKernel": [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _P(_vp), _P(_vp)],
}
_OPTIONAL = {"cuFuncGetParamInfo": [_vp, _sz, _P(_sz), _P(_sz)]}


def lib() -> ctypes.CDLL:
    """libcuda.so.1 with signatures declared and cuInit(0) done (once, thread-safe)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            cuda = ctypes.CDLL("libcuda.so.1")
            for name, argtypes in {**_SIGNATURES, **_OPTIONAL}.items():
                if hasattr(cuda, name):
                    getattr(cuda, name).argtypes = argtypes
                    getattr(cuda, name).restype = ctypes.c_int
            result = cuda.cuInit(0)
            _lib = cuda  # error_text needs it, also for the cuInit failure
            if result != 0:
                try:
                    check(result, "cuInit")
                finally:
                    _lib = None
    return _lib


def error_text(result: int) -> str:
    """'CUDA_ERROR_X: description' for a CUresult."""
    name, desc = ctypes.c_char_p(), ctypes.c_char_p()
    _lib.cuGetErrorName(result, ctypes.byref(name))
    _lib.cuGetErrorString(result, ctypes.byref(desc))
    return f"{(name.value or b'CUDA error %d' % result).decode()}: {(desc.value or b'').decode()}"


def check(result: int, what: str, kernel: str | None = None) -> None:
    """Raise RuntimeError naming ``what`` (and the kernel) when ``result`` is not CUDA_SUCCESS."""
    if result != 0:
        where = f" (kernel {kernel!r})" if kernel else ""
        raise RuntimeError(f"kz_rtc: {what} failed{where}: {error_text(result)}")


def primary_context(device: int) -> int:
    """torch's context for ``device``: the device's primary context, retained once."""
    if device not in _primary:
        cu = lib()
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _primary[device] = ctx.value
    return _primary[device]


def enter_context(device: int) -> bool:
    """Make ``device``'s primary context current: set it when none is, push it when another is.

    Returns True when a context was pushed; the caller then calls leave_context() after its work.
    """
    cu = lib()
    want = primary_context(device)
    cur = ctypes.c_void_p()
    check(cu.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
    if cur.value == want:
        return False
    if not cur.value:
        check(cu.cuCtxSetCurrent(want), "cuCtxSetCurrent")
        return False
    check(cu.cuCtxPushCurrent_v2(want), "cuCtxPushCurrent")
    return True


def leave_context() -> None:
    """Undo enter_context's push."""
    lib().cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def load_module(cubin: bytes) -> int:
    """cuModuleLoadData in the current context; returns the CUmodule handle."""
    mod = ctypes.c_void_p()
    check(lib().cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
    return mod.value


def get_function(module: int, name: str) -> int:
    """cuModuleGetFunction; returns the CUfunction handle."""
    fn = ctypes.c_void_p()
    check(lib().cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction", name)
    return fn.value


def param_sizes(function: int, name: str) -> list[int] | None:
    """Byte size of each kernel parameter via cuFuncGetParamInfo; None when the driver lacks it."""
    cu = lib()
    if not hasattr(cu, "cuFuncGetParamInfo"):
        return None
    sizes, offset, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    while True:
        r = cu.cuFuncGetParamInfo(function, len(sizes), ctypes.byref(offset), ctypes.byref(size))
        if r == CUDA_ERROR_INVALID_VALUE:
            return sizes
        check(r, "cuFuncGetParamInfo", name)
        sizes.append(size.value)


def set_max_dynamic_shared(function: int, nbytes: int, name: str) -> None:
    """Allow more than 48 KiB of dynamic shared memory for ``function``."""
    check(lib().cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", name)


_array_types: dict[int, type] = {}


def _pointer_array(n: int) -> type:
    """ctypes.c_void_p * n, made once per n."""
    if n not in _array_types:
        _array_types[n] = ctypes.c_void_p * n
    return _array_types[n]


def launch(function: int, grid, block, shared_mem: int, stream: int, params: list, name: str) -> None:
    """cuLaunchKernel with kernelParams pointing at each ctypes object of ``params``."""
    array = _pointer_array(len(params))(*map(ctypes.addressof, params)) if params else None
    check(lib().cuLaunchKernel(function, *grid, *block, shared_mem, stream, array, None), "cuLaunchKernel", name)
