"""NVRTC through ctypes: find libnvrtc, compile one CUDA source to a CUBIN.

No CUDA Python bindings are needed: the library is found on the file system (see ``find_library``)
and called through ctypes. Only compilation happens here; nothing in this file needs a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import sys
import threading
from typing import Sequence

_lock = threading.Lock()
_lib = None
_lib_path: str | None = None


class CompileError(RuntimeError):
    """NVRTC refused a source; the message holds the module name and the full NVRTC log."""


def cuda_home() -> str:
    """The CUDA toolkit root: $CUDA_HOME, $CUDA_PATH, else /usr/local/cuda."""
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def _version_key(path: str) -> tuple:
    """Sort key: libraries matching torch's CUDA major first, then higher versions first."""
    nums = tuple(int(x) for x in re.findall(r"\.(\d+)", os.path.basename(path)))
    major = _torch_cuda_major()
    return (0 if major is not None and nums[:1] == (major,) else 1, tuple(-n for n in nums))


def _torch_cuda_major() -> int | None:
    try:
        import torch

        return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    except Exception:
        return None


def _wheel_candidates() -> list[str]:
    """libnvrtc.so* of the nvidia-cuda-nvrtc pip wheel, searched in every site-packages on sys.path."""
    found = []
    for entry in dict.fromkeys(p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))):
        found += glob.glob(os.path.join(entry, "nvidia", "**", "lib", "libnvrtc.so*"), recursive=True)
    return sorted(found, key=_version_key)


def _toolkit_candidates() -> list[str]:
    """libnvrtc.so* under $CUDA_HOME/lib64 and /usr/local/cuda/lib64."""
    found = []
    for home in dict.fromkeys([cuda_home(), "/usr/local/cuda"]):
        found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), key=_version_key)
    return found


def library_candidates() -> list[str]:
    """Where libnvrtc is looked for, in order (KZ_NVRTC_LIB, pip wheel, toolkit, loader names)."""
    env = os.environ.get("KZ_NVRTC_LIB")
    names = [env] if env else []
    names += _wheel_candidates() + _toolkit_candidates()
    found = ctypes.util.find_library("nvrtc")
    names += [found] if found else []
    return names + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give the NVRTC functions used here their C signatures."""
    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcGetErrorString": [ctypes.c_int],
        "nvrtcCreateProgram": [ctypes.POINTER(vp), cp, cp, ctypes.c_int, vp, vp],
        "nvrtcDestroyProgram": [ctypes.POINTER(vp)],
        "nvrtcCompileProgram": [vp, ctypes.c_int, ctypes.POINTER(cp)],
        "nvrtcGetProgramLogSize": [vp, ctypes.POINTER(sz)],
        "nvrtcGetProgramLog": [vp, cp],
        "nvrtcGetCUBINSize": [vp, ctypes.POINTER(sz)],
        "nvrtcGetCUBIN": [vp, cp],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_char_p if name == "nvrtcGetErrorString" else ctypes.c_int
    return lib


def load_library() -> ctypes.CDLL:
    """Load libnvrtc once (thread-safe); raise OSError listing every place tried."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for name in library_candidates():
            try:
                _lib = _declare(ctypes.CDLL(name))
                _lib_path = name
                return _lib
            except (OSError, AttributeError) as exc:
                errors.append(f"  {name}: {exc}")
        raise OSError("kz_rtc: could not load libnvrtc; tried:\n" + "\n".join(errors))


def library_path() -> str | None:
    """The libnvrtc that was loaded (None before the first compile)."""
    return _lib_path


def version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    lib = load_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def default_include_dirs() -> list[str]:
    """Headers matching the loaded NVRTC first (a wheel's include/), then $CUDA_HOME/include."""
    dirs = []
    if _lib_path and os.path.isabs(_lib_path):
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(_lib_path)), "include"))
    dirs.append(os.path.join(cuda_home(), "include"))
    return [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]


def _check(lib, result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"kz_rtc: {what} failed: {lib.nvrtcGetErrorString(result).decode()}")


def _log(lib, prog) -> str:
    size = ctypes.c_size_t()
    _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
    buf = ctypes.create_string_buffer(max(size.value, 1))
    _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.value.decode(errors="replace").strip()


def _cubin(lib, prog) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
    return buf.raw


def compile_to_cubin(source: str, name: str, options: Sequence[str]) -> tuple[bytes, str]:
    """Compile ``source`` with ``options`` (which must name --gpu-architecture=sm_XX); return (cubin, log)."""
    lib = load_library()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        result = lib.nvrtcCompileProgram(prog, len(options), opts)
        log = _log(lib, prog)
        if result != 0:
            raise CompileError(
                f"kz_rtc: NVRTC could not compile module {name!r} "
                f"({lib.nvrtcGetErrorString(result).decode()}); options: {' '.join(options)}\n{log}")
        return _cubin(lib, prog), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
