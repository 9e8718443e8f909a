"""The policies of ModelNew.forward ([policy] mode, cheats.Policy): strict refuses PyTorch compute,
kernelbench allows it but wants the candidate's own kernels to run and their work to reach the
output (the effect probe: the forward replayed with its launches muted), and the optional
min_custom_kernel_share. Unit checks of the rules, then whole evaluations in this process, on the
CPU, with Triton's interpreter (eval/tests/cheats_test.cpp runs the same fixtures through the
supervisor)."""
import pathlib
import types

import pytest
import torch

from kz_worker import cheats, harness
from kz_worker import verdict as v

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINEAR_RELU = ROOT / "suite" / "kzbench" / "level2" / "16_linear_relu.py"
CHEATS = ROOT / "eval" / "tests" / "cheats"
TOLERANCE = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
             "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}
STRICT = cheats.Policy(cheats.STRICT)
KERNELBENCH = cheats.Policy(cheats.KERNELBENCH)


def report(ops=None, launches=1, share=None):
    audit = cheats.AuditReport()
    audit.disallowed = cheats.disallowed_ops("triton", ops or {})
    audit.launches = launches
    audit.custom_share = share
    return audit


def checks_of(failure):
    return None if failure is None else failure.checks


def test_strict_refuses_torch_compute_and_kernelbench_allows_it():
    with_matmul = report({"aten::mm": 1, "aten::empty": 1})
    assert checks_of(cheats.audit_failure("triton", with_matmul, STRICT)) == [v.TORCH_COMPUTE_IN_FORWARD]
    assert cheats.audit_failure("triton", with_matmul, KERNELBENCH) is None


def test_both_policies_want_a_kernel_of_the_candidates_own():
    torch_only = report({"aten::mm": 1}, launches=0)
    assert checks_of(cheats.audit_failure("triton", torch_only, KERNELBENCH)) == [v.NO_CUSTOM_KERNEL]
    assert v.NO_CUSTOM_KERNEL in checks_of(cheats.audit_failure("triton", torch_only, STRICT))


def test_min_custom_kernel_share_refuses_lazy_answers_where_the_share_is_known():
    lazy = cheats.Policy(cheats.KERNELBENCH, min_custom_kernel_share=0.5)
    assert checks_of(cheats.audit_failure("triton", report(share=0.1), lazy)) == [v.LOW_CUSTOM_KERNEL_SHARE]
    assert cheats.audit_failure("triton", report(share=0.6), lazy) is None
    assert cheats.audit_failure("triton", report(share=0.1), KERNELBENCH) is None, "0: off"
    # No profile (the CPU, no CUPTI): the rule cannot tell, and the verdict says so.
    assert cheats.audit_failure("triton", report(share=None), lazy) is None
    assert v.LOW_CUSTOM_KERNEL_SHARE in cheats.unchecked("triton", report(share=None), lazy)
    assert cheats.unchecked("triton", report(share=None), KERNELBENCH) == {}


def test_the_effect_probe_runs_under_kernelbench_for_every_kernel_format():
    assert all(cheats.probes_kernel_effect(fmt, KERNELBENCH) for fmt in ("triton", "cuda-rtc", "cuda"))
    assert not cheats.probes_kernel_effect("triton", STRICT)
    assert not cheats.probes_kernel_effect("torch", KERNELBENCH)
    assert cheats.unchecked("cuda", cheats.AuditReport(), KERNELBENCH) == {}


def test_a_muted_extension_functions_call_is_undone():
    """A `cuda` extension's functions (pybind11's builtin functions; torch's own stand in here):
    muted, what they return is NaN and their arguments hold what they held before."""
    module = types.ModuleType("kz_test_extension")
    module.relu, module.relu_, module._hidden = torch.relu, torch.relu_, torch.relu
    cheats.muteable_extension(module)
    x = torch.randn(8)
    with cheats.muted_launches():
        assert torch.isnan(module.relu(x)).all()
        y = x.clone()
        module.relu_(y)
        assert torch.equal(y, x), "its in-place write undone"
    assert torch.equal(module.relu(x), torch.relu(x)), "unmuted: the function itself"
    assert module._hidden is torch.relu


