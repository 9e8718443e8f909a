"""GPU memory: the meta estimate, the budget, the slots shared by the evaluations of one GPU (real lock
files, real processes), the out-of-memory verdicts, and the fingerprints that let the harness keep no
input set or reference output between uses."""
import multiprocessing
import os
import signal
import time
import types

import pytest
import torch

from kz_worker import fingerprint, gpu_memory, harness, loading
from kz_worker import verdict as v

MIB = 1 << 20
GIB = 1 << 30

CHAIN = '''
import torch
class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features, bias=False)
    def forward(self, x):
        return (x * 2 + 1).sum(-1)
def get_inputs():
    return [torch.randn(1024, 1024)]
def get_init_inputs():
    return [256]
'''

DATA_DEPENDENT = '''
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum()
def get_inputs():
    return [torch.randn(64)]
def get_init_inputs():
    return []
'''


def reference_from(source, tmp_path):
    return loading.load_reference(source, tmp_path, use_cpu_sizes=False, overrides={})


def test_the_meta_estimate_counts_weights_inputs_and_the_forwards_live_peak(tmp_path):
    ref = reference_from(CHAIN, tmp_path)
    fp = gpu_memory.estimate_on_meta(ref, ref.init_inputs(), seed=1)
    assert fp.weights == 256 * 256 * 4
    assert fp.inputs == 4 * MIB
    # x * 2 and (x * 2) + 1 are alive at once (4 MiB each); the sum's 4 KiB comes after the first is gone.
    assert fp.forward_peak == 8 * MIB
    assert fp.reference_peak == fp.weights + 12 * MIB and fp.estimate == "meta"


def test_a_data_dependent_forward_has_no_meta_estimate(tmp_path):
    ref = reference_from(DATA_DEPENDENT, tmp_path)
    with pytest.raises(Exception):
        gpu_memory.estimate_on_meta(ref, ref.init_inputs(), seed=1)


def test_the_budget_is_a_small_multiple_of_the_references_peak():
    fp = gpu_memory.Footprint(weights=1 * GIB, inputs=8 * GIB, forward_peak=8 * GIB, estimate="meta")
    # Trial: 2 inputs + 2 forward peaks = 32 GiB; timing (2 buffers + 1) * 8 + 2 * 8 = 40 GiB, the larger.
    assert gpu_memory.timing_sets(4, fp.inputs) == 2
    assert gpu_memory.budget_bytes(fp, 2) == int((2 + 40) * GIB * 1.1) + GIB
    assert gpu_memory.budget_bytes(fp, 2) < 3 * fp.reference_peak
    small = gpu_memory.Footprint(weights=0, inputs=4 * MIB, forward_peak=4 * MIB, estimate="meta")
    assert gpu_memory.timing_sets(4, small.inputs) == 4, "small inputs keep the request's four buffers"
    assert gpu_memory.timing_sets(4, 600 * MIB) == 3 and gpu_memory.timing_sets(1, 8 * GIB) == 1


def test_capacity_is_the_fraction_within_what_the_contexts_leave():
    assert gpu_memory.capacity_bytes(80 * GIB, 0.9, 10) == int(72 * GIB), "7.5 GiB of contexts fit in the other 8"
    assert gpu_memory.capacity_bytes(80 * GIB, 0.9, 20) == 80 * GIB - 20 * gpu_memory.CONTEXT_BYTES
    assert gpu_memory.capacity_bytes(GIB, 0.5, 4) == 0


# ---- the slots: real lock files, held by real processes ---------------------------------------------

def _holder(lock_dir, slots_wanted, held, release):
    """A process that takes `slots_wanted` slots, says so, and keeps them until told (or killed)."""
    reservation = gpu_memory.Reservation(lock_dir, "gpu-test", gpu_memory.SLOTS * GIB)
    reservation.reserve(slots_wanted * GIB, alone=False)
    held.set()
    release.wait(30)
    reservation.release()


def start_holder(lock_dir, slots):
    context = multiprocessing.get_context("fork")
    held, release = context.Event(), context.Event()
    process = context.Process(target=_holder, args=(str(lock_dir), slots, held, release))
    process.start()
    assert held.wait(30), "the holder got its slots"
    return process, release


def reserve_in_thread(reservation, need, alone):
    import threading
    waited = threading.Event()
    done = threading.Event()

    def run():
        reservation.reserve(need, alone, on_wait=waited.set)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return waited, done


def test_evaluations_share_the_slots_and_wait_for_what_is_held(tmp_path):
    holder, release = start_holder(tmp_path, 10)
    try:
        fits = gpu_memory.Reservation(str(tmp_path), "gpu-test", gpu_memory.SLOTS * GIB)
        fits.reserve(6 * GIB, alone=False, on_wait=lambda: pytest.fail("6 of the 6 free slots: no wait"))
        assert fits.slots == 6 and not fits.alone
        fits.release()
        more = gpu_memory.Reservation(str(tmp_path), "gpu-test", gpu_memory.SLOTS * GIB)
        waited, done = reserve_in_thread(more, 7 * GIB, alone=False)
        assert waited.wait(10) and not done.wait(0.3), "7 slots wanted, 6 free: it waits"
        release.set()
        assert done.wait(10), "the holder's slots freed: it gets them"
        assert more.slots == 7 and more.waited_s > 0
        more.release()
    finally:
        release.set()
        holder.join(10)


