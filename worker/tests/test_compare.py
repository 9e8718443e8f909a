"""The correctness rules of compare.py: exact structure, dtype tolerances, the norm check."""
import pytest
import torch

from kz_worker import compare
from kz_worker import verdict as v

SETTINGS = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
            "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}


def fired(out, ref):
    with pytest.raises(v.Failure) as caught:
        compare.compare_outputs(out, ref, SETTINGS)
    return caught.value.checks


def test_equal_outputs_pass_with_zero_error():
    ref = torch.randn(8, 8)
    stats = compare.compare_outputs(ref.clone(), ref, SETTINGS)
    assert stats["max_abs_error"] == 0.0


def test_small_fp32_error_passes_large_fails():
    ref = torch.randn(64)
    assert compare.compare_outputs(ref + 1e-6, ref, SETTINGS)["max_abs_error"] < 1e-5
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
    assert compare.compare_outputs((ref.float() * 1.002).half(), ref, SETTINGS)
    assert fired(ref * 2, ref) == [v.OUTPUT_MISMATCH]


def test_input_mutation_and_aliasing():
    x = torch.randn(5)
    original = x.clone()
    compare.check_inputs_unchanged([x], [original])
    x[0] += 1
    with pytest.raises(v.Failure) as caught:
        compare.check_inputs_unchanged([x], [original])
    assert caught.value.checks == [v.INPUT_MUTATED]
    with pytest.raises(v.Failure) as caught:
        compare.check_aliasing(x, [x], torch.randn(5), [torch.randn(5)])
    assert caught.value.checks == [v.OUTPUT_ALIASES_INPUT]
