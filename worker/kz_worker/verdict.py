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
# Anti-cheating checks (cheats.py; the static ones run in the supervisor, eval/src/static_checks.cpp).
HARNESS_PATCHED = "harness_patched"                    # torch / the harness / timers changed, or a mode left active
REFERENCE_TAMPERED = "reference_tampered"              # the live reference no longer matches its precomputed output
TORCH_COMPUTE_IN_FORWARD = "torch_compute_in_forward"  # ATen compute ops traced inside ModelNew.forward
NO_CUSTOM_KERNEL = "no_custom_kernel"                  # forward launched no kernel of the candidate's own
NO_KERNEL_EFFECT = "no_kernel_effect"                  # kernelbench policy: with its launches muted, the same output
LOW_CUSTOM_KERNEL_SHARE = "low_custom_kernel_share"    # its kernels' share of GPU time below [policy]'s minimum
OUTPUT_ALIASES_REFERENCE = "output_aliases_reference"  # the output shares memory with a reference output
REPLAYED_OUTPUT = "replayed_output"                    # bitwise the same output for inputs whose references differ
WRONG_DURING_TIMING = "wrong_during_timing"            # a sampled timed output was wrong
BACKGROUND_THREAD = "background_thread"                # threads started by the candidate
INHERITS_REFERENCE = "inherits_reference"              # static: ModelNew subclasses the reference's class
SIDE_STREAM = "side_stream"                            # static: CUDA streams of its own
TENSOR_SUBCLASS = "tensor_subclass"                    # static: Tensor subclasses, __torch_function__, modes
HARNESS_ACCESS = "harness_access"                      # static, and the audit hook: touches the harness, frames, gc...
FORGED_MESSAGE = "forged_message"                      # supervisor: a message without the request's token
# Sandbox checks (the supervisor's limits, and sandbox.py's audit hook in the worker).
CPU_LIMIT = "cpu_limit"                # killed at its CPU-time limit (SIGXCPU)
FILE_SIZE_LIMIT = "file_size_limit"    # a write past the file size limit (SIGXFSZ / EFBIG)
SCRATCH_LIMIT = "scratch_limit"        # the scratch dir past [sandbox] scratch_mb / scratch_files (the supervisor's)
PROCESS_LIMIT = "process_limit"        # more processes/threads than the cap; the group was killed
MEMORY_LIMIT = "memory_limit"          # an allocation refused (CPU address-space limit, GPU memory fraction)
NETWORK_ACCESS = "network_access"      # a socket connect / sendto
FILESYSTEM_WRITE = "filesystem_write"  # a write, remove, rename... outside scratch and the caches
PROCESS_SPAWN = "process_spawn"        # candidate code started a process (fork, subprocess, system, exec)
PROCESS_SIGNAL = "process_signal"      # candidate code signalled a process outside its own group
# GPU memory checks (gpu_memory.py), all INFRA_ERROR: the GPU's, not the candidate's. A candidate's
# own out-of-memory with the GPU to itself stays RUNTIME_ERROR with MEMORY_LIMIT.
OUT_OF_MEMORY_SHARED = "out_of_memory_shared"  # a CUDA OOM while other evaluations held memory on the GPU (retried alone)
EXCEEDS_GPU_MEMORY = "exceeds_gpu_memory"      # the task (reference + harness) needs more than the card gives one evaluation
GPU_MEMORY_HELD_ELSEWHERE = "gpu_memory_held_elsewhere"  # memory the slots promise held outside every evaluation's slots
# The machine's, INFRA_ERROR too: a build whose compiler was killed (SIGKILL: the machine's memory).
BUILD_KILLED = "build_killed"


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
