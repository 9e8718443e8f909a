"""Whether a candidate's output is correct: exact structure, then values by dtype tolerance and
relative norm (compare_outputs); and free memory poisoned before each run (poison_free_memory), so
that an output read from uninitialised memory is caught.

Floating point, in this order: NaN/Inf where the reference has them and nowhere else (over the
whole tensor), then elementwise over the reference's finite elements, then the norm over them.
Elementwise: |out - ref| <= atol + rtol * |ref| (torch.allclose semantics), in float64.
Norm: ||out - ref|| / ||ref|| <= norm_tol, which stops a near-zero reference from being matched
by an all-zero (or constant) output that the elementwise atol alone would let through.
Integers and bools: exactly equal.

The rule is the request's tolerance "rule" ([tolerance] rule):
  kz           the above, with the request's atol / rtol / norm_tol per precision.
  kernelbench  KernelBench's check: its per-precision tolerance as both atol and rtol, no norm check.
  float64      fp32 outputs against the reference run in float64 (`exact`), the bounds widened by
               FLOAT64_SLACK times the fp32 reference's own error against it: an honest kernel that
               sums in another order errs about as much as PyTorch's fp32 does and passes; zeros for a
               near-zero reference that fp32 computes well still fail the norm bound.

Values are read in chunks of at most CHUNK_ELEMENTS elements (in row-major order), accumulating the
counts, the max and the sums of squares, so that the comparison's peak memory is bounded by a few
float64 chunks, independent of the output's size (KernelBench outputs reach 8 GB: full float64 copies
would not fit beside them).
"""
import math
from dataclasses import dataclass

import torch

from . import verdict as v


@dataclass
class Tolerance:
    atol: float
    rtol: float
    norm_tol: float    # ||out - ref|| <= norm_tol * ||ref|| + norm_slack
    norm_slack: float = 0.0


# KernelBench's per-precision tolerance (get_tolerance_for_precision in its src/kernelbench/eval.py:
# 1e-4 for fp32, 1e-2 for fp16 and bf16), which its torch.allclose takes as both atol and rtol.
KERNELBENCH_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# The float64 rule: how many times the fp32 reference's own error (against its float64 run) an fp32
# output may err beyond the kz bounds. The candidate's rounding errors are of the reference's kind, and
# their worst over a tensor is of the reference's worst: a small factor covers another blocking of the
# same sums.
FLOAT64_SLACK = 4.0
# The float64 run stands in for the fp32 reference only where the two agree this closely in norm:
# rounding errors are far smaller, a copy whose weights were changed is not.
FLOAT64_AGREEMENT = 1e-2


def tolerance_for(dtype: torch.dtype, settings: dict) -> Tolerance:
    if settings.get("rule") == "kernelbench":
        tol = KERNELBENCH_TOLERANCE.get(dtype, KERNELBENCH_TOLERANCE[torch.float32])
        return Tolerance(tol, tol, math.inf)
    if dtype in (torch.float16, torch.bfloat16):
        return Tolerance(settings["atol_half"], settings["rtol_half"], settings["norm_tol_half"])
    return Tolerance(settings["atol_fp32"], settings["rtol_fp32"], settings["norm_tol_fp32"])


def flatten(output):
    if isinstance(output, (tuple, list)):
        return list(output)
    return [output]


