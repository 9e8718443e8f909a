"""What differs between kernel formats: how a candidate compiles and whether it can run on this
device.

  cuda      KernelBench's format: load_inline at import time (nvcc + the host compiler; load_inline.py).
  triton    @triton.jit kernels; on the CPU they run under the Triton interpreter.
  cuda-rtc  extern "C" kernels compiled by NVRTC through kz_rtc (docs/formats.md).
  torch     plain PyTorch (ModelNew, or Model for the reference-as-candidate sanity check).

On a CPU-only machine `cuda` and `cuda-rtc` candidates are really compiled (nvcc / NVRTC) but
cannot run: their verdict is compiled_not_run, never ok.
"""
import math
import os
import re

import torch

from . import load_inline
from .. import verdict as v


def prepare(fmt: str, device: torch.device, extensions=None, mute_extensions: bool = False) -> None:
    """`extensions` (the request's, for a `cuda` candidate): {"dir": where its builds go, in its own
    scratch dir; "prebuilt": the supervisor's kept builds of this very candidate, or None}.
    mute_extensions: the modules load_inline returns can be muted for the effect probe
    (cheats.muteable_extension; policy kernelbench)."""
    # An fp32 reference means fp32: TF32 would put the reference itself ~1e-3 off.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if fmt == "cuda-rtc":
        import kz_rtc
        kz_rtc.set_compile_only(device.type != "cuda")
    if fmt == "cuda":
        kept_dir = None
        if extensions:
            os.environ["TORCH_EXTENSIONS_DIR"] = extensions["dir"]
            kept_dir = extensions.get("prebuilt")
        if device.type != "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            # No GPU to take the architecture from: torch's default then fails (IndexError in
            # _get_cuda_arch_flags). Build for kz_rtc's compile-only target instead.
            os.environ["TORCH_CUDA_ARCH_LIST"] = load_inline.torch_arch_list(os.environ.get("KZ_RTC_ARCH", "sm_90"))
        load_inline.builds.install(kept_dir, muteable=mute_extensions)


def nvrtc_seconds(fmt: str):
    """kz_rtc's NVRTC seconds so far in this process for a `cuda-rtc` request (a verdict profile's compile_s
    part), else None (another format, or anything gone wrong: the candidate runs in this process and
    could replace kz_rtc's function). Diagnostics only."""
    if fmt != "cuda-rtc":
        return None
    try:
        import kz_rtc
        seconds = kz_rtc.compile_seconds()
    except Exception:
        return None
    return float(seconds) if type(seconds) is float and math.isfinite(seconds) else None


def note_nvrtc_seconds(fmt: str, before, into: dict) -> None:
    """into["nvrtc"]: NVRTC's seconds since `before` (nvrtc_seconds at the compile stage's start)."""
    after = nvrtc_seconds(fmt)
    if before is not None and after is not None:
        into["nvrtc"] = after - before


def model_class_name(fmt: str, source: str) -> str:
    if fmt == "torch" and not re.search(r"^class\s+ModelNew\b", source, re.M):
        return "Model"
    return "ModelNew"


def runnable(fmt: str, device: torch.device) -> bool:
    return device.type == "cuda" or fmt in ("triton", "torch")


def finish_compile_only(fmt, candidate_model, reference, seed, device) -> None:
    """Makes sure something was really compiled before reporting compiled_not_run."""
    if fmt == "cuda-rtc":
        import kz_rtc
        if not kz_rtc.compiled_modules():
            # Some candidates compile lazily in forward; run it until its first launch.
            try:
                with torch.no_grad():
                    candidate_model(*reference.inputs(seed, device))
            except kz_rtc.NotRunnable:
                pass
            except kz_rtc.CompileError:
                raise
            except Exception:
                pass  # CPU tensors where the kernel expects CUDA ones: only compilation matters here
        if not kz_rtc.compiled_modules():
            raise v.Failure(v.FORMAT_ERROR, "no kernel was compiled through kz_rtc.compile", [v.NO_KERNEL_COMPILED])
    elif fmt == "cuda" and not load_inline.builds.names:
        raise v.Failure(v.FORMAT_ERROR, "no CUDA extension was built with load_inline", [v.NO_KERNEL_COMPILED])


def compile_only_message(fmt: str, device: torch.device) -> str:
    if device.type == "cuda":
        return "compiled (compile-only request)"
    tool = {"cuda": "nvcc (load_inline)", "cuda-rtc": "NVRTC"}.get(fmt, fmt)
    return f"compiled with {tool}; not run: no GPU on this machine"
