"""Verdict statuses and check names shared with the C++ side (eval/include/kz/eval/verdict.h).

A check is a named rule that fired; a verdict lists every check that fired, so a failure always
says which rule caught it."""
import traceback

# Statuses, in the order of the stage that produces them.
OK = "ok"
COMPILED_NOT_RUN = "compiled_not_run"  # CPU machine: cuda / cuda-rtc sources compiled, not run
FORMAT_ERROR = "format_error"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
INCORRECT = "incorrect"
TIMEOUT = "timeout"
CHEAT_DETECTED = "cheat_detected"
SANDBOX_VIOLATION = "sandbox_violation"
INFRA_ERROR = "infra_error"

# Checks.
NO_MODEL_NEW = "no_model_new"
PYTHON_SYNTAX = "python_syntax"
KERNEL_COMPILE = "kernel_compile"
NO_KERNEL_COMPILED = "no_kernel_compiled"
CONSTRUCTOR_FAILED = "constructor_failed"
FORWARD_FAILED = "forward_failed"
OUTPUT_TYPE = "output_type"
OUTPUT_STRUCTURE = "output_structure"
OUTPUT_SHAPE = "output_shape"
OUTPUT_DTYPE = "output_dtype"
OUTPUT_DEVICE = "output_device"
OUTPUT_NOT_FINITE = "output_not_finite"
OUTPUT_MISMATCH = "output_mismatch"
OUTPUT_NORM_MISMATCH = "output_norm_mismatch"
OUTPUT_ALIASES_INPUT = "output_aliases_input"
INPUT_MUTATED = "input_mutated"
WRONG_AFTER_TIMING = "wrong_after_timing"
REFERENCE_FAILED = "reference_failed"


class Failure(Exception):
    """Ends an evaluation with a verdict: a status, the checks that fired and a message."""

    def __init__(self, status, message, checks=()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.checks = list(checks)


def describe_exception(exc: BaseException, limit_chars: int = 4000) -> str:
    """The exception type, message and the innermost frames, cut to a readable length."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit_chars else "...\n" + text[-limit_chars:]
