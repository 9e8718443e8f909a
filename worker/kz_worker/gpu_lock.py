"""One GPU, several evaluation workers: timings run alone, everything else shares.

Workers on the same GPU take a lock file per GPU (named by its UUID, so workers that see the GPU
under different CUDA_VISIBLE_DEVICES indices agree): GPU work that is not timed (reference
outputs, correctness trials, the recheck) holds it shared, a timing holds it exclusive. So a
timing never overlaps another timing or any other kz work on its GPU, while compilation, Python
start-up and correctness checks of other candidates go on around it.

flock(2) favours neither side, so a steady stream of shared holders could starve a timing: a
second lock, the turnstile, is taken exclusive by everyone for the moment of entering, and held by
a waiting timing until it gets the GPU, so no new shared holder slips in ahead of it.

The locks are advisory. A candidate that takes one and never lets go stalls the other workers
only until its own stage deadline kills it (the kernel drops a dead process's locks).
"""
import contextlib
import fcntl
import functools
import os
import stat
import time

import torch


def lock_file_stem(gpu_name: str) -> str:
    """"gpu-<UUID>" for a GPU's (or a MIG instance's) lock files, without nvidia-smi's "GPU-" or
    "MIG-" prefix (torch has none). The supervisor names the files it makes alike
    (eval/src/sandbox.cpp, gpu_lock_file_stem)."""
    name = gpu_name[4:] if gpu_name.startswith(("GPU-", "MIG-")) else gpu_name
    return "gpu-" + "".join(c if c.isalnum() or c == "-" else "_" for c in name)


class LockFileMissing(RuntimeError):
    """The machine's set-up, not the candidate's doing: the evaluation is an infra_error."""


_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # never a link, never a FIFO's wait


