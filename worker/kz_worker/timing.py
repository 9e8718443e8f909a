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

The harness gets every candidate output after its run, outside the timed region
(`after_candidate`, to verify a sample of them: cheats.py), and is told when a new round over the
input sets begins (`new_round`, to move the input data between buffers, so that a result cached by
pointer turns stale).
"""
import statistics
import time
from typing import NamedTuple

import torch

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

    def prepare(self) -> None:
        """The GPU work before the start event: the L2 flush, then the launch spin (the GPU stays busy
        while the host issues the forward's launches, so their latency up to the spin's length is
        not in the sample)."""
        self.flush_buffer.zero_()
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)

    def time_once(self, model, inputs, after=None) -> Sample:
        # The stream the start is on, even if the forward changes the current stream.
        stream = torch.cuda.current_stream(self.device)
        self.prepare()
        self.start.record(stream)
        output = model(*inputs)
        self.end.record(stream)
        torch.cuda.synchronize(self.device)
        self.synced.record(stream)
        self.synced.synchronize()
        sample = Sample(self.start.elapsed_time(self.end), self.start.elapsed_time(self.synced))
        if after is not None:
            after(output)
        del output
        return sample


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
                     after_candidate=None, new_round=None, timer=None, seconds=None) -> dict:
    """Times both models alternately (ABBA order) over rotating input sets.

    after_candidate(set_index, output, run): called after each candidate run (run None: warm-up).
    new_round(r): called before run r * len(input_sets), r >= 1.
    seconds: a dict that gets the host seconds of the "warmup" and the "timed" runs."""
    timer = timer or Timer(device, settings["l2_flush_mb"], settings.get("launch_spin_us", 0))
    n = len(input_sets)
    seconds = {} if seconds is None else seconds
    clock = time.perf_counter()

    def candidate_once(k, run):
        after = None if after_candidate is None else (lambda output: after_candidate(k, output, run))
        return timer.time_once(candidate, input_sets[k], after)

    with torch.no_grad():
        for _ in range(settings["warmup_runs"]):
            for k, inputs in enumerate(input_sets):
                timer.time_once(reference, inputs)
                candidate_once(k, None)
        seconds["warmup"], clock = time.perf_counter() - clock, time.perf_counter()
        ref_samples, cand_samples = [], []
        for i in range(settings["runs"]):
            k = i % n
            if new_round is not None and k == 0 and i > 0:
                new_round(i // n)
            inputs = input_sets[k]
            if i % 2 == 0:
                ref_samples.append(timer.time_once(reference, inputs))
                cand_samples.append(candidate_once(k, i))
            else:
                cand_samples.append(candidate_once(k, i))
                ref_samples.append(timer.time_once(reference, inputs))
        seconds["timed"] = time.perf_counter() - clock
    return report(ref_samples, cand_samples)


def report(ref_samples, cand_samples) -> dict:
    """Summaries and speedup from the end choose_end picks, with the choice and its reason."""
    ref_stream, ref_synced = zip(*ref_samples)
    cand_stream, cand_synced = zip(*cand_samples)
    decision = choose_end(ref_stream, ref_synced, cand_stream, cand_synced)
    synced = decision["end"] == "device_sync"
    ref = summarize(ref_synced if synced else ref_stream)
    cand = summarize(cand_synced if synced else cand_stream)
    return {"reference": ref, "candidate": cand, "speedup": ref["median_ms"] / cand["median_ms"], **decision}
