"""The GPU timing protocol: reference and candidate timed interleaved in one process.

Each timed run: flush the L2 (write a buffer larger than it), record the start event, run the
model on the next of several rotating input sets (so caching results by pointer gains nothing),
record the end event on the same stream as soon as the forward returns, synchronise the whole
device, record a second end event (`synced`). The stream end measures the GPU work queued on the
stream, free of the host's wake-up after the synchronize, which varied a speedup by up to 1.16x
across processes (docs/evaluation.md). The synced end also counts work left running on other
streams: when the candidate's gap between the two ends exceeds the reference's by more than a
margin (choose_end), it left such work, and both models are reported from the synced end instead.
Reported: median and spread of each; speedup = reference median / candidate median.

The launch spin before each start event keeps the GPU busy while the host issues the run, so the
host's launch latency (up to the spin's length) stays out of the sample. Where the driver allows,
the host ends the spin itself once it has issued the whole run (LaunchGate), instead of the GPU
always spinning its full length: the same samples, ~0.15 ms less of the exclusive hold per run.

The harness gets every candidate output after its run, outside the timed region
(`after_candidate`, to verify a sample of them: cheats.py), and is told when a new round over the
input sets begins (`new_round`, to move the input data between buffers, so that a result cached by
pointer turns stale).

Which timed runs have their output checked (sample_runs) and after which the Guard is verified
(guard_runs) is drawn before any candidate code runs; the sampled outputs are copied inside the
exclusive hold (Snapshots) and compared after it.
"""
import ctypes
import random
import statistics
import time
from typing import NamedTuple

import torch

from . import cheats, correctness, errors, gpu_memory, loading

# How much the candidate's median gap may exceed the reference's before its side work counts: above
# the gap's own noise (the host's wake-up after the synchronize), small beside the candidate's time.
GAP_MARGIN_MS = 0.010
GAP_MARGIN_SHARE = 0.05  # of the candidate's stream median


class Sample(NamedTuple):
    stream_ms: float  # start -> end event on the stream, recorded when the forward returned
    synced_ms: float  # start -> event recorded after the device-wide synchronize


class Timer:
    def __init__(self, device: torch.device, l2_flush_mb: int, launch_spin_us: float = 0):
        self.device = device
        self.flush_buffer = torch.empty(max(l2_flush_mb, 1) * (1 << 20) // 4, dtype=torch.float32, device=device)
        self.start, self.end, self.synced = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        self.spin_cycles = int(launch_spin_us * cycles_per_us(device)) if launch_spin_us > 0 else 0
        self.gate = launch_gate(device) if self.spin_cycles else None
        # How each run's launch spin ends (the report's launch_spin): "gated" (by the host, at most
        # spin_cycles), "fixed" (after spin_cycles) or "none".
        self.launch_spin = "none" if not self.spin_cycles else "gated" if self.gate else "fixed"

    def prepare(self, stream) -> None:
        """The GPU work before the start event: the L2 flush, then the launch spin (the GPU stays busy
        while the host issues the forward's launches, so their latency up to the spin's length is
        not in the sample)."""
        self.flush_buffer.zero_()
        if self.gate is not None:
            try:
                self.gate.spin(stream, self.spin_cycles)
                return
            except RuntimeError:  # refused here (a stream of another context): the fixed spin from now on
                self.gate, self.launch_spin = None, "fixed"
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)

    def time_once(self, model, inputs, after=None) -> Sample:
        # The stream the start is on, even if the forward changes the current stream.
        stream = torch.cuda.current_stream(self.device)
        self.prepare(stream)
        self.start.record(stream)
        output = model(*inputs)
        self.end.record(stream)
        if self.gate is not None:
            self.gate.open()  # the whole run is issued: the spin may end
        torch.cuda.synchronize(self.device)
        self.synced.record(stream)
        self.synced.synchronize()
        sample = Sample(self.start.elapsed_time(self.end), self.start.elapsed_time(self.synced))
        if after is not None:
            after(output)
        del output
        return sample


