"""GPU memory: what one evaluation needs, and a reservation of it among the evaluations of one GPU.

The need is estimated before anything is allocated on the device: the reference is built and run once
on PyTorch's meta device (shapes only, no data), which gives its weights, its inputs and the peak of
the tensors alive during its forward (intermediates and output). The harness's own footprint is a
fixed multiple of those (`budget_bytes`): it holds one input set at a time, regenerates the others
from their seeds and keeps only fingerprints of the reference outputs (harness.Expected), and
compares in chunks (correctness.py). Where the meta run fails (an op without a meta kernel, a
data-dependent shape), the evaluation reserves the whole GPU, measures the reference for real and
gives back what it does not need.

The reservation: the share of the card that evaluations may use (`capacity_bytes`: the per-process
limit, within what the CUDA contexts of every worker process that may live on it leave) is cut into SLOTS slots, each a lock
file that the supervisor makes per GPU (eval/src/sandbox.cpp; read-only to workers, as flock needs no
write access). An evaluation takes ceil(need / slot) of them, exclusive, and holds them until its
process ends (the kernel drops a dead process's locks, so a killed worker frees its memory). Slots
are taken one after another while holding a turnstile, so two evaluations never each hold part of
what the other waits for: the one at the turnstile waits for slots, which only ever get released,
and the others queue behind it in order. Small tasks share the GPU, a task that needs every slot
runs alone.
"""
import dataclasses
import fcntl
import math
import os
import re
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import verdict as v

# The number of slot files per GPU: eval/src/sandbox.cpp's kGpuMemorySlots must be the same.
SLOTS = 16
# A worker process's CUDA context with PyTorch's kernels loaded (measured ~0.5-0.6 GiB on an H100 and
# an H200), counted for every process that may live on the GPU, waiting or working.
CONTEXT_BYTES = 768 << 20
# Room beyond the estimate: library workspaces (cuBLAS, cuDNN), the allocator's rounding and
# fragmentation, the poison fill (correctness.poison_free_memory, at most 1 GiB), chunked comparisons.
MARGIN_BYTES = 1 << 30
MARGIN_SHARE = 0.10
# The timing's rotating input buffers (harness._timed_runs) take at most this much where the request
# asks for more sets than fit: rotation defeats caching in the 50 MB L2 and by pointer, which two
# buffers of a large input do as well as four.
TIMING_BUFFERS_BYTES = 2 << 30


@dataclasses.dataclass
class Footprint:
    """The reference's own memory, in bytes: its weights, one input set, and the peak of the tensors
    its forward holds at once (its output included), beyond the inputs."""
    weights: int
    inputs: int
    forward_peak: int
    estimate: str  # "meta" (shapes on the meta device) or "measured" (on the GPU, alone)

    @property
    def reference_peak(self) -> int:
        return self.weights + self.inputs + self.forward_peak


def timing_sets(requested: int, input_bytes: int) -> int:
    """Input buffers the timing rotates: the request's number, fewer (at least 2) where they would
    take more than TIMING_BUFFERS_BYTES."""
    if requested <= 2 or requested * input_bytes <= TIMING_BUFFERS_BYTES:
        return requested
    return max(2, TIMING_BUFFERS_BYTES // max(1, input_bytes))


def budget_bytes(fp: Footprint, timing_buffers: int) -> int:
    """What one evaluation holds at its peak: both models' weights; in a correctness trial the input
    set, its regenerated original (to check it was not modified), the candidate's output and the live
    reference's, each forward's intermediates (the candidate's counted like the reference's); in the
    timing its buffers, one set regenerated for a new round and one forward. Plus the margin."""
    trial = 2 * fp.inputs + 2 * fp.forward_peak
    timing = (timing_buffers + 1) * fp.inputs + 2 * fp.forward_peak
    need = 2 * fp.weights + max(trial, timing)
    return int(need * (1 + MARGIN_SHARE)) + MARGIN_BYTES


def capacity_bytes(card_bytes: int, memory_fraction: float, processes: int) -> int:
    """The part of the card that evaluations share: the per-process limit the harness sets
    (set_per_process_memory_fraction), and no more than the card leaves beside the CUDA contexts of
    every process that may live on it."""
    return max(0, min(int(card_bytes * memory_fraction), card_bytes - max(1, processes) * CONTEXT_BYTES))


# ---- the estimate ------------------------------------------------------------------------------------

class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the tensors that ops make and that are still referenced, and their peak: on
    the meta device, the memory a forward would hold at most (views and in-place results are not new
    memory)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {id(a) for a in args if isinstance(a, torch.Tensor)}
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and id(t) not in seen and not t._is_view():
                size = t.numel() * t.element_size()
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, size)
        return out

    def _freed(self, size):
        self.live -= size


