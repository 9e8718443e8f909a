"""How an exception raised by candidate code becomes a verdict's status and check."""
import errno

import torch

from . import verdict as v


def classify_exception(exc: BaseException, stage: str):
    """(status, check) for an exception raised by candidate code in `stage`."""
    if is_compile_exception(exc):
        return (v.INFRA_ERROR, v.BUILD_KILLED) if is_killed_build(exc) else (v.COMPILE_ERROR, v.KERNEL_COMPILE)
    # A refused allocation (the sandbox's CPU address-space limit, the GPU memory fraction, or the
    # machine's memory) is an ordinary failure of the kernel, as a CUDA OOM is: runtime_error.
    if is_memory_exception(exc):
        return v.RUNTIME_ERROR, v.MEMORY_LIMIT
    if _chain_has(exc, lambda e: isinstance(e, OSError) and e.errno == errno.EFBIG):  # SIGXFSZ ignored
        return v.SANDBOX_VIOLATION, v.FILE_SIZE_LIMIT
    if stage == "compile":
        return v.RUNTIME_ERROR, v.CONSTRUCTOR_FAILED
    return v.RUNTIME_ERROR, v.FORWARD_FAILED


def _chain_has(exc: BaseException, test) -> bool:
    """test() on the exception and the ones it was raised from (a few levels)."""
    for _ in range(6):
        if exc is None:
            return False
        if test(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_OUT_OF_MEMORY = ("DefaultCPUAllocator: not enough memory", "DefaultCPUAllocator: can't allocate memory",
                  "CUDA out of memory", "Cannot allocate memory", "CUDA error: out of memory",
                  "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_memory_exception(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    return _chain_has(exc, lambda e: isinstance(e, (MemoryError, oom))
                      or (isinstance(e, RuntimeError) and any(text in str(e) for text in _OUT_OF_MEMORY)))


# What a compiler killed by SIGKILL leaves in the build's log: nvcc's words for its cicc or ptxas,
# gcc's for its cc1plus.
_KILLED_COMPILER = ("died due to signal 9", "Killed signal terminated program")
# A diagnostic of the source (nvcc's "file(10): error:", gcc's "file:10:5: error:"), or kz-nvcc's word
# that a step failed and it ended the build's other steps (which then die by SIGKILL, exit 137).
_SOURCE_ERROR = (": error", "this compile failed")


def is_killed_build(exc: BaseException) -> bool:
    """A build whose compiler the log shows killed by SIGKILL (the kernel's out-of-memory killer on a
    crowded machine), with no error of the source in it: the machine's answer, not the candidate's.
    ninja's exit status alone says nothing: it is 137 too where kz-nvcc ended the other steps of a
    build with a real error, and the log is not in the message where the candidate built verbosely."""
    def killed(e):
        return isinstance(e, RuntimeError) and any(text in str(e) for text in _KILLED_COMPILER)

    def source_error(e):
        return any(text in str(e) for text in _SOURCE_ERROR)
    return _chain_has(exc, killed) and not _chain_has(exc, source_error)


def is_compile_exception(exc: BaseException) -> bool:
    kind = type(exc)
    if kind.__name__ == "CompileError" and kind.__module__.startswith("kz_rtc"):
        return True
    if kind.__module__.startswith("triton") and "Compil" in kind.__name__:
        return True
    # Under TRITON_INTERPRET=1 (the CPU) there is no Triton frontend: a kernel body using an
    # unknown tl function or mistyped values fails while interpreted, wrapped in InterpreterError.
    # On a GPU the same errors are CompilationErrors, so classify them alike. (Assertions and
    # NotImplementedError, i.e. device_assert or an interpreter limitation, stay runtime errors.)
    if kind.__name__ == "InterpreterError" and kind.__module__.startswith("triton"):
        return isinstance(exc.__cause__, (AttributeError, NameError, TypeError, ValueError))
    return isinstance(exc, RuntimeError) and "Error building extension" in str(exc)
