"""The correctness rules of correctness.py: exact structure, dtype tolerances, the norm check."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kz_worker import correctness, fingerprint
from kz_worker import verdict as v

SETTINGS = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
            "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}


def fired(out, ref):
    with pytest.raises(v.Failure) as caught:
        correctness.compare_outputs(out, ref, SETTINGS)
    return caught.value.checks


def test_equal_outputs_pass_with_zero_error():
    ref = torch.randn(8, 8)
    stats = correctness.compare_outputs(ref.clone(), ref, SETTINGS)
    assert stats["max_abs_error"] == 0.0


def test_small_fp32_error_passes_large_fails():
    ref = torch.randn(64)
    assert correctness.compare_outputs(ref + 1e-6, ref, SETTINGS)["max_abs_error"] < 1e-5
    assert fired(ref + 1e-2, ref) == [v.OUTPUT_MISMATCH]


def test_zeros_for_a_near_zero_reference_fail_the_norm_check():
    ref = torch.randn(1000) * 1e-6   # every element within atol of zero
    assert fired(torch.zeros_like(ref), ref) == [v.OUTPUT_NORM_MISMATCH]


def test_exact_type_shape_dtype_and_structure():
    ref = torch.randn(4, 4)

    class Sneaky(torch.Tensor):
        pass

    assert fired(ref.clone().as_subclass(Sneaky), ref) == [v.OUTPUT_TYPE]
    assert fired(ref.reshape(16), ref) == [v.OUTPUT_SHAPE]
    assert fired(ref.double(), ref) == [v.OUTPUT_DTYPE]
    assert fired((ref,), ref) == [v.OUTPUT_TYPE]
    assert fired([ref], (ref,)) == [v.OUTPUT_STRUCTURE]


def test_nan_where_reference_is_finite():
    ref = torch.randn(10)
    out = ref.clone()
    out[3] = float("nan")
    assert fired(out, ref) == [v.OUTPUT_NOT_FINITE]


def test_half_precision_uses_the_looser_tolerance():
    ref = torch.randn(256).half()
    assert correctness.compare_outputs((ref.float() * 1.002).half(), ref, SETTINGS)
    assert fired(ref * 2, ref) == [v.OUTPUT_MISMATCH]


def test_input_mutation_and_aliasing():
    x = torch.randn(5)
    generated = fingerprint.digest([x])
    fingerprint.check_unchanged([x], generated)
    x[0] += 1
    with pytest.raises(v.Failure) as caught:
        fingerprint.check_unchanged([x], generated)
    assert caught.value.checks == [v.INPUT_MUTATED]
    with pytest.raises(v.Failure) as caught:
        correctness.check_aliasing(x, [x], torch.randn(5), [torch.randn(5)])
    assert caught.value.checks == [v.OUTPUT_ALIASES_INPUT]


# ---- chunked comparison: the same verdicts as the whole-tensor rules, in bounded memory -----------


def whole_tensor_compare(o, r, settings, what="output"):
    """The rules on whole float64 copies (compare_tensor before it was chunked): the expected results."""
    if not o.dtype.is_floating_point:
        if not torch.equal(o, r):
            raise v.Failure(v.INCORRECT, f"{what}: integer/bool values differ", [v.OUTPUT_MISMATCH])
        return {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    ref_finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), ref_finite):
        bad = int((torch.isfinite(o) != ref_finite).sum())
        raise v.Failure(v.INCORRECT, f"{what}: {bad} elements are NaN/Inf where the reference is finite (or vice versa)",
                        [v.OUTPUT_NOT_FINITE])
    tol = correctness.tolerance_for(r.dtype, settings)
    o64, r64 = o.double()[ref_finite], r.double()[ref_finite]
    diff = (o64 - r64).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    allowed = tol.atol + tol.rtol * r64.abs()
    if diff.numel() and bool((diff > allowed).any()):
        count = int((diff > allowed).sum())
        raise v.Failure(v.INCORRECT,
                        f"{what}: {count}/{diff.numel()} elements outside atol={tol.atol:g} rtol={tol.rtol:g} "
                        f"(max abs error {max_abs:.3g})", [v.OUTPUT_MISMATCH])
    ref_norm = float(r64.norm()) if r64.numel() else 0.0
    err_norm = float((o64 - r64).norm()) if r64.numel() else 0.0
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    if rel_norm > tol.norm_tol:
        raise v.Failure(v.INCORRECT,
                        f"{what}: relative error norm {rel_norm:.3g} > {tol.norm_tol:g} "
                        f"(reference norm {ref_norm:.3g})", [v.OUTPUT_NORM_MISMATCH])
    return {"max_abs_error": max_abs, "max_rel_norm_error": rel_norm}


def outcome(function, *args, approx=False):
    """("failed", checks, message) or ("passed", max abs error, relative norm error); approx: the norm
    error to within rounding (a sum of squares, not torch's norm)."""
    try:
        stats = function(*args)
    except v.Failure as failure:
        return ("failed", failure.checks, failure.message)
    rel_norm = stats["max_rel_norm_error"]
    return ("passed", stats["max_abs_error"], pytest.approx(rel_norm, rel=1e-9) if approx else rel_norm)


def non_contiguous(t):
    """The same values in another layout (reversed dimension order in memory)."""
    dims = list(range(t.dim()))[::-1]
    return t.permute(dims).contiguous().permute(dims)


def cases(dtype):
    """(name, out, ref) for one dtype: passing and failing outputs, with NaN/Inf around chunk boundaries
    of 7 elements (indices 6, 7, 13, 14) and in the last chunk."""
    g = torch.Generator().manual_seed(1234)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    for shape in ((70,), (6, 13), (3, 4, 5)):
        ref = randn(*shape)
        flat = ref.reshape(-1)
        n = flat.numel()
        out = ref.clone()
        yield f"{shape} equal", out, ref
        noise = (ref.double() * (1 + 1e-6 * torch.randn(shape, generator=g, dtype=torch.float64))).to(dtype)
        yield f"{shape} within tolerance", noise, ref
        outside = ref.clone().reshape(-1)
        outside[[6, 7, 14, n - 1]] += 1
        yield f"{shape} outside across chunks", outside.reshape(shape), ref
        ref_nan = ref.clone().reshape(-1)
        ref_nan[[6, 7, 13, n - 1]] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")]).to(dtype)
        ref_nan = ref_nan.reshape(shape)
        matched = torch.where(torch.isfinite(ref_nan), noise, ref_nan)
        yield f"{shape} NaN/Inf in the same places", matched, ref_nan
        yield f"{shape} NaN/Inf in the same places, elements outside", torch.where(
            torch.isfinite(ref_nan), outside.reshape(shape), ref_nan), ref_nan
        flipped = matched.clone().reshape(-1)
        flipped[7] = -flipped[7]  # -inf for inf: the finite masks agree, only finite elements are compared
        yield f"{shape} Inf of the other sign", flipped.reshape(shape), ref_nan
        moved = matched.clone().reshape(-1)
        moved[[6, 8]] = moved[[8, 6]]  # a NaN one place over, into the next chunk
        moved[n - 2] = float("inf")
        yield f"{shape} NaN/Inf moved across a chunk boundary", moved.reshape(shape), ref_nan
        yield f"{shape} NaN where the reference is finite", torch.full_like(ref, float("nan")), ref
        yield f"{shape} finite where the reference is NaN", ref, torch.full_like(ref, float("nan"))
        yield f"{shape} all NaN", torch.full_like(ref, float("nan")), torch.full_like(ref, float("nan"))
        tiny = (torch.randn(shape, generator=g) * 1e-6).to(dtype)
        yield f"{shape} zeros for a near-zero reference", torch.zeros_like(tiny), tiny
        yield f"{shape} near-zero reference matched", tiny.clone(), tiny
    yield "empty", torch.empty(0, 3, dtype=dtype), torch.empty(0, 3, dtype=dtype)
    yield "0-dim", torch.tensor(1.5, dtype=dtype), torch.tensor(1.25, dtype=dtype)
    row = randn(1, 13)
    yield "expanded (stride 0) output", row.expand(6, 13), row.expand(6, 13).clone()
    yield "expanded output, one row off", row.expand(6, 13), torch.cat([row.expand(5, 13), row + 1])


@pytest.mark.parametrize("chunk", [7, 64, 1 << 22])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_chunked_comparison_matches_the_whole_tensor_rules(monkeypatch, chunk, dtype):
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", chunk)
    seen = set()
    for name, out, ref in cases(dtype):
        for layout, o in (("contiguous", out), ("non-contiguous", non_contiguous(out))):
            expected = outcome(whole_tensor_compare, o, ref, SETTINGS, approx=True)
            assert outcome(correctness.compare_outputs, o, ref, SETTINGS) == expected, (name, layout)
            seen.add(expected[0] if expected[0] == "passed" else expected[1][0])
    assert seen == {"passed", v.OUTPUT_MISMATCH, v.OUTPUT_NOT_FINITE, v.OUTPUT_NORM_MISMATCH}, "every rule fires"


def test_the_first_rule_broken_is_named_over_the_whole_tensor(monkeypatch):
    """A NaN in the last chunk outranks elements outside the tolerance in the first chunks."""
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 7)
    ref = torch.randn(70)
    out = ref + 1
    out[69] = float("nan")
    assert fired(out, ref) == [v.OUTPUT_NOT_FINITE]
    out[69] = ref[69]
    with pytest.raises(v.Failure) as caught:
        correctness.compare_outputs(out, ref, SETTINGS)
    assert caught.value.message.startswith("output: 69/70 elements outside")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integers_and_bools_compared_exactly_chunk_by_chunk(monkeypatch, dtype):
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 7)
    ref = torch.randint(0, 2, (6, 13)).to(dtype)
    assert correctness.compare_outputs(non_contiguous(ref), ref, SETTINGS) == {"max_abs_error": 0.0,
                                                                         "max_rel_norm_error": 0.0}
    for index in (0, 7, 77):  # the first chunk, the second, the last element
        out = ref.clone().reshape(-1)
        out[index] = 1 - out[index] if dtype != torch.bool else ~out[index]
        for o in (out.reshape(6, 13), non_contiguous(out.reshape(6, 13))):
            with pytest.raises(v.Failure) as caught:
                correctness.compare_outputs(o, ref, SETTINGS)
            assert (caught.value.checks, caught.value.message) == (
                [v.OUTPUT_MISMATCH], "output: integer/bool values differ")


