"""The per-GPU lock: timings alone, other GPU work shared, no starvation of a waiting timing.

Real lock files and real processes (flock is per open file description, so each holder here is
its own process, as each worker is)."""
import multiprocessing as mp
import os
import time

import pytest

from kz_worker.gpu_lock import GpuLock, LockFileMissing, lock_file_stem

HOLD_S = 0.4
# Where a test measures a wait on another process's hold: long enough that the queue's and the
# process's delays on a loaded CI machine are a small part of it.
LONG_HOLD_S = 2.0


def hold(lock_dir, mode, events, delay_s=0.0, hold_s=HOLD_S, meet=None):
    """One holder in a process of its own: says it is asking, then in, holds hold_s (after meeting
    the other holders at `meet`, a Barrier, where given), then out."""
    time.sleep(delay_s)
    lock = GpuLock(lock_dir, "GPU-test")
    events.put((mode, "asking", time.monotonic()))
    with getattr(lock, mode)():
        events.put((mode, "in", time.monotonic()))
        if meet is not None:
            meet.wait(timeout=30)  # raises (the process fails) where the others never got in beside it
        time.sleep(hold_s)
        events.put((mode, "out", time.monotonic()))


def started_holder(ctx, lock_dir, mode, events, **kwargs):
    process = ctx.Process(target=hold, args=(lock_dir, mode, events), kwargs=kwargs)
    process.start()
    return process


def wait_for(events, seen, mode, kind):
    """Takes events off the queue (keeping them in `seen`) until `mode` says `kind`."""
    while True:
        event = events.get(timeout=30)
        seen.append(event)
        if event[:2] == (mode, kind):
            return event


def finished(procs, events, seen=()):
    """Joins the holders; every event they sent (three each), `seen` among them, in time order."""
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    out = list(seen)
    while len(out) < 3 * len(procs):
        out.append(events.get(timeout=5))
    return sorted(out, key=lambda e: e[2])


def run_all(lock_dir, plans, **kwargs):
    ctx = mp.get_context("fork")
    events = ctx.Queue()
    procs = [started_holder(ctx, lock_dir, mode, events, delay_s=delay, **kwargs) for mode, delay in plans]
    return finished(procs, events)


def intervals(events, mode):
    ins = [t for m, kind, t in events if m == mode and kind == "in"]
    outs = [t for m, kind, t in events if m == mode and kind == "out"]
    return list(zip(sorted(ins), sorted(outs)))


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_shared_holders_overlap(tmp_path):
    # Each waits inside the lock for the other: a lock that let only one in fails the barrier.
    events = run_all(str(tmp_path), [("shared", 0.0), ("shared", 0.0)], meet=mp.get_context("fork").Barrier(2))
    a, b = intervals(events, "shared")
    assert overlaps(a, b), events


def test_exclusive_never_overlaps_anything(tmp_path):
    events = run_all(str(tmp_path), [("shared", 0.0), ("exclusive", 0.1), ("shared", 0.2), ("exclusive", 0.25)])
    spans = intervals(events, "shared") + intervals(events, "exclusive")
    for ex in intervals(events, "exclusive"):
        others = [s for s in spans if s != ex]
        assert not any(overlaps(ex, o) for o in others), events


def test_waiting_timing_goes_before_later_shared_work(tmp_path):
    # shared holder first; a timing arrives and waits; a shared request arriving after the timing
    # must not get in ahead of it (the turnstile). Each step waits for the one before it.
    ctx = mp.get_context("fork")
    events, seen = ctx.Queue(), []
    procs = [started_holder(ctx, str(tmp_path), "shared", events, hold_s=LONG_HOLD_S)]
    wait_for(events, seen, "shared", "in")
    procs.append(started_holder(ctx, str(tmp_path), "exclusive", events))
    wait_for(events, seen, "exclusive", "asking")
    probe, deadline = GpuLock(str(tmp_path), "GPU-test"), time.monotonic() + 30
    while not turnstile_held(probe) and time.monotonic() < deadline:  # it waits in its lock call
        time.sleep(0.01)
    procs.append(started_holder(ctx, str(tmp_path), "shared", events))
    everything = finished(procs, events, seen)
    (ex_in, _), = intervals(everything, "exclusive")
    late_shared_in = max(t for m, kind, t in everything if m == "shared" and kind == "in")
    assert ex_in < late_shared_in, everything