def _open_lock_file(path: str) -> int:
    """The supervisor makes each GPU's lock files in a directory read-only to workers (flock needs
    no write access), so no candidate can unlink one and split the lock. Where nothing stops it
    (the read-only mount off, a test's own dir) a missing file is made here, as the harness's own
    write, not the candidate's: under the read-only mount it fails, and the evaluation is the
    machine's infra_error."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        fd = _make_lock_file(path)
    except OSError as exc:  # ELOOP: a symlink in its place
        raise LockFileMissing(f"GPU lock file {path} cannot be opened ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockFileMissing(f"GPU lock file {path} is not a regular file")
    return fd


def _make_lock_file(path: str) -> int:
    from . import sandbox
    try:
        with sandbox.unaudited():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, _OPEN_FLAGS | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LockFileMissing(f"GPU lock file {path} is missing and cannot be made here ({exc.strerror}): the "
                              "supervisor makes one per GPU UUID it finds (nvidia-smi -L, /proc/driver/nvidia)") from exc


class GpuLock:
    def __init__(self, lock_dir: str, gpu_name: str, device=None):
        base = os.path.join(lock_dir, lock_file_stem(gpu_name))
        self.gpu_fd = _open_lock_file(base + ".lock")
        self.turnstile_fd = _open_lock_file(base + ".turnstile")
        self.device = device  # synchronised before each release (None: no CUDA device, nothing to wait for)
        self.mode = None  # None, "shared" or "exclusive": what this process holds now
        # Seconds spent waiting for the lock (both modes) and holding it exclusive: where an
        # evaluation's time went when workers share a GPU (the verdict profile's gpu_wait_s, gpu_exclusive_s).
        self.waited_s = 0.0
        self.exclusive_s = 0.0

    @contextlib.contextmanager
    def shared(self):
        """GPU work other than timing; nests inside another hold (then does nothing)."""
        if self.mode is not None:
            yield
            return
        self._through_turnstile(fcntl.LOCK_SH)
        yield from self._held("shared")

    @contextlib.contextmanager
    def exclusive(self):
        """A timing: waits until no other worker uses the GPU, and keeps new ones out."""
        assert self.mode is None, "the GPU lock is not re-entrant across modes"
        self._through_turnstile(fcntl.LOCK_EX)
        yield from self._held("exclusive")

    @contextlib.contextmanager
    def released(self):
        """Inside a shared hold: lets go of the GPU for CPU work that needs none (a kernel compiled in
        the middle of a forward: Triton's JIT, kz_rtc, load_inline), then takes it again, shared,
        behind any timing that came meanwhile. A shared hold that lasts a compile would keep a
        waiting timing, and every worker queued behind it, off the GPU. Elsewhere (no hold, an
        exclusive one, or while the stream captures a CUDA graph, which a synchronize would break) it
        does nothing."""
        if self.mode != "shared" or (self.device is not None and torch.cuda.is_current_stream_capturing()):
            yield
            return
        self.mode = None
        try:
            if self.device is not None:  # this process's queued work must not run into a timing
                torch.cuda.synchronize(self.device)
        finally:
            fcntl.flock(self.gpu_fd, fcntl.LOCK_UN)
        try:
            yield
        finally:
            self._through_turnstile(fcntl.LOCK_SH)
            self.mode = "shared"

    def _through_turnstile(self, gpu_mode):
        """Takes the GPU lock in gpu_mode while holding the turnstile, so nobody arriving later
        gets ahead of a waiting timing."""
        start = time.monotonic()
        fcntl.flock(self.turnstile_fd, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.gpu_fd, gpu_mode)
        finally:
            fcntl.flock(self.turnstile_fd, fcntl.LOCK_UN)
            self.waited_s += time.monotonic() - start

    def _held(self, mode):
        self.mode = mode
        start = time.monotonic()
        try:
            yield
        finally:
            self.mode = None
            try:
                if self.device is not None:  # work still queued would run into the next holder's timing
                    torch.cuda.synchronize(self.device)
            finally:
                fcntl.flock(self.gpu_fd, fcntl.LOCK_UN)
            if mode == "exclusive":
                self.exclusive_s += time.monotonic() - start

    def report(self) -> dict:
        return {"gpu_wait_s": self.waited_s, "gpu_exclusive_s": self.exclusive_s}


class NoLock:
    """The CPU, or [tuning] exclusive_timing = false."""

    waited_s = 0.0  # never waits (GpuLock's counter, which the harness reads per stage)

    def report(self) -> dict:
        return {}

    @contextlib.contextmanager
    def shared(self):
        yield

    @contextlib.contextmanager
    def exclusive(self):
        yield

    @contextlib.contextmanager
    def released(self):
        yield


def gpu_name(device: torch.device) -> str:
    """What names `device`'s lock files: its UUID (see lock_file_stem)."""
    props = torch.cuda.get_device_properties(device)
    return str(getattr(props, "uuid", "")) or f"index{device.index or 0}"


def gpu_stem(device: torch.device) -> str:
    return lock_file_stem(gpu_name(device))


def for_request(request: dict, device: torch.device):
    """The request's lock, which also becomes this process's (released() below)."""
    global _process_lock
    lock_dir = request.get("gpu_lock_dir") or ""
    if device.type != "cuda" or not lock_dir:
        _process_lock = NoLock()
    else:
        _process_lock = GpuLock(lock_dir, gpu_name(device), device)
    return _process_lock


# The evaluation's lock, set before the harness's identity snapshot (which then protects it): the
# compile hooks (cheats.install_launch_hooks, compile/load_inline.py's wrapper) reach it through released().
_process_lock = NoLock()


def released():
    """This process's lock, let go of for the block where a shared hold is under way (GpuLock.released)."""
    return _process_lock.released()


def releasing(compile_function):
    """compile_function, run with this process's lock let go of where a shared hold is under way: a
    compile is CPU work, and one inside a forward would otherwise hold the GPU for seconds."""
    @functools.wraps(compile_function)
    def compiling(*args, **kwargs):
        with released():
            return compile_function(*args, **kwargs)
    return compiling
