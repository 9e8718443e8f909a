"""The worker's anti-cheating checks (kz_worker/cheats.py) in isolation: the ATen policy, on real
traces of every cuda-rtc and cuda example's forward (they cannot run on a CPU, so their kernels are
stubbed and only the PyTorch glue around them is traced), the kernel-name heuristic, the identity
snapshot, the replay detector and the timing hooks. End-to-end cases: eval/tests/cheats_test.cpp."""
import collections
import contextlib
import gc
import pathlib
import random
import re
import threading
import types

import pytest
import torch

from kz_worker import cheats, correctness, fingerprint, gpu_lock, harness, loading, timing
from kz_worker import verdict as v

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "suite" / "examples"
TASKS = sorted((ROOT / "suite" / "kzbench").glob("level*/*.py"))


def reference(task: pathlib.Path):
    module = loading.import_path(task, "kz_test_ref_" + task.stem)
    return loading.Reference(module, dict(getattr(module, "cpu_sizes", {})))


# ---- the policy ----------------------------------------------------------------------------------


def test_policy_allows_allocation_views_copies_and_fill_only():
    ops = {"aten::empty_like": 1, "aten::view": 2, "aten::zero_": 1, "aten::fill_": 1, "aten::_to_copy": 1,
           "aten::clone": 1, "aten::permute": 1, "aten::_local_scalar_dense": 1, "profiler::_record_function_enter_new": 1}
    assert cheats.disallowed_ops("triton", ops) == {}
    bad = {"aten::mm": 1, "aten::relu": 2, "aten::add": 1, "aten::cat": 1, "aten::constant_pad_nd": 1,
           "aten::softmax": 1, "mylib::fused": 1}
    assert cheats.disallowed_ops("cuda-rtc", {**ops, **bad}) == bad
    assert cheats.disallowed_ops("torch", bad) == {}, "format torch is exempt"


def test_trace_records_dispatched_ops_and_skips_launchers():
    x = torch.randn(4, 4)
    trace = cheats.OpTrace()
    with trace:
        y = torch.empty_like(x).view(16)
        y.zero_()
        cheats._state.suspended += 1  # inside a launcher: not the candidate's
        try:
            torch.exp(x)
        finally:
            cheats._state.suspended -= 1
        torch.relu(x) + x @ x
    assert cheats.disallowed_ops("triton", trace.ops) == {"aten::relu": 1, "aten::mm": 1, "aten::add": 1}
    assert "aten::exp" not in trace.ops


class FakeKernel:
    """Stands in for a kz_rtc launch: counts it, runs nothing."""

    launches = 0

    def __call__(self, *args, grid, block, shared_mem=0, stream=None):
        FakeKernel.launches += 1


def kz_rtc_or_skip():
    kz_rtc = pytest.importorskip("kz_rtc")
    try:
        kz_rtc._nvrtc.load_library()
    except Exception as exc:  # no NVRTC on this machine
        pytest.skip(f"NVRTC not available: {exc}")
    return kz_rtc


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.stem)
def test_cuda_rtc_example_forward_follows_the_policy(task, monkeypatch):
    kz_rtc = kz_rtc_or_skip()
    kz_rtc.set_compile_only(True)
    monkeypatch.setattr(kz_rtc.Kernel, "__call__", FakeKernel.__call__)
    ref = reference(task)
    candidate = loading.import_path(EXAMPLES / "cuda-rtc" / task.name, "kz_test_rtc_" + task.stem)
    torch.manual_seed(0)
    model = candidate.ModelNew(*ref.init_inputs()).eval()
    inputs = ref.inputs(1, torch.device("cpu"))
    before = FakeKernel.launches
    trace = cheats.OpTrace()
    with torch.no_grad(), trace:
        model(*inputs)
    assert FakeKernel.launches > before, "the example launches a kernel"
    assert cheats.disallowed_ops("cuda-rtc", trace.ops) == {}, dict(trace.ops)


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.stem)
def test_cuda_example_forward_follows_the_policy(task, monkeypatch):
    """load_inline is stubbed: the extension's functions return the reference's output (computed
    outside the trace), so the Python glue of forward is what is traced. The C++ side's own ATen
    calls (torch::empty...) are checked on the source."""
    ref = reference(task)
    inputs = ref.inputs(1, torch.device("cpu"))
    torch.manual_seed(0)
    ref_model = ref.build(ref.init_inputs(), 0, torch.device("cpu"))
    with torch.no_grad():
        expected = ref_model(*loading.clone_all(inputs))
    calls = []

    def fake_load_inline(name, cpp_sources, cuda_sources=None, functions=None, **kwargs):
        def kernel(*args, **kw):
            calls.append(name)
            cheats._state.suspended += 1  # "the kernel": not traced
            try:
                return expected.clone()
            finally:
                cheats._state.suspended -= 1
        return types.SimpleNamespace(**{f: kernel for f in functions})

    import torch.utils.cpp_extension as cpp_extension
    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    path = EXAMPLES / "cuda" / task.name
    candidate = loading.import_path(path, "kz_test_cuda_" + task.stem)
    torch.manual_seed(0)
    model = candidate.ModelNew(*ref.init_inputs()).eval()
    trace = cheats.OpTrace()
    with torch.no_grad(), trace:
        model(*loading.clone_all(inputs))
    assert calls, "forward calls the extension"
    assert cheats.disallowed_ops("cuda", trace.ops) == {}, dict(trace.ops)
    source = path.read_text()
    called = set(re.findall(r"\b(?:torch|at)::(\w+)\s*\(", source)) - {"Tensor"}
    assert {f"aten::{op}" for op in called} <= {f"aten::{op}" for op in cheats.KERNEL_FORMAT_ALLOWED}, called