def test_shared_nests_and_locks_are_released_on_exception(tmp_path):
    lock = GpuLock(str(tmp_path), "GPU-test")
    try:
        with lock.shared():
            with lock.shared():
                raise RuntimeError("candidate failed")
    except RuntimeError:
        pass
    assert lock.mode is None
    events = run_all(str(tmp_path), [("exclusive", 0.0)])  # would hang if still held
    assert len(events) == 3


def test_report_counts_waiting_and_exclusive_holding(tmp_path):
    ctx = mp.get_context("fork")
    events = ctx.Queue()
    holder = started_holder(ctx, str(tmp_path), "exclusive", events, hold_s=LONG_HOLD_S)
    wait_for(events, [], "exclusive", "in")  # the other worker holds the GPU for LONG_HOLD_S
    lock = GpuLock(str(tmp_path), "GPU-test")
    with lock.shared():
        pass
    holder.join(20)
    assert lock.report()["gpu_wait_s"] >= LONG_HOLD_S / 2, lock.report()
    assert lock.report()["gpu_exclusive_s"] == 0.0
    with lock.exclusive():
        time.sleep(0.1)
    assert 0.1 <= lock.report()["gpu_exclusive_s"] < 5, lock.report()


def free_to_take(fd: int) -> bool:
    """Whether the lock file at `fd` could be taken exclusive now (by this open file description)."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def turnstile_held(lock: GpuLock) -> bool:
    """Whether someone holds `lock`'s turnstile now: a timing waiting for the GPU lock holds it."""
    return not free_to_take(lock.turnstile_fd)


def taken_exclusive(lock: GpuLock) -> bool:
    """Whether `lock`'s GPU lock file could be taken exclusive now (by another open file description)."""
    return free_to_take(lock.gpu_fd)


def test_a_shared_hold_lets_go_of_the_gpu_while_released(tmp_path):
    holder, timing = GpuLock(str(tmp_path), "GPU-test"), GpuLock(str(tmp_path), "GPU-test")
    with holder.shared():
        assert not taken_exclusive(timing)
        with holder.released():
            assert holder.mode is None and taken_exclusive(timing), "a timing may run during the compile"
        assert holder.mode == "shared" and not taken_exclusive(timing), "held again after it"
    assert taken_exclusive(timing)


def test_released_does_nothing_outside_a_shared_hold(tmp_path):
    holder, other = GpuLock(str(tmp_path), "GPU-test"), GpuLock(str(tmp_path), "GPU-test")
    with holder.released():
        assert holder.mode is None
    with holder.exclusive():
        with holder.released():  # a compile inside a timing is the candidate's own time
            assert holder.mode == "exclusive" and not taken_exclusive(other)


def test_lock_files_are_named_by_uuid_without_the_nvidia_smi_prefix():
    assert lock_file_stem("GPU-1cf2d1e7-ec4d-4df4-9a10-0c9e") == "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e"
    assert lock_file_stem("1cf2d1e7-ec4d-4df4-9a10-0c9e") == "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e"
    assert lock_file_stem("MIG-5f3c0a4e-aa") == "gpu-5f3c0a4e-aa"
    assert lock_file_stem("index0/x") == "gpu-index0_x"


def test_lock_files_made_by_the_supervisor_lock_in_a_read_only_dir(tmp_path):
    # The supervisor's files in a directory workers cannot write: flock needs no write access, and
    # neither a lock file nor the directory can be changed from here.
    for suffix in (".lock", ".turnstile"):
        (tmp_path / (lock_file_stem("GPU-test") + suffix)).touch(mode=0o444)
    tmp_path.chmod(0o555)
    try:
        holder, timing = GpuLock(str(tmp_path), "GPU-test"), GpuLock(str(tmp_path), "GPU-test")
        with holder.shared():
            assert not taken_exclusive(timing)
        assert taken_exclusive(timing)
        if os.geteuid() != 0:  # root writes anyway
            with pytest.raises(PermissionError):
                os.unlink(tmp_path / (lock_file_stem("GPU-test") + ".lock"))
    finally:
        tmp_path.chmod(0o755)


