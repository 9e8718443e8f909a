"""The timing protocol (kz_worker/timing.py): its choice of end on made-up samples on the CPU, and
the launch gate's PTX and its fallback; on a GPU, a candidate that leaves work running on a stream
it never joins back, the launch spin hiding a slow host launch, and the host ending it."""
import os
import shutil
import subprocess
import time

import pytest
import torch

from kz_worker import timing

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def samples(stream_ms, gap_ms, n=9):
    """n samples around stream_ms (spread so medians matter), each synced gap_ms later."""
    stream = [stream_ms * (1 + 0.01 * (i - n // 2)) for i in range(n)]
    return stream, [s + gap_ms for s in stream]


def decide(ref_stream_ms, ref_gap_ms, cand_stream_ms, cand_gap_ms):
    return timing.choose_end(*samples(ref_stream_ms, ref_gap_ms), *samples(cand_stream_ms, cand_gap_ms))


def test_honest_gaps_keep_the_stream_end():
    decision = decide(0.20, 0.012, 0.10, 0.015)
    assert decision["end"] == "stream"
    assert decision["reference_gap_ms"] == pytest.approx(0.012)
    assert decision["candidate_gap_ms"] == pytest.approx(0.015)


def test_a_candidate_leaving_work_on_another_stream_is_timed_to_the_device_sync():
    assert decide(0.20, 0.012, 0.10, 0.212)["end"] == "device_sync"


def test_a_smaller_candidate_gap_keeps_the_stream_end():
    assert decide(0.20, 0.300, 0.10, 0.012)["end"] == "stream"


def test_margin_is_10_us_for_short_candidates():
    # candidate stream median 0.1 ms: 5 % is 5 us, below the 10 us floor
    assert decide(0.20, 0.012, 0.10, 0.012 + 0.0099)["end"] == "stream"
    assert decide(0.20, 0.012, 0.10, 0.012 + 0.0101)["end"] == "device_sync"


def test_margin_is_5_percent_of_long_candidates():
    # candidate stream median 4 ms: the margin is 0.2 ms
    assert decide(4.0, 0.012, 4.0, 0.012 + 0.199)["end"] == "stream"
    assert decide(4.0, 0.012, 4.0, 0.012 + 0.201)["end"] == "device_sync"


def test_median_gap_ignores_a_few_slow_wake_ups():
    stream, synced = samples(0.10, 0.012)
    synced[:3] = [s + 1.0 for s in stream[:3]]  # three of nine samples woke up late
    assert timing.median_gap(stream, synced) == pytest.approx(0.012)


def test_report_takes_both_models_from_the_chosen_end():
    ref = [timing.Sample(0.20, 0.21)] * 5
    honest = timing.report(ref, [timing.Sample(0.10, 0.11)] * 5)
    assert honest["end"] == "stream" and honest["speedup"] == pytest.approx(2.0)
    assert honest["candidate"]["median_ms"] == pytest.approx(0.10) and honest["candidate"]["runs"] == 5
    hiding = timing.report(ref, [timing.Sample(0.10, 0.50)] * 5)
    assert hiding["end"] == "device_sync"
    assert hiding["reference"]["median_ms"] == pytest.approx(0.21)
    assert hiding["candidate"]["median_ms"] == pytest.approx(0.50)
    assert hiding["speedup"] == pytest.approx(0.21 / 0.50)
    assert hiding["reference_gap_ms"] == pytest.approx(0.01) and hiding["candidate_gap_ms"] == pytest.approx(0.40)


# ---- on a GPU --------------------------------------------------------------------------------------

SLEEP_CYCLES = 1_000_000  # torch.cuda._sleep: >= 0.33 ms at any clock up to 3 GHz


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


class SideWork(torch.nn.Module):
    """Doubles x on the current stream, and keeps the GPU busy on a stream of its own, joined back
    into the current stream or left running."""

    def __init__(self, join: bool):
        super().__init__()
        self.join = join
        self.side = torch.cuda.Stream()

    def forward(self, x):
        out = x * 2
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(SLEEP_CYCLES)
        if self.join:
            torch.cuda.current_stream().wait_stream(self.side)
        return out


def time_against_double(candidate, seconds=None) -> dict:
    device = torch.device("cuda")
    inputs = [[torch.randn(1 << 16, device=device)] for _ in range(2)]
    settings = {"warmup_runs": 2, "runs": 30, "l2_flush_mb": 8}
    return timing.time_interleaved(Double(), candidate, inputs, settings, device, seconds=seconds)


@needs_gpu
def test_gpu_an_honest_candidate_is_timed_to_the_stream_end():
    seconds = {}
    measured = time_against_double(Double(), seconds)
    assert measured["end"] == "stream", measured
    # Not timed > warmup: the first runs in a process pay CUDA's lazy start-up (the H200 once: 22 ms
    # of warm-up against 5 ms for the 30 timed runs).
    assert set(seconds) == {"warmup", "timed"} and min(seconds.values()) > 0, seconds


@needs_gpu
def test_gpu_side_work_joined_back_is_inside_the_stream_end():
    measured = time_against_double(SideWork(join=True))
    assert measured["end"] == "stream", measured
    assert measured["candidate"]["median_ms"] > measured["reference"]["median_ms"] + 0.3, measured


@needs_gpu
def test_gpu_side_work_left_running_is_timed_to_the_device_sync():
    measured = time_against_double(SideWork(join=False))
    assert measured["end"] == "device_sync", measured
    assert measured["candidate_gap_ms"] > measured["reference_gap_ms"] + 0.3, measured
    assert measured["candidate"]["median_ms"] > measured["reference"]["median_ms"] + 0.3, measured


class SlowLauncher(torch.nn.Module):
    """Doubles x after ~100 µs of host time, as a slow Python launcher on a busy host would."""

    def forward(self, x):
        until = time.perf_counter() + 100e-6
        while time.perf_counter() < until:
            pass
        return x * 2


@needs_gpu
def test_gpu_the_launch_spin_hides_host_launch_latency_up_to_its_length():
    device = torch.device("cuda")
    inputs = [[torch.randn(1 << 16, device=device)] for _ in range(2)]
    settings = {"warmup_runs": 2, "runs": 30, "l2_flush_mb": 8}
    without = timing.time_interleaved(Double(), SlowLauncher(), inputs, settings, device)
    spun = timing.time_interleaved(Double(), SlowLauncher(), inputs, dict(settings, launch_spin_us=200), device)
    # Without the spin the GPU waits ~100 µs after the start event for the launch; with it, not.
    assert without["candidate"]["median_ms"] > without["reference"]["median_ms"] + 0.05, without
    assert spun["candidate"]["median_ms"] < without["candidate"]["median_ms"] - 0.05, (spun, without)
    assert spun["speedup"] == pytest.approx(1.0, abs=0.2), spun


class Synchronizing(torch.nn.Module):
    """Doubles x, waiting for the GPU inside its forward (as an .item() would)."""

    def forward(self, x):
        torch.cuda.synchronize()
        return x * 2


@needs_gpu
def test_gpu_the_host_ends_the_launch_spin_once_it_has_issued_the_run():
    device = torch.device("cuda")
    inputs = [[torch.randn(1 << 16, device=device)] for _ in range(2)]
    settings = {"warmup_runs": 1, "runs": 20, "l2_flush_mb": 8, "launch_spin_us": 20_000}  # spins of 20 ms at most
    seconds = {}
    measured = timing.time_interleaved(Double(), Double(), inputs, settings, device, seconds=seconds)
    assert measured["launch_spin"] == "gated", measured
    # 40 timed runs: 0.8 s if every spin ran its length; the host opens the gate within ~0.1 ms.
    assert seconds["timed"] < 0.2, seconds
    assert measured["speedup"] == pytest.approx(1.0, abs=0.2), measured
    # A forward that waits for the GPU cannot open the gate before it returns: its spin runs its
    # whole length (a bound, not a deadlock), and, as before the gate, stays out of the sample.
    settings.update(runs=4, launch_spin_us=5_000)
    measured = timing.time_interleaved(Double(), Synchronizing(), inputs, settings, device, seconds=seconds)
    assert seconds["timed"] > 4 * 0.005, seconds
    assert measured["candidate"]["median_ms"] < 2.0, measured


class RefusingGate:
    def spin(self, stream, max_cycles):
        raise RuntimeError("cuLaunchKernel returned CUresult 400")


def test_a_gate_the_driver_refuses_falls_back_to_the_fixed_spin(monkeypatch):
    slept = []
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    timer = timing.Timer.__new__(timing.Timer)  # its device parts stood in for: no GPU needed
    timer.flush_buffer, timer.spin_cycles = torch.empty(4), 1000
    timer.gate, timer.launch_spin = RefusingGate(), "gated"
    timer.prepare(stream=None)
    timer.prepare(stream=None)
    assert slept == [1000, 1000] and timer.gate is None and timer.launch_spin == "fixed"


def test_without_a_driver_the_launch_spin_is_a_fixed_one(monkeypatch):
    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(timing.ctypes, "CDLL", no_driver)
    monkeypatch.setattr(timing, "_launch_gates", ())
    assert timing.launch_gate(torch.device("cuda:3")) is None
    assert timing._launch_gates == (("cuda:3", None),), "tried once per device"


def test_the_gated_spin_is_ptx_the_assembler_takes(tmp_path):
    ptxas = shutil.which("ptxas") or next((p for p in ("/usr/local/cuda/bin/ptxas",) if os.path.exists(p)), None)
    if ptxas is None:
        pytest.skip("no ptxas (the CUDA toolkit) on this machine")
    source = tmp_path / "gated_spin.ptx"
    source.write_text(timing.GATED_SPIN_PTX)
    for arch in ("sm_80", "sm_90"):  # its .target sm_70 runs on any later GPU
        done = subprocess.run([ptxas, f"-arch={arch}", str(source), "-o", str(tmp_path / f"{arch}.cubin")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


class SwitchedOutClock:
    """Stands in for torch.cuda's spin and events: each spin's elapsed time is its cycles at
    `mhz`, stretched by the next of `stretches` (other contexts' time slices in between)."""

    def __init__(self, mhz, stretches):
        self.mhz, self.stretches, self.last_ms = mhz, list(stretches), 0.0

    def sleep(self, cycles):
        self.last_ms = cycles / (self.mhz * 1000.0) * (self.stretches.pop(0) if self.stretches else 1.0)

    def event(self, enable_timing=False):
        clock = self

        class Event:
            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return clock.last_ms
        return Event()


def test_the_clock_is_the_fastest_of_its_probes(monkeypatch):
    # The wake-up spin, then five probes, three of them switched out for a while.
    clock = SwitchedOutClock(1980, [1.0, 1.33, 1.07, 1.0, 1.25, 1.0])
    monkeypatch.setattr(torch.cuda, "_sleep", clock.sleep)
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    monkeypatch.setattr(timing, "_cycles_per_us", ())
    assert timing.cycles_per_us("cuda:7") == pytest.approx(1980)
    assert timing.cycles_per_us("cuda:7") == pytest.approx(1980), "measured once per device"
    assert not clock.stretches, "no probe left over: five of them, after the wake-up"


@needs_gpu
def test_gpu_the_clock_is_calibrated_near_the_sm_clock():
    cycles = timing.cycles_per_us(torch.device("cuda"))
    # The SM clock in MHz is cycles per µs; any GPU kz runs on is between 0.5 and 3.5 GHz.
    assert 500 < cycles < 3500, cycles