def test_inputs_unchanged_chunk_by_chunk(monkeypatch):
    """Bit for bit: NaN left as NaN passes; a change in any chunk, in any layout, is caught, -0.0
    written over 0.0 and an in-place resize too."""
    monkeypatch.setattr(fingerprint, "CHUNK", 7)
    original = torch.randn(6, 13)
    original[0, 6] = float("nan")
    original[5, 12] = 0.0
    generated = fingerprint.digest([original, 3])
    for layout in (lambda t: t.clone(), non_contiguous):
        fingerprint.check_unchanged([layout(original), 3], generated)
        for index, value in (((0, 6), 1.0), ((0, 7), 1.0), ((5, 12), 1.0), ((5, 12), -0.0)):
            changed = layout(original)
            changed[index] = value
            with pytest.raises(v.Failure) as caught:
                fingerprint.check_unchanged([original.clone(), changed], fingerprint.digest([original, original]))
            assert caught.value.checks == [v.INPUT_MUTATED] and caught.value.message == "candidate modified input 1"
    integers = torch.arange(78).reshape(6, 13)
    fingerprint.check_unchanged([non_contiguous(integers)], fingerprint.digest([integers]))
    changed = non_contiguous(integers)
    changed[5, 12] = 0
    with pytest.raises(v.Failure):
        fingerprint.check_unchanged([changed], fingerprint.digest([integers]))
    with pytest.raises(v.Failure):  # resized in place
        fingerprint.check_unchanged([original.clone().resize_(1)], fingerprint.digest([original]))