def test_a_missing_lock_file_that_cannot_be_made_is_a_clear_error(tmp_path):
    (tmp_path / "a-file").write_text("")  # no directory can be made under it, not even by root
    with pytest.raises(LockFileMissing, match="GPU lock file .*gpu-other.lock is missing and cannot be made"):
        GpuLock(str(tmp_path / "a-file" / "locks"), "GPU-other")


def test_an_evaluation_without_its_lock_file_is_the_machines_infra_error(monkeypatch, tmp_path):
    # A missing lock file is no verdict on the candidate (a runtime_error would cost the Coder a
    # correct answer): the harness says infra_error, which is never cached.
    import pathlib
    import types

    from kz_worker import harness
    from kz_worker import verdict as v

    def missing(request, device):
        raise LockFileMissing("GPU lock file /x/gpu-aaaa.lock is missing and cannot be made here")

    monkeypatch.setattr(harness.gpu_lock, "for_request", missing)
    root = pathlib.Path(__file__).resolve().parents[2]
    request = {"device": "cpu", "format": "torch", "seed": 7, "trials": 1, "scratch_dir": str(tmp_path),
               "reference_source": (root / "suite" / "kzbench" / "level1" / "02_relu.py").read_text(),
               "candidate_source": (root / "suite" / "kzbench" / "level1" / "02_relu.py").read_text(),
               "timing": {"enabled": False}}
    result = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None)).run()
    assert result["status"] == v.INFRA_ERROR, result
    assert "gpu-aaaa.lock is missing" in result["message"]


def test_a_symlink_in_a_lock_files_place_is_refused(tmp_path):
    # Following it would lock a file a candidate may unlink: the machine's infra_error instead.
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / (lock_file_stem("GPU-x") + ".lock")).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LockFileMissing, match="cannot be opened"):
        GpuLock(str(tmp_path), "GPU-x")


def test_an_evaluations_waits_for_the_gpu_are_given_to_the_stage_that_waited(monkeypatch, tmp_path):
    # A timing elsewhere holds the GPU while the evaluation precomputes its reference outputs: the
    # wait shows in the profile's gpu_wait_s and, by stage, in gpu_wait_by_stage_s (load_reference's).
    import pathlib
    import types

    from kz_worker import harness
    from kz_worker import verdict as v

    locks = tmp_path / "locks"
    monkeypatch.setattr(harness.gpu_lock, "for_request", lambda request, device: GpuLock(str(locks), "GPU-test"))
    ctx = mp.get_context("fork")
    events = ctx.Queue()
    timing = started_holder(ctx, str(locks), "exclusive", events, hold_s=LONG_HOLD_S)
    wait_for(events, [], "exclusive", "in")  # held before the evaluation starts
    root = pathlib.Path(__file__).resolve().parents[2]
    source = (root / "suite" / "kzbench" / "level1" / "02_relu.py").read_text()
    request = {"device": "cpu", "format": "torch", "seed": 7, "trials": 1, "scratch_dir": str(tmp_path),
               "reference_source": source, "candidate_source": source, "timing": {"enabled": False},
               "tolerance": {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
                             "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}}
    result = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None)).run()
    timing.join(10)
    assert timing.exitcode == 0
    assert result["status"] == v.OK, result
    profile = result["profile"]
    by_stage = profile["gpu_wait_by_stage_s"]
    assert by_stage["load_reference"] > LONG_HOLD_S / 2, result
    assert sum(by_stage.values()) == pytest.approx(profile["gpu_wait_s"]), result
    assert sum(profile["load_reference_s"].values()) > by_stage["load_reference"], result