# The launch gate's kernel: one thread spins until the word at `gate` holds `number` (the host
# writes it once it has issued the run) or `max_cycles` of the SM clock have passed. PTX, which the
# driver compiles for whatever GPU it runs on; %clock64 counts what torch.cuda._sleep counts.
GATED_SPIN_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry kz_gated_spin(.param .u64 gate, .param .u32 number, .param .u64 max_cycles)
{
    .reg .pred %p<3>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [gate];
    ld.param.u32 %r1, [number];
    ld.param.u64 %rd2, [max_cycles];
    mov.u64 %rd3, %clock64;
$L_wait:
    ld.volatile.u32 %r2, [%rd1];
    setp.eq.u32 %p1, %r2, %r1;
    @%p1 bra $L_done;
    mov.u64 %rd4, %clock64;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p2, %rd5, %rd2;
    @%p2 bra $L_wait;
$L_done:
    ret;
}
"""

_CU_MEMHOSTALLOC_PORTABLE, _CU_MEMHOSTALLOC_DEVICEMAP = 0x01, 0x02


class LaunchGate:
    """The launch spin, ended by the host: before each start event a one-thread kernel spins until
    the host, having issued the whole run (start event, forward, end event), writes the run's number
    to a word of pinned host memory the GPU reads, or until the spin's cycles are up. The GPU then
    reaches the start event with the whole forward queued behind it, as after a fixed spin at least
    as long as the host took, and it no longer idles out the rest of the spin (~0.15 ms of 0.2 per
    run on the H200, with a forward issued in ~0.05 ms: 224 runs a timing, all in the exclusive hold
    that every other evaluation on the GPU waits for). A forward that waits for the GPU itself (a
    synchronize, an .item()) gets the whole spin, as before. Its own handle on libcuda (not
    kz_rtc's, which candidates use), made before any candidate code runs (process.prepare_device)."""

    def __init__(self, device: torch.device):
        cuda = self._cuda = ctypes.CDLL("libcuda.so.1")
        vp, P = ctypes.c_void_p, ctypes.POINTER
        for name, argtypes in (("cuCtxGetCurrent", [P(vp)]), ("cuDeviceGet", [P(ctypes.c_int), ctypes.c_int]),
                               ("cuDevicePrimaryCtxRetain", [P(vp), ctypes.c_int]), ("cuCtxSetCurrent", [vp]),
                               ("cuModuleLoadData", [P(vp), ctypes.c_char_p]),
                               ("cuModuleGetFunction", [P(vp), vp, ctypes.c_char_p]),
                               ("cuMemHostAlloc", [P(vp), ctypes.c_size_t, ctypes.c_uint]),
                               ("cuMemHostGetDevicePointer_v2", [P(ctypes.c_uint64), vp, ctypes.c_uint]),
                               ("cuLaunchKernel", [vp] + [ctypes.c_uint] * 7 + [vp, P(vp), P(vp)])):
            getattr(cuda, name).argtypes, getattr(cuda, name).restype = argtypes, ctypes.c_int
        self._make_context_current(device.index or 0)
        module, self._function, host = vp(), vp(), vp()
        self._check("cuModuleLoadData", ctypes.byref(module), GATED_SPIN_PTX.encode())
        self._check("cuModuleGetFunction", ctypes.byref(self._function), module, b"kz_gated_spin")
        self._check("cuMemHostAlloc", ctypes.byref(host), 4, _CU_MEMHOSTALLOC_PORTABLE | _CU_MEMHOSTALLOC_DEVICEMAP)
        self._word = ctypes.c_uint32.from_address(host.value)
        self._word.value = 0
        # The kernel's parameters, and the array of their addresses cuLaunchKernel reads.
        self._gate, self._number, self._max_cycles = ctypes.c_uint64(), ctypes.c_uint32(0), ctypes.c_uint64(0)
        self._check("cuMemHostGetDevicePointer_v2", ctypes.byref(self._gate), host, 0)
        self._params = (vp * 3)(*(ctypes.addressof(p) for p in (self._gate, self._number, self._max_cycles)))

    def _check(self, name: str, *args) -> None:
        result = getattr(self._cuda, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name} returned CUresult {result}")

    def _make_context_current(self, ordinal: int) -> None:
        """torch's context (the device's primary one) current on this thread, where it is not yet."""
        current = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", ctypes.byref(current))
        if not current.value:
            device, primary = ctypes.c_int(), ctypes.c_void_p()
            self._check("cuDeviceGet", ctypes.byref(device), ordinal)
            self._check("cuDevicePrimaryCtxRetain", ctypes.byref(primary), device)
            self._check("cuCtxSetCurrent", primary)

    def spin(self, stream, max_cycles: int) -> None:
        """Queues the spin on `stream` for the next run: it ends at open() or after max_cycles."""
        self._number.value = (self._number.value + 1) & 0xFFFFFFFF
        self._max_cycles.value = max_cycles
        self._check("cuLaunchKernel", self._function, 1, 1, 1, 1, 1, 1, 0, stream.cuda_stream, self._params, None)

    def open(self) -> None:
        """Ends the spin queued last (once the GPU reads the word)."""
        self._word.value = self._number.value


# ((device, LaunchGate or None), ...): made while the worker prepares, like _cycles_per_us below; None
# where the driver refused (the spin is then torch.cuda._sleep's, its full length every run).
_launch_gates = ()


def launch_gate(device):
    """The device's LaunchGate, made once per process; None where it cannot be made."""
    global _launch_gates
    for known, gate in _launch_gates:
        if known == str(device):
            return gate
    try:
        gate = LaunchGate(device)
    except (OSError, AttributeError, RuntimeError):  # no libcuda, a driver without a call, a refusal
        gate = None
    _launch_gates += ((str(device), gate),)
    return gate


# ((device, cycles per µs), ...): measured while the worker prepares (process.prepare_device), before
# the harness's identity snapshot; a tuple, so candidate code can replace it (which the snapshot
# sees) but not edit it in place.
_cycles_per_us = ()


CLOCK_PROBES, CLOCK_PROBE_CYCLES = 5, 2_000_000  # ~1 ms each at the H200's 1.98 GHz


def cycles_per_us(device) -> float:
    """torch.cuda._sleep counts GPU clock cycles: measured once per device, at the clock it runs now.
    The fastest of CLOCK_PROBES short spins: while other processes' contexts share the GPU (a cold
    batch's first wave calibrates eight at once), a spin that is switched out reads slower, never
    faster. On the H200, one 10M-cycle spin read 1485-1853 cycles/µs instead of 1976 in three of
    eight workers calibrating at once, and their launch spin would have been that much shorter."""
    global _cycles_per_us
    for known, cycles in _cycles_per_us:
        if known == str(device):
            return cycles
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # wake the clocks
    cycles = 0.0
    for _ in range(CLOCK_PROBES):
        start.record()
        torch.cuda._sleep(CLOCK_PROBE_CYCLES)
        end.record()
        end.synchronize()
        cycles = max(cycles, CLOCK_PROBE_CYCLES / (start.elapsed_time(end) * 1000.0))
    _cycles_per_us += ((str(device), cycles),)
    return cycles


def summarize(samples_ms):
    ordered = sorted(samples_ms)
    n = len(ordered)
    return {
        "median_ms": statistics.median(ordered),
        "mean_ms": statistics.fmean(ordered),
        "std_ms": statistics.pstdev(ordered) if n > 1 else 0.0,
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[int(0.9 * (n - 1))],
        "runs": n,
    }


def median_gap(stream_ms, synced_ms) -> float:
    return statistics.median(b - a for a, b in zip(stream_ms, synced_ms))


def choose_end(ref_stream, ref_synced, cand_stream, cand_synced) -> dict:
    """Which end both models are reported from: "stream", unless the candidate's median gap
    (synced - stream) exceeds the reference's by more than the margin, which means it left GPU work
    running on another stream after its own stream was done: then "device_sync", for both models,
    so that work is counted and the comparison stays like for like."""
    ref_gap, cand_gap = median_gap(ref_stream, ref_synced), median_gap(cand_stream, cand_synced)
    margin = max(GAP_MARGIN_MS, GAP_MARGIN_SHARE * statistics.median(cand_stream))
    end = "device_sync" if cand_gap - ref_gap > margin else "stream"
    return {"end": end, "reference_gap_ms": ref_gap, "candidate_gap_ms": cand_gap}


def time_interleaved(reference, candidate, input_sets, settings: dict, device: torch.device,
                     after_candidate=None, new_round=None, timer=None, seconds=None, compiled=None) -> dict:
    """Times both models alternately (ABBA order) over rotating input sets.

    after_candidate(set_index, output, run): called after each candidate run (run None: warm-up).
    new_round(r): called before run r * len(input_sets), r >= 1.
    seconds: a dict that gets the host seconds of the "warmup" and the "timed" runs.
    compiled: the reference under torch.compile ([timing] baseline = "compile"), or None: timed
    beside the reference in every run (reference, compiled, candidate; then the reverse), and
    reported as "compiled" with its "compile_speedup", from the same end as the others."""
    timer = timer or Timer(device, settings["l2_flush_mb"], settings.get("launch_spin_us", 0))
    n = len(input_sets)
    seconds = {} if seconds is None else seconds
    clock = time.perf_counter()

    def candidate_once(k, run):
        after = None if after_candidate is None else (lambda output: after_candidate(k, output, run))
        return timer.time_once(candidate, input_sets[k], after)

    def references_once(inputs, samples):
        samples["reference"].append(timer.time_once(reference, inputs))
        if compiled is not None:
            samples["compiled"].append(timer.time_once(compiled, inputs))

    with torch.no_grad():
        warm_up = {"reference": [], "compiled": []}
        for _ in range(settings["warmup_runs"]):
            for k, inputs in enumerate(input_sets):
                references_once(inputs, warm_up)
                candidate_once(k, None)
        seconds["warmup"], clock = time.perf_counter() - clock, time.perf_counter()
        samples, cand_samples = {"reference": [], "compiled": []}, []
        for i in range(settings["runs"]):
            k = i % n
            if new_round is not None and k == 0 and i > 0:
                new_round(i // n)
            inputs = input_sets[k]
            if i % 2 == 0:
                references_once(inputs, samples)
                cand_samples.append(candidate_once(k, i))
            else:
                cand_samples.append(candidate_once(k, i))
                references_once(inputs, samples)
        seconds["timed"] = time.perf_counter() - clock
    measured = {**report(samples["reference"], cand_samples), "launch_spin": timer.launch_spin}
    if compiled is not None:
        measured["compiled"] = summarize_at(samples["compiled"], measured["end"])
        measured["compile_speedup"] = measured["compiled"]["median_ms"] / measured["candidate"]["median_ms"]
    return measured


def summarize_at(samples, end: str) -> dict:
    """summarize() of (stream, synced) samples from the end report() chose."""
    stream, synced = zip(*samples)
    return summarize(synced if end == "device_sync" else stream)


def report(ref_samples, cand_samples) -> dict:
    """Summaries and speedup from the end choose_end picks, with the choice and its reason."""
    ref_stream, ref_synced = zip(*ref_samples)
    cand_stream, cand_synced = zip(*cand_samples)
    decision = choose_end(ref_stream, ref_synced, cand_stream, cand_synced)
    ref = summarize_at(ref_samples, decision["end"])
    cand = summarize_at(cand_samples, decision["end"])
    return {"reference": ref, "candidate": cand, "speedup": ref["median_ms"] / cand["median_ms"], **decision}


# ---- which timed runs are checked, and the copies of their outputs ----------------------------


# Sampled timed runs per input buffer: 8 comparisons in all with the default 4 buffers.
SAMPLED_PER_BUFFER = 2


def sample_runs(runs: int, n: int, rng: random.Random) -> frozenset:
    """The timed runs whose candidate output is checked: for every buffer, SAMPLED_PER_BUFFER of its
    runs drawn at random from the rounds that hold other data than the warm-up's (round % n != 0,
    where a result cached by pointer is stale), topped up from its other runs where those are too
    few. A fixed choice (each buffer's last runs, as before) let a candidate that counts its calls
    be right on exactly those and return anything in the others; now it cannot tell which runs are
    checked, and being wrong in half of them (to move the median) is caught but for 1 in 2^8."""
    sampled = set()
    for k in range(n):
        mine = [i for i in range(runs) if i % n == k]
        moved = [i for i in mine if (i // n) % n != 0]
        chosen = rng.sample(moved, min(SAMPLED_PER_BUFFER, len(moved)))
        rest = [i for i in mine if i not in chosen]
        chosen += rng.sample(rest, min(SAMPLED_PER_BUFFER - len(chosen), len(rest)))
        sampled.update(chosen)
    return frozenset(sampled)


# The share of timed runs after which the Guard is verified (besides every warm-up run, the sampled
# runs, the last run and the end of the hold). A verify is ~0.5-0.9 ms on the H200 in a loop, ~2 ms
# between timed runs (112 of them were a third of the exclusive hold). What it catches persists (a
# patch, a thread): one left in place is caught at the next verify and at the end, so only a patch
# made and undone between verifies escapes, and to move the median it must span half of the 100
# runs, escaping a random quarter of them with probability 0.75^50, ~6e-7.
GUARDED_SHARE = 0.25


def guard_runs(runs: int, rng: random.Random) -> frozenset:
    """The timed runs after which the Guard is verified: each with probability GUARDED_SHARE, and the
    last. Drawn with sample_runs, before any candidate code runs, from the OS's randomness."""
    return frozenset(i for i in range(runs) if rng.random() < GUARDED_SHARE) | {runs - 1}


# The copies of one timing's sampled runs (each its output and its inputs as the run left them),
# taken in the exclusive hold and compared after it, take at most this many bytes. A kzbench task at
# its GPU sizes copies 32-384 MiB per sampled run (19_scale_residual_gelu the most), so all 8 samples
# of the default timing (SAMPLED_PER_BUFFER for each of 4 buffers) fit. A device copy costs little
# beside the float64 comparisons it moves out of the hold.
SNAPSHOT_BUDGET_BYTES = 3 << 30
# On a GPU also at most this share of what the allocator can still get (free device memory, within
# set_per_process_memory_fraction), and no more than the evaluation's memory slots hold beyond its
# budget (gpu_memory): the copies must not make the candidate's own allocations fail (an
# out-of-memory verdict it would not otherwise get) nor crowd the other workers on the GPU.
SNAPSHOT_FREE_SHARE = 0.25


def snapshot_budget(device: torch.device, memory=None) -> int:
    if device.type != "cuda":
        return SNAPSHOT_BUDGET_BYTES
    free, total = torch.cuda.mem_get_info(device)
    # The allocator's limit counts what it reserved (cached blocks included) against fraction * total.
    allowed = torch.cuda.get_per_process_memory_fraction(device) * total - torch.cuda.memory_reserved(device)
    budget = min(SNAPSHOT_BUDGET_BYTES, SNAPSHOT_FREE_SHARE * max(0.0, min(free, allowed)))
    if memory is not None:
        budget = min(budget, memory.spare_bytes)
    return int(budget)


class Snapshots:
    """Device copies of sampled timed runs, within snapshot_budget: a run whose copy would exceed it,
    or whose copy the allocator refuses, is not taken (its caller compares it at once instead)."""

    def __init__(self, device: torch.device, memory=None):
        self.device = device
        self.budget_bytes = snapshot_budget(device, memory)
        self.used_bytes = 0
        self.runs = []  # (run, input-set key, copy of the output, copy of the inputs), in run order

    def reserve(self, count: int, out, inputs) -> None:
        """Before the exclusive hold: has the caching allocator keep the memory `count` copies of an
        output like `out` and inputs like `inputs` take (one block, allocated and freed at once, which
        the copies then split), so taking them in the hold costs no cudaMalloc of hundreds of MiB."""
        size = min(count * (gpu_memory.nbytes(out) + gpu_memory.nbytes(inputs)), self.budget_bytes)
        if self.device.type != "cuda" or size == 0:
            return
        try:
            block = torch.empty(size, dtype=torch.uint8, device=self.device)
        except Exception as exc:
            if not errors.is_memory_exception(exc):
                raise
            return  # the copies that do not fit are compared at once (take)
        del block

    def take(self, run, key, out, inputs) -> bool:
        size = gpu_memory.nbytes(out) + gpu_memory.nbytes(inputs)
        if self.used_bytes + size > self.budget_bytes:
            return False
        try:
            self.runs.append((run, key, cheats.clone_output(out), loading.clone_all(inputs)))
        except Exception as exc:
            if not errors.is_memory_exception(exc):
                raise
            return False
        # Copied before the candidate runs again: its next forward may write these buffers from a
        # stream that does not wait for the copy.
        correctness.synchronize(self.device)
        self.used_bytes += size
        return True
