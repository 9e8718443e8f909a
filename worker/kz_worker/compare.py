"""Output comparison: exact structure, then values by dtype tolerance and relative norm.

Elementwise: |out - ref| <= atol + rtol * |ref| (torch.allclose semantics).
Norm: ||out - ref|| / ||ref|| <= norm_tol, which stops a near-zero reference from being matched
by an all-zero (or constant) output that the elementwise atol alone would let through.
"""
from dataclasses import dataclass

import torch

from . import verdict as v


@dataclass
class Tolerance:
    atol: float
    rtol: float
    norm_tol: float


def tolerance_for(dtype: torch.dtype, settings: dict) -> Tolerance:
    if dtype in (torch.float16, torch.bfloat16):
        return Tolerance(settings["atol_half"], settings["rtol_half"], settings["norm_tol_half"])
    return Tolerance(settings["atol_fp32"], settings["rtol_fp32"], settings["norm_tol_fp32"])


def flatten(output):
    if isinstance(output, (tuple, list)):
        return list(output)
    return [output]


def compare_outputs(out, ref, settings: dict) -> dict:
    """Raises Failure(incorrect) naming the first rule broken; returns error statistics."""
    if isinstance(ref, torch.Tensor):
        return compare_tensor(out, ref, settings, "output")
    check_structure(out, ref)
    worst = {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    for index, (o, r) in enumerate(zip(flatten(out), flatten(ref))):
        stats = compare_tensor(o, r, settings, f"output[{index}]")
        for key in worst:
            worst[key] = max(worst[key], stats[key])
    return worst


def check_structure(out, ref) -> None:
    """Where the reference is not a tensor: the same container type and length (no method of the
    output's elements is called)."""
    if isinstance(ref, torch.Tensor):
        return
    if type(out) is not type(ref) or len(flatten(out)) != len(flatten(ref)):
        raise v.Failure(v.INCORRECT, f"output structure differs: got {_describe(out)}, expected {_describe(ref)}",
                        [v.OUTPUT_STRUCTURE])


def compare_tensor(o, r, settings: dict, what: str) -> dict:
    if not isinstance(r, torch.Tensor):
        if o != r:
            raise v.Failure(v.INCORRECT, f"{what}: got {o!r}, expected {r!r}", [v.OUTPUT_MISMATCH])
        return {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    if type(o) is not torch.Tensor:  # exact type: subclasses could fake values lazily
        raise v.Failure(v.INCORRECT, f"{what}: type {type(o).__module__}.{type(o).__name__}, expected torch.Tensor",
                        [v.OUTPUT_TYPE])
    if o.shape != r.shape:
        raise v.Failure(v.INCORRECT, f"{what}: shape {tuple(o.shape)}, expected {tuple(r.shape)}", [v.OUTPUT_SHAPE])
    if o.dtype != r.dtype:
        raise v.Failure(v.INCORRECT, f"{what}: dtype {o.dtype}, expected {r.dtype}", [v.OUTPUT_DTYPE])
    if o.device != r.device:
        raise v.Failure(v.INCORRECT, f"{what}: on {o.device}, expected {r.device}", [v.OUTPUT_DEVICE])
    if not o.dtype.is_floating_point:
        if not torch.equal(o, r):
            raise v.Failure(v.INCORRECT, f"{what}: integer/bool values differ", [v.OUTPUT_MISMATCH])
        return {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    ref_finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), ref_finite):
        bad = int((torch.isfinite(o) != ref_finite).sum())
        raise v.Failure(v.INCORRECT, f"{what}: {bad} elements are NaN/Inf where the reference is finite (or vice versa)",
                        [v.OUTPUT_NOT_FINITE])
    tol = tolerance_for(r.dtype, settings)
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


def storages(values):
    return {x.untyped_storage().data_ptr() for x in flatten(values)
            if isinstance(x, torch.Tensor) and x.untyped_storage().size() > 0}


def check_aliasing(out, inputs, ref_out, ref_inputs) -> None:
    """An output sharing memory with an input is refused unless the reference does the same."""
    if storages(out) & storages(inputs) and not storages(ref_out) & storages(ref_inputs):
        raise v.Failure(v.INCORRECT, "output shares memory with an input", [v.OUTPUT_ALIASES_INPUT])


def check_inputs_unchanged(inputs, originals) -> None:
    for index, (x, original) in enumerate(zip(inputs, originals)):
        if isinstance(x, torch.Tensor) and not torch.equal(x, original) and not (
                x.dtype.is_floating_point and torch.allclose(x, original, equal_nan=True, rtol=0, atol=0)):
            raise v.Failure(v.INCORRECT, f"candidate modified input {index}", [v.INPUT_MUTATED])


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