def nbytes(values) -> int:
    """The bytes of values' tensors (nested in tuples and lists)."""
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (tuple, list)):
        return sum(nbytes(x) for x in values)
    return 0


def estimate_on_meta(reference, init_inputs, seed: int) -> Footprint:
    """The reference built and run on the meta device. Raises what the meta run raises (the caller
    falls back to a measurement)."""
    meta = torch.device("meta")
    with torch.device(meta):
        model = reference.build(init_inputs, seed, meta)
        inputs = reference.inputs(seed, meta)
    weights = sum(nbytes(t) for t in list(model.parameters()) + list(model.buffers()))
    counter = _LiveBytes()
    with torch.no_grad(), counter:
        out = model(*inputs)
    return Footprint(weights=weights, inputs=nbytes(inputs), forward_peak=max(counter.peak, nbytes(out)),
                     estimate="meta")


# ---- the reservation ---------------------------------------------------------------------------------

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# How often a worker that holds the turnstile looks for freed slots.
POLL_S = 0.02
# Memory the slots promise that the card still lacks (await_device_memory): how long to wait for it
# before going on anyway where the request does not say ([timeouts] device_memory_wait_s, whose
# default this is), and how often to look.
DEVICE_WAIT_S = 30.0
DEVICE_POLL_S = 0.25