class FreshTensors(TorchDispatchMode):
    """(dtype, elements) of every tensor an op creates with storage of its own (views and in-place
    results share their input's storage and are left out)."""

    def __init__(self):
        super().__init__()
        self.created = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(result):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.created.append((t.dtype, t.untyped_storage().nbytes() // t.element_size()))
        return result


def test_no_temporary_larger_than_a_chunk(monkeypatch):
    chunk = 1000
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(fingerprint, "CHUNK", chunk)
    ref = torch.randn(100, 10 * chunk // 100)
    ref[3, 4] = float("nan")
    for out in (ref + 1e-6, non_contiguous(ref + 1e-6), ref + 1):
        generated = fingerprint.digest([out])
        with FreshTensors() as fresh:
            outcome(correctness.compare_outputs, out, ref, SETTINGS)
            fingerprint.check_unchanged([out], generated)
        float64 = [n for dtype, n in fresh.created if dtype == torch.float64]
        assert float64 and max(float64) <= chunk, max(float64)
        assert max(n for _, n in fresh.created) <= chunk, "no whole copy in any dtype (non-contiguous output)"


# ---- the rules ([tolerance] rule) ------------------------------------------------------------------


def cancelling_row_sums():
    """fp32 rows of 8192 terms of magnitude ~100, every other row summing to ~0 (its terms cancel):
    (the terms, the reference's torch.sum, the sums in float64)."""
    terms = torch.randn(256, 8192, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 100
    terms[::2, -1] -= terms[::2].sum(1)
    terms = terms.float()
    return terms, terms.sum(1), terms.double().sum(1)


def test_the_float64_rule_passes_an_honest_sum_in_another_order():
    terms, ref, exact = cancelling_row_sums()
    blocked = terms.view(256, 64, 128).sum(2).sum(1)  # the same sums, blocked otherwise
    with pytest.raises(v.Failure) as caught:  # the kz rule: the cancelling rows are off by ~1e-3
        correctness.compare_outputs(blocked, ref, SETTINGS, exact)
    assert caught.value.checks == [v.OUTPUT_MISMATCH]
    assert correctness.compare_outputs(blocked, ref, {**SETTINGS, "rule": "float64"}, exact)["max_abs_error"] < 1e-2


def test_the_float64_rule_still_refuses_zeros_and_wrong_values():
    float64 = {**SETTINGS, "rule": "float64"}
    near_zero = torch.randn(1000) * 1e-6  # every element within atol of zero, computed exactly
    with pytest.raises(v.Failure) as caught:
        correctness.compare_outputs(torch.zeros_like(near_zero), near_zero, float64, near_zero.double())
    assert caught.value.checks == [v.OUTPUT_NORM_MISMATCH]
    terms, ref, exact = cancelling_row_sums()
    with pytest.raises(v.Failure) as caught:
        correctness.compare_outputs(ref + 0.5, ref, float64, exact)
    assert caught.value.checks == [v.OUTPUT_MISMATCH]


def test_the_float64_rule_falls_back_where_the_float64_run_cannot_stand_in():
    float64 = {**SETTINGS, "rule": "float64"}
    terms, ref, exact = cancelling_row_sums()
    blocked = terms.view(256, 64, 128).sum(2).sum(1)
    for stand_in in (None, exact * 2, exact[:10]):  # none, a changed copy, another shape: the kz rule
        with pytest.raises(v.Failure):
            correctness.compare_outputs(blocked, ref, float64, stand_in)


def test_the_kernelbench_rule_is_its_allclose_without_a_norm_check():
    kernelbench = {**SETTINGS, "rule": "kernelbench", "atol_fp32": 1.0}  # the request's values do not apply
    ref = torch.randn(64)
    with pytest.raises(v.Failure) as caught:
        correctness.compare_outputs(ref + 1e-2, ref, kernelbench)
    assert caught.value.checks == [v.OUTPUT_MISMATCH]
    near_zero = torch.randn(1000) * 1e-6
    assert correctness.compare_outputs(torch.zeros_like(near_zero), near_zero, kernelbench), "as in KernelBench"
    half = torch.randn(256).half()
    assert correctness.compare_outputs((half.float() * 1.005).half(), half, kernelbench)


def test_a_whole_evaluation_under_the_float64_rule(tmp_path, monkeypatch):
    """Through the harness (format torch, on the CPU): every comparison is handed the reference's
    float64 run, and a sum in another order passes."""
    import pathlib
    import types
    from kz_worker import harness
    reference = pathlib.Path(__file__).resolve().parents[2] / "suite" / "kzbench" / "level1" / "05_sum_dim1.py"
    candidate = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                 "    def forward(self, x):\n        return x.flip(1).sum(1)\n")
    request = {"device": "cpu", "format": "torch", "seed": 5, "trials": 1, "scratch_dir": str(tmp_path),
               "reference_source": reference.read_text(), "candidate_source": candidate,
               "timing": {"enabled": False}, "tolerance": {**SETTINGS, "rule": "float64"}}
    exact_outputs = []
    original = harness.Expected.exact_output

    def recorded(self, inputs):
        exact_outputs.append(original(self, inputs))
        return exact_outputs[-1]

    monkeypatch.setattr(harness.Expected, "exact_output", recorded)
    result = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None)).run()
    assert result["status"] == v.OK, result["message"]
    assert exact_outputs and all(out.dtype == torch.float64 for out in exact_outputs)