def test_a_killed_evaluation_frees_its_slots_and_alone_means_every_slot(tmp_path):
    holder, _ = start_holder(tmp_path, 1)
    alone = gpu_memory.Reservation(str(tmp_path), "gpu-test", gpu_memory.SLOTS * GIB)
    waited, done = reserve_in_thread(alone, 0, alone=True)
    assert waited.wait(10) and not done.wait(0.3), "one slot held elsewhere: alone waits"
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert done.wait(10) and alone.alone and alone.slots == gpu_memory.SLOTS
    alone.shrink_to(3 * GIB)
    assert alone.slots == 3 and alone.spare_bytes == 0
    alone.release()


# ---- out-of-memory verdicts --------------------------------------------------------------------------

def oom_verdict(memory, stage):
    evaluation = harness.Evaluation({"device": "cuda:0", "format": "cuda-rtc", "seed": 1, "trials": 1,
                                     "scratch_dir": "/tmp"}, types.SimpleNamespace(stage=lambda name: None))
    evaluation.memory, evaluation.stage = memory, stage
    return evaluation._out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"))


def test_out_of_memory_is_the_candidates_only_with_the_gpu_to_itself(monkeypatch):
    shared = types.SimpleNamespace(alone=False)
    alone = types.SimpleNamespace(alone=True, reserved_bytes=70 * GIB)
    monkeypatch.setattr(gpu_memory, "device_memory", lambda device: (GIB, 69 * GIB))  # all of it this one's
    status, message, checks = oom_verdict(shared, "correctness")
    assert (status, checks) == (v.INFRA_ERROR, [v.OUT_OF_MEMORY_SHARED]) and "other evaluations" in message
    assert oom_verdict(shared, "load_reference")[2] == [v.OUT_OF_MEMORY_SHARED]
    status, message, checks = oom_verdict(alone, "correctness")
    assert (status, checks) == (v.RUNTIME_ERROR, [v.MEMORY_LIMIT]) and "with the GPU to itself" in message
    assert oom_verdict(alone, "load_reference")[:1] + oom_verdict(alone, "load_reference")[2:] == \
        (v.INFRA_ERROR, [v.EXCEEDS_GPU_MEMORY])