class Reservation:
    """Slots held by this process on one GPU (none until reserve())."""

    def __init__(self, lock_dir: str, stem: str, capacity: int):
        self.capacity = capacity
        self.slot_bytes = capacity / SLOTS if capacity else 0
        self._paths = [os.path.join(lock_dir, f"{stem}.memory-slot-{i}") for i in range(SLOTS)]
        self._turnstile = os.path.join(lock_dir, f"{stem}.memory-turnstile")
        self._held = {}  # slot index -> fd
        self.need = 0  # the bytes the slots were taken for
        self.waited_s = 0.0

    @property
    def slots(self) -> int:
        return len(self._held)

    @property
    def reserved_bytes(self) -> int:
        return int(self.slots * self.slot_bytes)

    @property
    def spare_bytes(self) -> int:
        """What the slots hold beyond the need (rounded up to whole slots): room for extras."""
        return max(0, self.reserved_bytes - self.need)

    @property
    def alone(self) -> bool:
        return self.slots == SLOTS

    def slots_for(self, need: int) -> int:
        return SLOTS if not self.slot_bytes else min(SLOTS, max(1, math.ceil(need / self.slot_bytes)))

    def reserve(self, need: int, alone: bool, on_wait=lambda: None) -> None:
        """Takes the slots that `need` bytes take (every slot where `alone`), waiting for them behind
        the turnstile; on_wait() is called once if it has to wait."""
        wanted = SLOTS if alone else self.slots_for(need)
        self.need = need
        start = time.monotonic()
        waiting = False
        turnstile = _open(self._turnstile)
        try:
            if not _try_flock(turnstile):
                waiting = True
                on_wait()
                fcntl.flock(turnstile, fcntl.LOCK_EX)
            while self.slots < wanted:
                for i, path in enumerate(self._paths):
                    if self.slots >= wanted:
                        break
                    if i in self._held:
                        continue
                    fd = _open(path)
                    if _try_flock(fd):
                        self._held[i] = fd
                    else:
                        os.close(fd)
                if self.slots < wanted:
                    if not waiting:
                        waiting = True
                        on_wait()
                    time.sleep(POLL_S)
        finally:
            os.close(turnstile)  # drops the turnstile's lock
            self.waited_s += time.monotonic() - start

    def shrink_to(self, need: int) -> None:
        """Gives back the slots beyond what `need` bytes take (after a measurement)."""
        keep = self.slots_for(need)
        self.need = need
        for i in sorted(self._held)[keep:]:
            os.close(self._held.pop(i))

    def release(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()


# ---- memory the slots promise but the card lacks ----------------------------------------------------

def device_memory(device: torch.device) -> tuple:
    """(free bytes on the device, bytes this process's allocator holds there)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free, torch.cuda.memory_reserved(device)


def shortfall_bytes(promised: int, free: int, own: int) -> int:
    """What the card lacks of `promised` bytes (what this evaluation's slots promise it) beside what
    this process's allocator already holds: held by processes outside every evaluation's slots, by
    an evaluation past its budget, or outside PyTorch's allocator. The CUDA contexts are outside the
    capacity, so they never count."""
    return max(0, promised - free - own)


def await_device_memory(device: torch.device, need: int, wait_s: float = DEVICE_WAIT_S,
                        on_wait=lambda: None, read=device_memory) -> tuple:
    """Once the slots are held, waits up to wait_s for the card to have `need` bytes for this
    evaluation (within the margin): a worker killed a moment ago frees its slots when its process
    ends, but the driver may take seconds more to free its memory (a context torn down after a fault,
    a long kernel stopped). Budgets are generous, so past wait_s the evaluation goes on anyway: an
    out-of-memory, if one comes, is classified then (Evaluation._out_of_memory). Returns (seconds
    waited, bytes still missing)."""
    start = time.monotonic()
    waited = False
    while True:
        free, own = read(device)
        missing = shortfall_bytes(need, free, own)
        if missing <= MARGIN_BYTES or time.monotonic() - start >= wait_s:
            return time.monotonic() - start, missing
        if not waited:
            waited = True
            on_wait()
        time.sleep(DEVICE_POLL_S)


def requested_bytes(message: str) -> int:
    """The allocation a CUDA out-of-memory message names ("Tried to allocate 8.00 GiB"), 0 if none."""
    found = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", message)
    if not found:
        return 0
    return int(float(found.group(1)) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(found.group(2)))


def held_elsewhere(promised: int, free: int, own: int, requested: int) -> int:
    """After an out-of-memory with every slot held and before any candidate code ran: the bytes of the
    promise held outside this evaluation where that is more than the margin and this evaluation's
    allocator with the failed allocation stayed within the promise (else its own need ran out); 0
    otherwise."""
    missing = shortfall_bytes(promised, free, own)
    return missing if missing > MARGIN_BYTES and own + requested <= promised else 0


def _open(path: str) -> int:
    try:
        return os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        pass
    from . import sandbox  # the supervisor makes them; a test's own writable dir makes them here
    try:
        with sandbox.unaudited():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, _OPEN_FLAGS | os.O_CREAT, 0o644)
    except OSError as exc:  # the machine's set-up, not the candidate's doing
        raise v.Failure(v.INFRA_ERROR, f"GPU memory slot file {path} is missing and cannot be made here "
                                       f"({exc.strerror}): the supervisor makes them with the GPU lock files") from exc


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def exceeds_failure(need: int, capacity: int, card: int, fp: Footprint) -> v.Failure:
    return v.Failure(v.INFRA_ERROR,
                     f"the task needs ~{need / 2**20:,.0f} MiB of GPU memory for one evaluation (reference: "
                     f"weights {fp.weights / 2**20:,.0f} MiB, one input set {fp.inputs / 2**20:,.0f} MiB, forward "
                     f"peak {fp.forward_peak / 2**20:,.0f} MiB); evaluations on this "
                     f"{card / 2**30:.0f} GiB card may use {capacity / 2**20:,.0f} MiB",
                     [v.EXCEEDS_GPU_MEMORY])


def reset_peak(device: torch.device) -> None:
    """Starts the allocator's peak (torch.cuda.max_memory_allocated) afresh, once queued work is done."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