def test_an_unchanged_output_under_muted_launches_is_no_kernel_effect():
    out = torch.randn(16, 8)
    same = out + 1e-7
    assert checks_of(cheats.kernel_effect_failure(same, out, TOLERANCE)) == [v.NO_KERNEL_EFFECT]
    assert cheats.kernel_effect_failure(torch.full_like(out, float("nan")), out, TOLERANCE) is None
    assert cheats.kernel_effect_failure(out[:, :4].clone(), out, TOLERANCE) is None
    assert cheats.kernel_effect_failure(None, out, TOLERANCE) is None, "the forward failed without its kernels"


def test_muted_triton_launches_run_nothing_and_count_nothing(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = _fill_kernel()
    cheats.install_launch_hooks("triton")
    out = torch.zeros(8)
    before = cheats._state.launches
    with cheats.muted_launches() as muted:
        kernel[(1,)](out, 8, BLOCK=8)
    assert torch.equal(out, torch.zeros(8)) and cheats._state.launches == before and muted["calls"] == 1
    kernel[(1,)](out, 8, BLOCK=8)
    assert torch.equal(out, torch.ones(8)) and cheats._state.launches == before + 1


def _fill_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def fill_ones(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.full([BLOCK], 1.0, tl.float32), mask=offs < n)

    return fill_ones


def evaluate(candidate: pathlib.Path, policy: str, tmp_path, monkeypatch) -> dict:
    """One whole evaluation in this process, on the CPU (Triton interpreted), trials = 1."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    request = {"device": "cpu", "format": "triton", "seed": 11, "trials": 1, "scratch_dir": str(tmp_path),
               "reference_source": LINEAR_RELU.read_text(), "candidate_source": candidate.read_text(),
               "timing": {"enabled": False}, "tolerance": TOLERANCE, "policy": {"mode": policy}}
    return harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None)).run()


@pytest.mark.parametrize("policy, status, checks", [
    ("strict", v.CHEAT_DETECTED, [v.TORCH_COMPUTE_IN_FORWARD]),
    ("kernelbench", v.OK, []),
])
def test_an_honest_partial_answer(policy, status, checks, tmp_path, monkeypatch):
    result = evaluate(CHEATS / "policy_partial_matmul_epilogue.py", policy, tmp_path, monkeypatch)
    assert (result["status"], result["checks"]) == (status, checks), result["message"]


@pytest.mark.parametrize("policy, check", [("strict", v.TORCH_COMPUTE_IN_FORWARD), ("kernelbench", v.NO_KERNEL_EFFECT)])
def test_a_decoy_kernel_beside_torch_compute_is_refused_under_both_policies(policy, check, tmp_path, monkeypatch):
    result = evaluate(CHEATS / "policy_decoy_kernel.py", policy, tmp_path, monkeypatch)
    assert (result["status"], result["checks"]) == (v.CHEAT_DETECTED, [check]), result["message"]


def test_muted_kz_rtc_launches_run_nothing_and_count_nothing():
    """On the CPU kz_rtc compiles for real and a launch raises NotRunnable: a muted one never gets there."""
    kz_rtc = pytest.importorskip("kz_rtc")
    try:
        kz_rtc._nvrtc.load_library()
    except Exception as exc:  # no NVRTC on this machine
        pytest.skip(f"NVRTC not available: {exc}")
    kz_rtc.set_compile_only(True)
    cheats.install_launch_hooks("cuda-rtc")
    module = kz_rtc.compile('extern "C" __global__ void noop(float* x) {}', name="kz_test_muted")
    before = cheats._state.launches
    with cheats.muted_launches():
        assert module.noop(torch.zeros(1), grid=(1,), block=(1,)) is None
    assert cheats._state.launches == before
    with pytest.raises(kz_rtc.NotRunnable):
        module.noop(torch.zeros(1), grid=(1,), block=(1,))


def test_a_cuda_forward_that_muted_nothing_is_unprobed_not_refused():
    assert v.NO_KERNEL_EFFECT in cheats.unprobed("cuda", muted_calls=0)
    assert cheats.unprobed("cuda", muted_calls=2) == {}
    assert cheats.unprobed("triton", muted_calls=0) == {}, "a Triton launch made only once: refused, not unprobed"