def test_out_of_memory_with_the_slots_unfilled_is_memory_held_elsewhere(monkeypatch):
    alone = types.SimpleNamespace(alone=True, reserved_bytes=70 * GIB)
    # The card had 0.5 GiB free and this process held 1 GiB: 68.5 GiB of its slots held elsewhere.
    monkeypatch.setattr(gpu_memory, "device_memory", lambda device: (GIB // 2, GIB))
    status, message, checks = oom_verdict(alone, "load_reference")
    assert (status, checks) == (v.INFRA_ERROR, [v.GPU_MEMORY_HELD_ELSEWHERE]), message
    assert "70,144 MiB of the 71,680 MiB" in message and "not the task's" in message
    # Once the candidate ran, memory outside PyTorch's allocator may be its own: the candidate's.
    assert oom_verdict(alone, "correctness")[2] == [v.MEMORY_LIMIT]
    # This process held what ran out: the task's, as before.
    monkeypatch.setattr(gpu_memory, "device_memory", lambda device: (GIB // 2, 69 * GIB))
    assert oom_verdict(alone, "load_reference")[2] == [v.EXCEEDS_GPU_MEMORY]


def test_held_elsewhere_only_where_the_evaluation_stayed_within_its_promise():
    promised = 70 * GIB
    assert gpu_memory.held_elsewhere(promised, free=GIB, own=GIB, requested=8 * GIB) == 68 * GIB
    assert gpu_memory.held_elsewhere(promised, free=GIB, own=GIB, requested=200 * GIB) == 0  # its own need
    assert gpu_memory.held_elsewhere(promised, free=68 * GIB, own=GIB, requested=8 * GIB) == 0  # within the margin
    assert gpu_memory.requested_bytes("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has") == 8 * GIB
    assert gpu_memory.requested_bytes("Tried to allocate 512.00 MiB") == 512 * MIB
    assert gpu_memory.requested_bytes("no figure") == 0


def test_an_evaluation_waits_for_memory_its_slots_promise_then_goes_on():
    readings = iter([(GIB, 0), (3 * GIB, 0), (8 * GIB, GIB)])  # a killed worker's memory coming back
    waits = []
    waited, missing = gpu_memory.await_device_memory("cuda:0", 9 * GIB, wait_s=10, on_wait=lambda: waits.append(1),
                                                     read=lambda device: next(readings))
    assert waits == [1] and waited >= 2 * gpu_memory.DEVICE_POLL_S and missing == 0
    waited, missing = gpu_memory.await_device_memory("cuda:0", 9 * GIB, read=lambda device: (9 * GIB, 0))
    assert waited < 0.1 and missing == 0
    # Never there: it goes on after wait_s (budgets are generous), saying how much was missing.
    waited, missing = gpu_memory.await_device_memory("cuda:0", 9 * GIB, wait_s=0.3,
                                                     read=lambda device: (2 * GIB, GIB))
    assert 0.3 <= waited < 1 and missing == 6 * GIB


def test_the_wait_for_the_card_is_the_requests(monkeypatch):
    """[timeouts] device_memory_wait_s reaches the wait as the request's device_memory_wait_s (0: none);
    a request without it waits the default."""
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 0.9, raising=False)
    monkeypatch.setattr(gpu_memory, "estimate_on_meta", lambda *a: gpu_memory.Footprint(GIB, GIB, GIB, "meta"))
    monkeypatch.setattr(gpu_memory, "Reservation", lambda *a: types.SimpleNamespace(
        reserve=lambda need, alone, on_wait: None, waited_s=0.0))
    monkeypatch.setattr(gpu_memory, "await_device_memory",
                        lambda device, need, wait_s, on_wait: seen.append(wait_s) or (0.0, 0))
    for extra in ({"device_memory_wait_s": 0.0}, {"device_memory_wait_s": 7.5}, {}):
        evaluation = harness.Evaluation({"device": "cuda:0", "format": "cuda-rtc", "seed": 1, "trials": 1,
                                         "scratch_dir": "/tmp", "gpu_memory_dir": "/tmp", **extra},
                                        types.SimpleNamespace(stage=lambda name: None))
        evaluation._reserve_memory(None, [])
    assert seen == [0.0, 7.5, gpu_memory.DEVICE_WAIT_S]


def test_a_task_larger_than_the_card_names_both_figures():
    fp = gpu_memory.Footprint(weights=0, inputs=40 * GIB, forward_peak=40 * GIB, estimate="meta")
    failure = gpu_memory.exceeds_failure(200 * GIB, 60 * GIB, 80 * GIB, fp)
    assert failure.status == v.INFRA_ERROR and failure.checks == [v.EXCEEDS_GPU_MEMORY]
    assert "204,800 MiB" in failure.message and "61,440 MiB" in failure.message and "80 GiB card" in failure.message


# ---- fingerprints ------------------------------------------------------------------------------------

TOLERANCE = (lambda dtype: (1e-4, 1e-4))


def test_a_digest_sees_every_byte(monkeypatch):
    monkeypatch.setattr(fingerprint, "CHUNK", 5)  # several chunks
    x = torch.randn(3, 7)
    assert fingerprint.digest([x, 3]) == fingerprint.digest([x.clone(), 3])
    for index in range(x.numel()):
        y = x.clone()
        y.view(-1)[index] = torch.nextafter(y.view(-1)[index], torch.tensor(float("inf")))
        assert fingerprint.digest([y, 3]) != fingerprint.digest([x, 3]), index
    assert fingerprint.digest([x, 4]) != fingerprint.digest([x, 3])


def test_a_sketch_takes_the_tolerance_and_refuses_more(monkeypatch):
    monkeypatch.setattr(fingerprint, "CHUNK", 64)
    ref = torch.randn(50, 40)
    sketch = fingerprint.Sketch(ref)
    assert sketch.mismatch(fingerprint.Sketch(ref + 5e-5), TOLERANCE) is None
    assert "sampled elements" in sketch.mismatch(fingerprint.Sketch(ref + 1e-2), TOLERANCE)
    assert sketch.mismatch(fingerprint.Sketch(ref.double()), TOLERANCE) == "output: its type, shape or dtype differs"
    with_nan = ref.clone()
    with_nan[3, 4] = float("nan")
    assert "NaN/Inf" in sketch.mismatch(fingerprint.Sketch(with_nan), TOLERANCE)
    halves = fingerprint.Sketch((ref, torch.arange(3)))
    assert halves.mismatch(fingerprint.Sketch((ref, torch.arange(3))), TOLERANCE) is None
    assert "output[1]" in halves.mismatch(fingerprint.Sketch((ref, torch.arange(3) + 1)), TOLERANCE)


def test_a_sketch_catches_a_change_of_one_chunks_sum_outside_the_samples(monkeypatch):
    monkeypatch.setattr(fingerprint, "SAMPLES", 1)
    ref = torch.randn(4096)
    sketch = fingerprint.Sketch(ref)
    sampled = int(fingerprint._positions_for(ref.numel(), ref.device)[0])
    changed = ref.clone()
    changed[(sampled + 1) % ref.numel()] += 1.0  # beyond atol * 4096 + rtol * sum|x|
    assert sketch.mismatch(fingerprint.Sketch(changed), TOLERANCE) == "output: its sums over chunks differ beyond tolerance"