def compare_outputs(out, ref, settings: dict, exact=None) -> dict:
    """Raises Failure(incorrect) naming the first rule broken; returns error statistics. `exact`: the
    reference's output run in float64 (same structure), for the float64 rule; None: none."""
    if isinstance(ref, torch.Tensor):
        return compare_tensor(out, ref, settings, "output", exact)
    check_structure(out, ref)
    worst = {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    exacts = flatten(exact) if exact is not None else []
    for index, (o, r) in enumerate(zip(flatten(out), flatten(ref))):
        stats = compare_tensor(o, r, settings, f"output[{index}]", exacts[index] if index < len(exacts) else None)
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


def compare_tensor(o, r, settings: dict, what: str, exact=None) -> dict:
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
        if not all(torch.equal(a, b) for a, b in _chunks(o, r)):
            raise v.Failure(v.INCORRECT, f"{what}: integer/bool values differ", [v.OUTPUT_MISMATCH])
        return {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
    tol = tolerance_for(r.dtype, settings)
    if settings.get("rule") == "float64" and r.dtype == torch.float32:
        r, tol = against_float64(r, exact, tol)
    sums = _float_sums(o, r, tol)
    if sums["not_finite"]:
        raise v.Failure(v.INCORRECT, f"{what}: {sums['not_finite']} elements are NaN/Inf where the reference is "
                        "finite (or vice versa)", [v.OUTPUT_NOT_FINITE])
    finite = sums["finite"]  # the reference's finite elements: the only ones compared below
    max_abs = sums["max_abs"] if finite else 0.0
    if finite and sums["outside"]:
        raise v.Failure(v.INCORRECT,
                        f"{what}: {sums['outside']}/{finite} elements outside atol={tol.atol:g} rtol={tol.rtol:g} "
                        f"(max abs error {max_abs:.3g})", [v.OUTPUT_MISMATCH])
    ref_norm = math.sqrt(sums["ref_squares"]) if finite else 0.0
    err_norm = math.sqrt(sums["error_squares"]) if finite else 0.0
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    if rel_norm > tol.norm_tol and err_norm > tol.norm_tol * ref_norm + tol.norm_slack:
        raise v.Failure(v.INCORRECT,
                        f"{what}: relative error norm {rel_norm:.3g} > {tol.norm_tol:g} "
                        f"(reference norm {ref_norm:.3g}"
                        f"{f', allowance {tol.norm_slack:.3g}' if tol.norm_slack else ''})", [v.OUTPUT_NORM_MISMATCH])
    return {"max_abs_error": max_abs, "max_rel_norm_error": rel_norm}


def against_float64(r, exact, tol: Tolerance):
    """(reference, tolerance) of the float64 rule for the fp32 reference output `r` and `exact`, its
    run in float64: `exact`, with atol widened by FLOAT64_SLACK x max|r - exact| and the norm bound by
    FLOAT64_SLACK x ||r - exact||. `r` and `tol` as they are where `exact` cannot stand in for it: none,
    another shape, another NaN/Inf pattern, or beyond FLOAT64_AGREEMENT from `r` in norm (a reference
    copy changed since it was made, which the fingerprinted fp32 reference was not)."""
    if type(exact) is not torch.Tensor or exact.shape != r.shape or exact.device != r.device:
        return r, tol
    sums = _float_sums(r, exact, tol)
    if sums["not_finite"] or sums["error_squares"] > FLOAT64_AGREEMENT ** 2 * sums["ref_squares"]:
        return r, tol
    return exact, Tolerance(tol.atol + FLOAT64_SLACK * sums["max_abs"], tol.rtol, tol.norm_tol,
                            FLOAT64_SLACK * math.sqrt(sums["error_squares"]))


def storages(values):
    return {x.untyped_storage().data_ptr() for x in flatten(values)
            if isinstance(x, torch.Tensor) and x.untyped_storage().size() > 0}


def check_aliasing(out, inputs, ref_out, ref_inputs) -> None:
    """An output sharing memory with an input is refused unless the reference does the same."""
    if storages(out) & storages(inputs) and not storages(ref_out) & storages(ref_inputs):
        raise v.Failure(v.INCORRECT, "output shares memory with an input", [v.OUTPUT_ALIASES_INPUT])


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


# Elements per chunk: the comparisons hold a few float64 temporaries of at most this many elements
# (32 MiB each) at a time, whatever the tensors' size.
CHUNK_ELEMENTS = 1 << 22


def _chunks(*tensors):
    """Yields, for tensors of one shape, 1-D pieces at the same positions, in row-major order, each of
    at most CHUNK_ELEMENTS elements: views where a tensor's layout allows, else a copy of that piece
    alone (a non-contiguous tensor is never copied whole, as reshape(-1) would)."""
    limit = max(1, int(CHUNK_ELEMENTS))
    tensors = [t.detach() for t in tensors]  # no autograd graph keeps a chunk's temporaries alive
    yield from _pieces(tensors, limit)


def _pieces(tensors, limit):
    numel = tensors[0].numel()
    if numel <= limit:
        yield [t.reshape(-1) for t in tensors]
        return
    flat = [_flat_view(t) for t in tensors]
    if all(f is not None for f in flat):
        for start in range(0, numel, limit):
            yield [f[start:start + limit] for f in flat]
        return
    # numel > limit >= 1, so the tensor has at least one dimension and no zero one.
    rows, row = tensors[0].shape[0], numel // tensors[0].shape[0]
    step = max(1, limit // row)  # whole rows per piece; a row longer than the limit is split itself
    for start in range(0, rows, step):
        if step == 1:
            yield from _pieces([t[start] for t in tensors], limit)
        else:
            yield from _pieces([t[start:start + step] for t in tensors], limit)


def _flat_view(t):
    try:
        return t.view(-1)
    except RuntimeError:  # not viewable as one dimension (transposed, expanded, sliced)
        return None


def _float_sums(o, r, tol: Tolerance) -> dict:
    """One pass over floating-point o and r: the count of NaN/Inf placement mismatches, and over the
    reference's finite elements their count, the max abs error, the count outside atol + rtol*|ref|
    and the sums of squares of the error and of the reference (float64, accumulated on the device:
    one synchronisation at the end)."""
    zero = r.new_zeros((), dtype=torch.float64)
    not_finite = finite = outside = max_abs = error_squares = ref_squares = zero
    for a, b in _chunks(o, r):
        if not b.numel():
            continue
        part = _chunk_sums(a, b, tol, zero)  # its temporaries are freed before the next chunk
        not_finite, finite, outside = not_finite + part[0], finite + part[1], outside + part[2]
        max_abs = torch.maximum(max_abs, part[3])
        error_squares, ref_squares = error_squares + part[4], ref_squares + part[5]
    totals = torch.stack([not_finite, finite, outside, max_abs, error_squares, ref_squares]).tolist()
    # The counts are exact in float64 (below 2**53).
    return {"not_finite": int(totals[0]), "finite": int(totals[1]), "outside": int(totals[2]),
            "max_abs": totals[3], "error_squares": totals[4], "ref_squares": totals[5]}


def _chunk_sums(a, b, tol: Tolerance, zero):
    """_float_sums' parts for one chunk, as 0-dim float64 tensors in the order of its totals."""
    mask = torch.isfinite(b)
    not_finite = (torch.isfinite(a) != mask).sum()
    o64, r64 = a.double(), b.double()
    error = torch.where(mask, o64 - r64, zero)
    error_squares = (error * error).sum()
    diff = error.abs()
    del error, o64
    outside = ((diff > tol.atol + tol.rtol * r64.abs()) & mask).sum()
    finite_ref = torch.where(mask, r64, zero)
    return (not_finite.double(), mask.sum().double(), outside.double(), diff.max(), error_squares,
            (finite_ref * finite_ref).sum())


def synchronize(device: torch.device) -> None:
    """Waits for the device's work: an output is read only once the kernels that write it are done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# The poison must not be the evaluation's peak on a large task (KernelBench outputs reach 8 GB);
# 1 GiB is enough, as what the allocator hands out next is at the front of its free lists.
_POISON_MAX_BYTES = 1 << 30


def poison_free_memory(device: torch.device, inputs) -> None:
    """Fills memory the caching allocator will hand out next with NaN, so a candidate that
    returns uninitialised memory (which might hold an earlier, correct output) is caught."""
    if device.type != "cuda":
        return
    input_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    size = min(max(4 * input_bytes, 1 << 20), _POISON_MAX_BYTES)
    poison = torch.empty(size // 4, dtype=torch.float32, device=device)
    poison.fill_(float("nan"))
    del poison