# ---- kernel names (GPU profiler) -----------------------------------------------------------------


def example_kernel_names():
    names = set()
    for path in (EXAMPLES / "cuda-rtc").glob("*.py"):
        names |= set(re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)', path.read_text()))
        names |= set(re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s*\n?\s*(\w+)\(", path.read_text()))
    for path in (EXAMPLES / "cuda").glob("*.py"):
        for name in re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)", path.read_text()):
            names.add(f"void {name}<float>(float const*, float*, long, long)")
    for path in (EXAMPLES / "triton").glob("*.py"):
        names |= set(re.findall(r"@triton\.jit\s*\ndef (\w+)", path.read_text()))
    return names


def test_no_example_kernel_is_taken_for_a_library_kernel():
    names = example_kernel_names()
    assert len(names) >= 40
    assert [n for n in names if cheats.is_library_kernel(n)] == []


@pytest.mark.parametrize("name", [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off",
    "nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NNT", "ampere_sgemm_128x64_nn", "void gemv2T_kernel_val<int, int, float>",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(Params)",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float>", "triton_poi_fused_relu_0", "Memset (Device)",
    "Memcpy DtoD (Device -> Device)", "void cublasLt::splitKreduce_kernel<32, 16, int, float>",
])
def test_library_kernels_are_recognised(name):
    assert cheats.is_library_kernel(name)


def test_audit_failure_names_no_custom_kernel_and_compute():
    report = cheats.AuditReport()
    report.launches = 0
    report.disallowed = {"aten::mm": 1}
    failure = cheats.audit_failure("triton", report)
    assert failure.status == v.CHEAT_DETECTED
    assert failure.checks == [v.TORCH_COMPUTE_IN_FORWARD, v.NO_CUSTOM_KERNEL]
    assert "aten::mm" in failure.message
    report = cheats.AuditReport()
    report.kernels = [("void at::native::fill_kernel", 3.0)]
    assert cheats.audit_failure("cuda", report).checks == [v.NO_CUSTOM_KERNEL]
    report.kernels.append(("my_kernel", 9.0))
    report.custom_kernels = ["my_kernel"]
    assert cheats.audit_failure("cuda", report) is None
    report = cheats.AuditReport()  # cuda on a CPU / without CUPTI: nothing to go by
    assert cheats.audit_failure("cuda", report) is None
    assert cheats.audit_failure("torch", cheats.AuditReport()) is None


# ---- the identity snapshot -----------------------------------------------------------------------


def test_guard_detects_and_restores_what_changed():
    from kz_worker import correctness
    guard = cheats.Guard("triton")
    assert guard.changes() == []
    relu, norm, code = torch.relu, torch.Tensor.norm, correctness.compare_outputs.__code__
    torch.relu = lambda x: x
    torch.Tensor.any = lambda self, *a, **k: torch.tensor(False)
    correctness.compare_outputs.__code__ = (lambda out, ref, settings: {}).__code__
    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    gc.callbacks.append(lambda *a: None)
    torch.overrides.TorchFunctionMode().__enter__()
    changed = guard.changes()
    for part in ("torch.relu", "torch.Tensor.any", "kz_worker.correctness.compare_outputs.__code__",
                 "allow_tf32", "global module hooks", "gc.callbacks", "TorchFunctionMode left active"):
        assert any(part in c for c in changed), (part, changed)
    assert torch.relu is relu and torch.Tensor.norm is norm and "any" not in vars(torch.Tensor)
    assert correctness.compare_outputs.__code__ is code
    assert guard.changes() == [], "everything was restored"
    handle.remove()


def test_guard_sees_closures_and_keyword_defaults_changed_in_place():
    """No audit event reports a closure cell's write or a dict's item set: the Guard compares them."""
    from kz_worker import harness
    guard = cheats.Guard("triton")
    cell = harness._timed_run.__closure__[0]
    generator = cell.cell_contents
    kwdefaults = next(k for label, _, _, _, k in guard.codes if k)
    key = next(iter(kwdefaults))
    saved = kwdefaults[key]
    cell.cell_contents = lambda run: iter([None])
    kwdefaults[key] = object()
    changed = guard.changes()
    assert "kz_worker.harness._timed_run (a variable of its closure)" in changed
    assert any(c.endswith(".__kwdefaults__ (changed in place)") for c in changed), changed
    assert cell.cell_contents is generator and kwdefaults[key] is saved, "both restored"
    assert guard.changes() == []


def test_guards_fast_identity_check_misses_no_swap_deletion_or_lookalike():
    """The Guard first compares every watched entry by identity in C, and walks its entries only when
    that check fails: each of these must fail it."""
    guard = cheats.Guard("triton")
    functional = torch.nn.functional
    relu, gelu = functional.relu, functional.gelu

    class EqualsAnything:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    def swap():  # same values, same dict order, other names
        del functional.relu, functional.gelu
        functional.gelu, functional.relu = relu, gelu

    def delete():
        del functional.relu

    def lookalike():
        functional.relu = EqualsAnything()

    for change in (swap, delete, lookalike):
        change()
        assert not cheats._identities_unchanged(guard.identities), change.__name__
        assert any("torch.nn.functional.relu" in c for c in guard.changes()), change.__name__
        assert functional.relu is relu and functional.gelu is gelu, "restored"
        assert cheats._identities_unchanged(guard.identities)


def test_guard_verify_raises_harness_patched_and_background_thread():
    guard = cheats.Guard("triton")
    original = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 0.001
    with pytest.raises(v.Failure) as caught:
        guard.verify("after import")
    assert caught.value.checks == [v.HARNESS_PATCHED] and caught.value.status == v.CHEAT_DETECTED
    assert torch.cuda.Event.elapsed_time is original
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with pytest.raises(v.Failure) as caught:
            guard.verify("after forward")
        assert caught.value.checks == [v.BACKGROUND_THREAD]
    finally:
        stop.set()
        thread.join()
    guard.verify("after the thread ended")


def test_guard_survives_the_audit_machinery():
    cheats.warm_up(torch.device("cpu"))
    guard = cheats.Guard("triton")
    with cheats.OpTrace():
        torch.relu(torch.randn(3))
    assert guard.changes() == []


# ---- outputs -------------------------------------------------------------------------------------


def test_replay_detector_compares_bits():
    a = torch.randn(8)
    differ = {("s0", "s1"): True, ("s0", "s2"): False}
    detector = cheats.ReplayDetector(lambda x, y: differ[tuple(sorted((x, y)))])
    detector.check("s0", a)
    detector.check("s0", a)  # the same set again: fine
    detector.check("s2", a.clone())  # references equal: fine
    with pytest.raises(v.Failure) as caught:
        detector.check("s1", a.clone())
    assert caught.value.checks == [v.REPLAYED_OUTPUT]
    detector.check("s1", a + 1e-7)  # another output: no replay
    zero = cheats.ReplayDetector(lambda x, y: True)
    zero.check("s0", torch.tensor([0.0]))
    zero.check("s1", torch.tensor([-0.0]))  # the same value, other bits


def test_output_aliasing_a_reference_output():
    ref = torch.randn(4, 4)
    cheats.check_aliases_reference(ref.clone(), [ref])
    with pytest.raises(v.Failure) as caught:
        cheats.check_aliases_reference(ref.view(16), [ref])
    assert caught.value.checks == [v.OUTPUT_ALIASES_REFERENCE]


def test_exact_type_is_checked_before_any_method_runs():
    touched = []

    class Spy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            touched.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    out = torch.randn(3).as_subclass(Spy)
    touched.clear()
    with pytest.raises(v.Failure) as caught:
        cheats.check_output_types(out, torch.randn(3))
    assert caught.value.checks == [v.OUTPUT_TYPE] and touched == []


def test_poison_overwrites_but_spares_parameters():
    weight = torch.nn.Parameter(torch.ones(4))
    scratch, ints = torch.ones(4), torch.ones(4, dtype=torch.int64)
    cheats.poison([scratch, ints, weight.data], keep=[weight])
    assert torch.isnan(scratch).all() and (ints == -1).all() and (weight == 1).all()


# ---- timing hooks --------------------------------------------------------------------------------


def test_sample_runs_cover_every_buffer_in_moved_rounds():
    sampled = timing.sample_runs(100, 4, random.Random(1))
    for k in range(4):
        mine = [i for i in sampled if i % 4 == k]
        assert len(mine) == timing.SAMPLED_PER_BUFFER
        assert all((i // 4) % 4 != 0 for i in mine), "rounds whose data differs from the warm-up's"
    assert timing.sample_runs(3, 4, random.Random(1)) == {0, 1, 2}
    assert timing.sample_runs(8, 4, random.Random(1)) == set(range(8)), "too few moved runs: the others too"


def test_which_runs_are_sampled_cannot_be_told_in_advance():
    draws = {timing.sample_runs(100, 4, random.Random(seed)) for seed in range(20)}
    assert len(draws) == 20
    # Every run of a moved round is checked in some evaluation: none is safe to cheat in.
    moved = {i for i in range(100) if (i // 4) % 4 != 0}
    assert set().union(*(timing.sample_runs(100, 4, random.Random(seed)) for seed in range(400))) == moved


def test_the_sampled_runs_are_drawn_before_the_candidate_from_the_os(tmp_path, monkeypatch):
    draws = []
    for k in range(4):  # the same request (seed 7) each time
        (tmp_path / str(k)).mkdir()
        evaluation, _ = timed_evaluation(tmp_path / str(k), monkeypatch)  # _precompute: no candidate yet
        assert len(evaluation.sampled_runs) == 4 * timing.SAMPLED_PER_BUFFER
        draws.append(evaluation.sampled_runs)
    assert len(set(draws)) > 1, "the same seed, other runs checked (4 equal draws: 1 in 6^12)"


def test_the_guard_is_verified_after_a_random_quarter_of_the_timed_runs_and_the_last():
    draws = [timing.guard_runs(100, random.Random(seed)) for seed in range(400)]
    assert all(99 in guarded for guarded in draws), "the last run always: nothing is undone after it"
    share = sum(len(guarded - {99}) for guarded in draws) / (400 * 99)
    assert abs(share - timing.GUARDED_SHARE) < 0.02, share
    assert len(set(draws)) == 400, "which runs cannot be told in advance"


class PatchesOnCallsAndUndoes(torch.nn.Module):
    """Swaps torch.cuda.synchronize for a stand-in in its calls from `start` to `stop` (exclusive)
    and puts the real one back after: a patch that spans those run boundaries only."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.calls, self.start, self.stop = 0, start, stop
        self.real = torch.cuda.synchronize

    def forward(self, x):
        self.calls += 1
        torch.cuda.synchronize = (lambda *args: None) if self.start <= self.calls < self.stop else self.real
        return torch.relu(x)


def test_a_patch_spanning_guarded_timed_runs_is_caught(tmp_path, monkeypatch):
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)  # 2 x 4 warm-ups, then 24 runs
    evaluation.guarded_runs = frozenset({20, 23})
    evaluation.sampled_runs = frozenset()
    with pytest.raises(v.Failure) as caught:  # patched after timed runs 9-22, undone in run 23
        evaluation._time(ref_model, PatchesOnCallsAndUndoes(8 + 10, 8 + 24))
    assert caught.value.checks == [v.HARNESS_PATCHED] and "after a timed forward" in caught.value.message
    assert torch.cuda.synchronize is not None and "lambda" not in repr(torch.cuda.synchronize), "restored"


def test_a_patch_undone_between_verifies_is_left_to_the_draw(tmp_path, monkeypatch):
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    evaluation.guarded_runs = frozenset({23})
    evaluation.sampled_runs = frozenset()
    evaluation._time(ref_model, PatchesOnCallsAndUndoes(8 + 10, 8 + 15))  # after runs 9-13, undone in run 14
    assert evaluation.result["speedup"] > 0  # what a patch shorter than half the runs can move: not the median


class FakeTimer:
    launch_spin = "none"

    def time_once(self, model, inputs, after=None):
        out = model(*inputs)
        if after is not None:
            after(out)
        return timing.Sample(1.0, 1.0)


def test_time_interleaved_hands_every_candidate_output_and_announces_rounds():
    seen, rounds = [], []
    sets = [[torch.full((2,), float(k))] for k in range(3)]
    settings = {"warmup_runs": 1, "runs": 7, "l2_flush_mb": 1}
    measured = timing.time_interleaved(lambda x: x * 2, lambda x: x + 1, sets, settings, torch.device("cpu"),
                                       after_candidate=lambda k, out, run: seen.append((k, run, float(out[0]))),
                                       new_round=rounds.append, timer=FakeTimer())
    assert measured["speedup"] == 1.0
    assert seen[:3] == [(0, None, 1.0), (1, None, 2.0), (2, None, 3.0)]  # warm-up
    assert [(k, run) for k, run, _ in seen[3:]] == [(i % 3, i) for i in range(7)]
    assert rounds == [1, 2]


# ---- the timing protocol's checks, on the CPU (a stand-in timer instead of CUDA events) -----------


class CPUTimer(FakeTimer):
    def __init__(self, device, l2_flush_mb, launch_spin_us=0):
        pass


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


class CachedByPointer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        if x.data_ptr() not in self.cache:
            self.cache[x.data_ptr()] = torch.relu(x)
        return self.cache[x.data_ptr()]


def timed_evaluation(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "Timer", CPUTimer)
    request = {"device": "cpu", "format": "torch", "seed": 7, "trials": 2, "scratch_dir": str(tmp_path),
               "tolerance": {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
                             "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2},
               "timing": {"enabled": True, "warmup_runs": 2, "runs": 24, "input_sets": 4, "l2_flush_mb": 1}}
    evaluation = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None))
    ref = reference(ROOT / "suite" / "kzbench" / "level1" / "02_relu.py")
    ref_model = ref.build(ref.init_inputs(), 7, torch.device("cpu"))
    evaluation._precompute(ref, ref_model, timed=True)
    evaluation.guard = cheats.Guard("torch")
    evaluation.replays = cheats.ReplayDetector(evaluation.expected.differ)
    return evaluation, ref_model


class MutatesItsInput(torch.nn.Module):
    """Right outputs, but the input is overwritten after use (in every run, so in the sampled ones)."""

    def forward(self, x):
        out = torch.relu(x)
        x.zero_()
        return out


class RecordingLock:
    """Stands in for gpu_lock.GpuLock: records where each hold begins and ends in `events`."""

    waited_s = 0.0  # GpuLock's wait counter: this one never waits

    def __init__(self, events: list):
        self.events = events

    @contextlib.contextmanager
    def exclusive(self):
        yield from self._held("exclusive")

    @contextlib.contextmanager
    def shared(self):
        yield from self._held("shared")

    def _held(self, mode):
        self.events.append(f"{mode} begins")
        try:
            yield
        finally:
            self.events.append(f"{mode} ends")

    def report(self) -> dict:
        return {}


class ReleasingLock(RecordingLock):
    """A RecordingLock whose released() (a compile inside a shared hold) records letting go and taking again."""

    @contextlib.contextmanager
    def released(self):
        self.events.append("released")
        yield
        self.events.append("taken again")


def recorded_evaluation(tmp_path, monkeypatch):
    """timed_evaluation, with the GPU lock's holds and the value comparisons recorded in order."""
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    events = []
    evaluation.gpu = RecordingLock(events)
    for module, name in ((correctness, "compare_outputs"), (fingerprint, "check_unchanged")):
        def recording(*args, original=getattr(module, name), name=name):
            events.append(name)
            return original(*args)
        monkeypatch.setattr(module, name, recording)
    evaluation.guard = cheats.Guard("torch")  # the stand-ins are no candidate's patches
    return evaluation, ref_model, events


def test_modelnew_is_constructed_outside_the_gpu_lock_and_moved_to_the_device_inside(tmp_path, monkeypatch):
    """Its constructor may compile (kz_rtc.compile, load_inline): seconds of CPU that must not hold
    the GPU lock. Moving it to the device is GPU work: shared, never beside another worker's timing."""
    events = []

    class Recorded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            events.append("constructed")

        def to(self, *args, **kwargs):
            events.append("moved")
            return super().to(*args, **kwargs)

        def forward(self, x):
            return torch.relu(x)

    monkeypatch.setattr(harness.gpu_lock, "for_request", lambda request, device: RecordingLock(events))
    monkeypatch.setattr(harness.loading, "load_candidate", lambda source, scratch, name: Recorded)
    request = {"device": "cpu", "format": "torch", "seed": 7, "trials": 1, "scratch_dir": str(tmp_path),
               "reference_source": (ROOT / "suite" / "kzbench" / "level1" / "02_relu.py").read_text(),
               "candidate_source": "class ModelNew: pass\n", "timing": {"enabled": False},
               "tolerance": {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
                             "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}}
    result = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None)).run()
    assert result["status"] == v.OK, result["message"]
    held = 0
    for event in events:
        held += {"shared begins": 1, "shared ends": -1}.get(event, 0)
        if event == "constructed":
            assert held == 0, events
        if event == "moved":
            assert held == 1, events


def test_the_audit_holds_the_gpu_for_the_forward_and_not_for_the_profiler(monkeypatch):
    """The profiler's start and its processing of the trace (~0.5 s of CPU) run outside the hold."""
    events = []

    class Profile:  # torch.autograd.profiler.profile's stand-in: no CUDA here
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            events.append("profiler starts")

        def __exit__(self, *exc):
            events.append("profiler stops")

        @property
        def function_events(self):
            events.append("trace processed")
            return []

    class Model(torch.nn.Module):
        def forward(self, x):
            events.append("forward")
            return x.clone()

    monkeypatch.setattr(torch.autograd.profiler, "profile", Profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    cpu_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *size, device=None: cpu_zeros(*size))
    lock = RecordingLock(events)
    out, report = cheats.audit_forward("cuda", Model(), [torch.ones(3)], torch.device("cuda"), lock.shared)
    assert torch.equal(out, torch.ones(3)) and report.kernels is None  # no kernels seen: no list
    assert "listed no kernel" in report.no_kernel_list
    assert events == ["shared begins", "shared ends", "profiler starts", "shared begins", "forward", "shared ends",
                      "profiler stops", "trace processed"], events


class ProfilerThatFailsToStart:
    def __init__(self, **kwargs):
        pass

    def __enter__(self):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")


def test_a_cuda_audit_without_a_kernel_list_passes_no_custom_kernel_and_says_it_could_not_check(tmp_path,
                                                                                                monkeypatch):
    """The profiler failing (no CUPTI) must not cost the Coder a correct answer, nor hide that the check
    did not run: the verdict's `unchecked` names it, with why."""
    monkeypatch.setattr(torch.autograd.profiler, "profile", ProfilerThatFailsToStart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    cpu_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *size, device=None: cpu_zeros(*size))
    monkeypatch.setattr(cheats._state, "profiler_worked", False)  # the warm-up got no list either: no CUPTI
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    evaluation.format, evaluation.profiled = "cuda", True

    class ReluInALauncher(torch.nn.Module):  # its ops hidden from the trace, as a custom kernel's are
        def forward(self, x):
            return cheats._suspending(torch.relu)(x)

    evaluation._audit(ReluInALauncher())
    assert "did not start (RuntimeError: CUPTI_ERROR_NOT_INITIALIZED)" in evaluation.result["unchecked"][v.NO_CUSTOM_KERNEL]
    report = cheats.AuditReport()
    assert cheats.unchecked("cuda", report) == {}, "a kernel list, or no profiling: nothing unchecked"
    report.no_kernel_list = "the profiler listed no kernel"
    assert cheats.audit_failure("cuda", report) is None
    assert set(cheats.unchecked("cuda", report)) == {v.NO_CUSTOM_KERNEL}
    assert cheats.unchecked("cuda-rtc", report) == {}, "its launch counters decide no_custom_kernel"


def test_a_profiler_that_worked_at_the_warm_up_and_fails_in_the_audit_was_stopped_by_the_candidate(tmp_path,
                                                                                                  monkeypatch):
    """Before any candidate code, the warm-up got a kernel list: a forward without one is the candidate's
    doing, and no_custom_kernel fails instead of going unchecked."""
    monkeypatch.setattr(torch.autograd.profiler, "profile", ProfilerThatFailsToStart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    cpu_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *size, device=None: cpu_zeros(*size))
    monkeypatch.setattr(cheats._state, "profiler_worked", True)
    evaluation, _ = timed_evaluation(tmp_path, monkeypatch)
    evaluation.format, evaluation.profiled = "cuda", True

    class ReluInALauncher(torch.nn.Module):
        def forward(self, x):
            return cheats._suspending(torch.relu)(x)

    with pytest.raises(v.Failure) as caught:
        evaluation._audit(ReluInALauncher())
    assert caught.value.status == v.CHEAT_DETECTED and caught.value.checks == [v.NO_CUSTOM_KERNEL]
    assert "stopped it" in caught.value.message and "unchecked" not in evaluation.result
    report = cheats.AuditReport()
    report.no_kernel_list = "the profiler did not start"
    assert cheats.unchecked("cuda", report) == {}
    report.launches = 1
    assert cheats.audit_failure("cuda-rtc", report) is None, "cuda-rtc's check is its launch counter's"


def test_the_checks_kernels_are_loaded_by_running_the_checks_once(monkeypatch):
    """process.prepare_device runs this on a GPU; on the CPU it runs the same checks, which must pass on
    a tensor and its copy (a failure here would be an infra_error in every prepared child)."""
    ran = []
    for module, name in ((correctness, "compare_outputs"), (fingerprint, "check_unchanged"), (cheats, "poison")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: ran.append(_n) or _f(*a, **k))
    harness.load_check_kernels(torch.device("cpu"))
    assert ran == ["compare_outputs", "check_unchanged", "poison"]


def during(events: list, mode: str) -> list:
    """The events recorded inside the first hold of `mode`."""
    return events[events.index(f"{mode} begins") + 1:events.index(f"{mode} ends")]


def after_the_hold(events: list) -> list:
    """The events recorded inside the shared hold after the exclusive one (the deferred comparisons)."""
    return during(events[events.index("exclusive ends"):], "shared")


SAMPLED = 4 * timing.SAMPLED_PER_BUFFER  # timed_evaluation's 4 input sets


def snapshot_bytes(evaluation) -> int:
    """One sampled run's copy for 02_relu: its input and an output of the same size."""
    x = evaluation.expected.inputs(harness.timing_key(0))[0]
    return 2 * x.numel() * x.element_size()


def test_timed_runs_of_an_honest_model_pass(tmp_path, monkeypatch):
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    evaluation._time(ref_model, Relu())
    assert evaluation.result["speedup"] == 1.0
    assert evaluation.profile["timing_after_hold_s"]["checks"] >= 0.0
    assert set(evaluation.profile["timing_s"]) == {"inputs", "warmup", "timed", "new_round", "guard", "samples"}
    assert evaluation.profile["timing_end"] == "stream" and "end" not in evaluation.result["timing"]


def test_sampled_outputs_are_compared_after_the_exclusive_hold(tmp_path, monkeypatch):
    evaluation, ref_model, events = recorded_evaluation(tmp_path, monkeypatch)
    evaluation._time(ref_model, Relu())
    assert "compare_outputs" not in during(events, "exclusive")
    assert "check_unchanged" not in during(events, "exclusive")
    assert after_the_hold(events) == ["check_unchanged", "compare_outputs"] * SAMPLED


def timed_cheat(tmp_path, monkeypatch, candidate):
    """The failure _time raises for `candidate` (a cheat in a timed run, with no speed recorded) and
    the lock's events."""
    evaluation, ref_model, events = recorded_evaluation(tmp_path, monkeypatch)
    with pytest.raises(v.Failure) as caught:
        evaluation._time(ref_model, candidate)
    assert caught.value.status == v.CHEAT_DETECTED and caught.value.message.startswith("timed run ")
    assert evaluation.result.get("timing") is None and "speedup" not in evaluation.result
    return caught.value, events


def test_a_result_cached_by_pointer_is_wrong_during_timing(tmp_path, monkeypatch):
    failure, events = timed_cheat(tmp_path, monkeypatch, CachedByPointer())
    assert failure.checks == [v.OUTPUT_MISMATCH, v.WRONG_DURING_TIMING]
    assert "compare_outputs" in after_the_hold(events), "caught by the comparisons after the hold"


def test_an_input_mutated_in_a_timed_run_is_caught_after_the_hold(tmp_path, monkeypatch):
    failure, events = timed_cheat(tmp_path, monkeypatch, MutatesItsInput())
    assert failure.checks == [v.INPUT_MUTATED, v.WRONG_DURING_TIMING]
    assert after_the_hold(events) == ["check_unchanged"], "the first deferred check fails"


def test_runs_whose_copies_exceed_the_budget_are_compared_in_the_hold(tmp_path, monkeypatch):
    evaluation, ref_model, events = recorded_evaluation(tmp_path, monkeypatch)
    monkeypatch.setattr(timing, "SNAPSHOT_BUDGET_BYTES", 2 * snapshot_bytes(evaluation))
    evaluation.guard = cheats.Guard("torch")
    evaluation._time(ref_model, Relu())
    assert during(events, "exclusive").count("compare_outputs") == SAMPLED - 2
    assert after_the_hold(events).count("compare_outputs") == 2, "the first two fit the budget"
    assert evaluation.result["speedup"] == 1.0


def test_with_no_budget_a_cached_result_is_still_caught_in_the_hold(tmp_path, monkeypatch):
    evaluation, ref_model, events = recorded_evaluation(tmp_path, monkeypatch)
    monkeypatch.setattr(timing, "SNAPSHOT_BUDGET_BYTES", 1)
    evaluation.guard = cheats.Guard("torch")
    with pytest.raises(v.Failure) as caught:
        evaluation._time(ref_model, CachedByPointer())
    assert caught.value.checks == [v.OUTPUT_MISMATCH, v.WRONG_DURING_TIMING]
    assert caught.value.message.startswith("timed run ")
    assert "compare_outputs" in during(events, "exclusive")
    assert "shared begins" not in events[events.index("exclusive ends"):], "the hold ended in the failure"
    assert "speedup" not in evaluation.result


def test_a_copy_refused_for_memory_is_compared_in_the_hold(tmp_path, monkeypatch):
    evaluation, ref_model, events = recorded_evaluation(tmp_path, monkeypatch)
    refused = []

    def clone_output(out, original=cheats.clone_output):
        if not refused:
            refused.append(out)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(out)

    monkeypatch.setattr(cheats, "clone_output", clone_output)
    evaluation.guard = cheats.Guard("torch")
    evaluation._time(ref_model, Relu())
    assert refused
    assert during(events, "exclusive").count("compare_outputs") == 1
    assert after_the_hold(events).count("compare_outputs") == SAMPLED - 1


def test_a_copy_failing_otherwise_is_not_taken_for_a_memory_limit(tmp_path, monkeypatch):
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)

    def clone_output(out):
        raise ValueError("not about memory")

    monkeypatch.setattr(cheats, "clone_output", clone_output)
    evaluation.guard = cheats.Guard("torch")
    with pytest.raises(ValueError):
        evaluation._time(ref_model, Relu())


def test_the_gpu_budget_is_a_share_of_what_the_allocator_can_still_get(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (40 * gib, 100 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * gib)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 0.1)
    cuda = torch.device("cuda", 0)
    assert timing.snapshot_budget(cuda) == 2 * gib, "a quarter of 0.1 * 100 GiB - 2 GiB reserved"
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0)
    assert timing.snapshot_budget(cuda) == timing.SNAPSHOT_BUDGET_BYTES, "a quarter of 40 GiB free: the cap"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (4 * gib, 100 * gib))
    assert timing.snapshot_budget(cuda) == gib, "a quarter of 4 GiB free"
    assert timing.snapshot_budget(torch.device("cpu")) == timing.SNAPSHOT_BUDGET_BYTES


def test_a_failed_verdict_carries_no_speedup(tmp_path, monkeypatch):
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    evaluation._time(ref_model, Relu())
    assert evaluation.result["speedup"] == 1.0
    evaluation._fail(v.INCORRECT, "after timing: output mismatch", [v.OUTPUT_MISMATCH, v.WRONG_AFTER_TIMING])
    assert evaluation.result["timing"] is None
    assert not {"runtime_ms", "ref_runtime_ms", "speedup"} & set(evaluation.result)


@pytest.mark.parametrize("budget, expected", [(1 << 30, 8 * 2 * 4096), (10_000, 10_000)])
def test_snapshots_reserve_their_memory_before_the_hold(monkeypatch, budget, expected):
    """One block as large as the copies will take (within the budget), allocated and freed before
    the exclusive hold, so the allocator has it cached when the copies are taken in the hold."""
    allocated = []
    real_empty = torch.empty
    monkeypatch.setattr(timing, "snapshot_budget", lambda device, memory=None: budget)
    monkeypatch.setattr(torch, "empty", lambda size, dtype, device: allocated.append((size, dtype, str(device)))
                        or real_empty(0))
    snapshots = timing.Snapshots(torch.device("cuda:0"))
    snapshots.reserve(8, torch.ones(1024), [torch.ones(1024), 3])
    assert allocated == [(expected, torch.uint8, "cuda:0")]
    assert snapshots.used_bytes == 0, "reserving takes nothing from the budget"
    timing.Snapshots(torch.device("cpu")).reserve(8, torch.ones(1024), [torch.ones(1024)])
    assert len(allocated) == 1, "on the CPU there is no allocator cache to fill"


def test_compiles_run_with_the_gpu_let_go_of(monkeypatch):
    """Triton's JIT, kz_rtc.compile and load_inline, called inside a forward's shared hold, let go of
    the GPU for the compile (GpuLock.released)."""
    events = []

    monkeypatch.setattr(gpu_lock, "_process_lock", ReleasingLock(events))
    compile_kernel = gpu_lock.releasing(lambda source: events.append(f"compiling {source}") or "kernel")
    assert compile_kernel("k") == "kernel"
    assert events == ["released", "compiling k", "taken again"]
    import triton.runtime.jit as jit
    cheats.install_launch_hooks("triton")
    assert jit.JITFunction._do_compile.__code__ is compile_kernel.__code__, "the same wrapper around the JIT's compile"
    assert jit.JITFunction._do_compile.__wrapped__.__code__ is cheats._loading_handles(print).__code__


def test_a_triton_kernels_launcher_and_module_load_with_its_compile(monkeypatch):
    """Triton builds the launcher (gcc) and loads the module at the first kernel.run after the compile,
    inside the forward's shared hold: the hook does it in the compile, with the GPU let go of."""
    events = []

    class CompiledKernel:
        def _init_handles(self):
            events.append("launcher built, module loaded")

    monkeypatch.setattr(gpu_lock, "_process_lock", ReleasingLock(events))
    do_compile = gpu_lock.releasing(cheats._loading_handles(lambda *a: events.append("compiled") or CompiledKernel()))
    assert isinstance(do_compile("key", "signature"), CompiledKernel)
    assert events == ["released", "compiled", "launcher built, module loaded", "taken again"]
    events.clear()
    skipped = gpu_lock.releasing(cheats._loading_handles(lambda *a: None))  # a jit_cache_hook skipped the compile
    assert skipped() is None and events == ["released", "taken again"]

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):  # Triton 3.6's
        events.append(f"compiled, warmup={warmup}")
        return CompiledKernel()

    events.clear()
    hooked = cheats._loading_handles(do_compile)
    hooked(None, "key", {}, 0, {}, None, {}, True)  # JITFunction.warmup: Triton launches nothing, loads nothing
    hooked(None, "key", {}, 0, {}, None, {}, warmup=True)  # preload, by keyword
    assert events == ["compiled, warmup=True"] * 2, "a warm-up compile loads at its first run, as in Triton"
    hooked(None, "key", {}, 0, {}, None, {}, False)  # JITFunction.run's first launch
    assert events[-2:] == ["compiled, warmup=False", "launcher built, module loaded"]


class CopiesTheHarnesssExpectedOutput(torch.nn.Module):
    """Computes nothing: looks through the harness's Expected (found with gc) for a tensor that could be
    the reference output for its input, and returns a copy (copies are allowed in forward)."""

    def forward(self, x):
        for expected in (o for o in gc.get_objects() if type(o).__name__ == "Expected"):
            seen, todo = set(), [vars(expected)]
            while todo:
                value = todo.pop()
                if id(value) in seen:
                    continue
                seen.add(id(value))
                if isinstance(value, torch.Tensor):
                    if value.shape == x.shape and value.device == x.device and torch.equal(value, torch.relu(x)):
                        return value.clone()
                elif isinstance(value, dict):
                    todo += list(value.values())
                elif isinstance(value, (tuple, list)):
                    todo += list(value)
                elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
                    todo.append(vars(value))
        return torch.zeros_like(x)


def test_the_harness_keeps_no_reference_output_to_copy(tmp_path, monkeypatch):
    """Expected holds digests and sketches, not the reference's outputs: nothing in it is an output."""
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    with pytest.raises(v.Failure) as caught:
        evaluation._time(ref_model, CopiesTheHarnesssExpectedOutput())
    assert caught.value.checks[-1] == v.WRONG_DURING_TIMING


def test_the_audit_is_profiled_on_a_gpu_for_cuda_and_for_every_format_only_when_asked():
    gpu, cpu = torch.device("cuda:0"), torch.device("cpu")
    assert cheats.profiles_audit("cuda", gpu, "cuda")  # its no_custom_kernel check reads the kernel list
    assert not cheats.profiles_audit("cuda-rtc", gpu, "cuda") and not cheats.profiles_audit("triton", gpu, "cuda")
    assert cheats.profiles_audit("cuda-rtc", gpu, "all") and cheats.profiles_audit("triton", gpu, "all")
    assert not any(cheats.profiles_audit(fmt, cpu, "all") for fmt in ("cuda", "cuda-rtc", "triton"))


def test_the_compile_baseline_is_timed_beside_the_reference_from_the_same_end(tmp_path, monkeypatch):
    """[timing] baseline = "compile": the compiled reference (here a stand-in: the reference itself)
    runs beside the reference in every timed run, and the verdict gets its speedup over it."""
    order = []

    def recorded(name, model):
        def run(*inputs):
            order.append(name)
            return model(*inputs)
        return run

    sets = [[torch.full((2,), float(k))] for k in range(2)]
    settings = {"warmup_runs": 1, "runs": 4, "l2_flush_mb": 1}
    measured = timing.time_interleaved(recorded("ref", Relu()), recorded("cand", Relu()), sets, settings,
                                       torch.device("cpu"), timer=FakeTimer(), compiled=recorded("compiled", Relu()))
    assert order[6:] == ["ref", "compiled", "cand", "cand", "ref", "compiled"] * 2
    assert measured["compile_speedup"] == 1.0 and measured["compiled"]["runs"] == 4
    evaluation, ref_model = timed_evaluation(tmp_path, monkeypatch)
    evaluation.compiled_reference = ref_model
    evaluation._time(ref_model, Relu())
    assert evaluation.result["compile_speedup"] > 0 and "compiled" in evaluation.result["timing"]
