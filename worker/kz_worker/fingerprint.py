"""Fingerprints of the reference's input sets and outputs, taken before any candidate code runs.

The harness keeps no input set or reference output on the device between uses (gpu_memory): it
regenerates an input set from its seed where it needs it and checks the result against the set's
`digest` (an exact hash of every byte), and it runs the live reference where it needs an output and
checks that against the output's `Sketch`. So a candidate that changes what the reference computes
(its module's globals, torch's random generator, the reference itself) is caught as before, when the
outputs themselves were kept.

A Sketch holds, for every floating-point tensor of the output, float64 sums and absolute sums over
fixed chunks, the non-finite counts per chunk, and the values at SAMPLES positions drawn from a
secret of this process (so nothing can be right at exactly the sampled places); integer and bool
tensors are hashed exactly. Two outputs within the elementwise tolerance (|a - b| <= atol + rtol·|b|)
always match; an output that differs beyond it anywhere sampled, or in any chunk's sum, does not.
Work is chunked: a few chunk-sized temporaries whatever the tensor's size.
"""
import hashlib
import os

import torch

from . import correctness
from . import verdict as v

# Elements per chunk: the hash's and the sums' temporaries (float64 / int64: 32 MiB each).
CHUNK = 1 << 22
SAMPLES = 4096
_SECRET = int.from_bytes(os.urandom(7), "little")
_MASK = (1 << 64) - 1
_weights = {}  # (device, CHUNK) -> int64 hash weights, CHUNK of them
_positions = {}  # (numel, device) -> sampled flat indices


def _hash_weights(device: torch.device) -> torch.Tensor:
    key = (device, CHUNK)
    if key not in _weights:
        generator = torch.Generator().manual_seed(_SECRET)
        odd = torch.randint(1, 1 << 62, (CHUNK,), generator=generator, dtype=torch.int64) | 1
        _weights[key] = odd.to(device)
    return _weights[key]


_WORDS = {1: torch.uint8, 2: torch.int16}  # else int32: the tensor's bytes as words of at most 4 bytes
_block_keys = {}  # block -> its secret odd multiplier


def _block_key(block: int) -> int:
    if block not in _block_keys:
        digest_bytes = hashlib.blake2b(block.to_bytes(8, "little"), digest_size=8,
                                       key=_SECRET.to_bytes(8, "little")).digest()
        _block_keys[block] = int.from_bytes(digest_bytes, "little") | 1
    return _block_keys[block]


def bits_hash(t: torch.Tensor) -> int:
    """A hash of the tensor's bytes in row-major order, whatever its layout: the sum of its words
    (at most 4 bytes each), word k weighted by a secret odd number, wrapping at 2^64. Word k's
    weight is the k mod CHUNK-th of CHUNK secret weights times a secret odd key of block k // CHUNK,
    so that no change in two blocks cancels out without the secret. Equal bytes give equal hashes;
    any change gives another but with probability ~2^-63. Work goes chunk by chunk (correctness._chunks:
    a non-contiguous tensor is never copied whole), with one synchronisation for all chunks."""
    x = t.detach()
    if x.numel() == 0:
        return 0
    word = _WORDS.get(x.element_size(), torch.int32)
    weights = _hash_weights(x.device)
    sums, blocks, position = [], [], 0
    for (piece,) in correctness._chunks(x):
        words = piece.contiguous().view(word)
        done = 0
        while done < words.numel():
            block, inner = divmod(position, CHUNK)
            take = min(words.numel() - done, CHUNK - inner)
            sums.append((words[done:done + take].to(torch.int64) * weights[inner:inner + take]).sum())
            blocks.append(block)
            done += take
            position += take
    h = 0
    for block, value in zip(blocks, torch.stack(sums).tolist()):
        h = (h + _block_key(block) * (value & _MASK)) & _MASK
    return h


def digest(values) -> tuple:
    """Exact: the type, shape, dtype and bytes of every tensor, the value of everything else."""
    parts = []
    for x in correctness.flatten(values):
        if isinstance(x, torch.Tensor):
            parts.append((type(x).__name__, tuple(x.shape), str(x.dtype), bits_hash(x)))
        else:
            parts.append(repr(x))
    return tuple(parts)


def check_unchanged(inputs, expected: tuple) -> None:
    """The candidate left `inputs` bit for bit as they were generated: their digest is `expected`
    (the input set's, taken before any candidate code ran). Nothing is generated to compare with:
    inside Guard.comparing, where this runs, torch function modes are off, the torch.device context
    that makes get_inputs allocate on the GPU among them, and inputs made there would come from the
    CPU's random generator."""
    now = digest(inputs)
    if now != expected:
        changed = [index for index, (a, b) in enumerate(zip(now, expected)) if a != b] or [0]
        raise v.Failure(v.INCORRECT, f"candidate modified input {changed[0]}", [v.INPUT_MUTATED])


def skeleton(value):
    """The output's structure, with each tensor as an empty meta tensor of its shape and dtype: what
    the type and structure checks (cheats.check_output_types, correctness.check_structure) look at."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(skeleton(x) for x in value)
    return value


def _positions_for(numel: int, device: torch.device) -> torch.Tensor:
    key = (numel, device)
    if key not in _positions:
        generator = torch.Generator().manual_seed(_SECRET ^ numel)
        count = min(numel, SAMPLES)
        drawn = torch.randint(numel, (count,), generator=generator) if count else torch.zeros(0, dtype=torch.long)
        _positions[key] = drawn.to(device)
    return _positions[key]


class _FloatSketch:
    def __init__(self, t: torch.Tensor):
        flat = t.detach().reshape(-1)
        self.samples = flat[_positions_for(flat.numel(), t.device)].double()
        sums, abs_sums, finite, nan, posinf = [], [], [], [], []
        for start in range(0, flat.numel(), CHUNK):
            chunk = flat[start:start + CHUNK].double()
            is_finite = torch.isfinite(chunk)
            kept = torch.where(is_finite, chunk, 0.0)
            sums.append(kept.sum())
            abs_sums.append(kept.abs().sum())
            finite.append(is_finite.sum())
            nan.append(torch.isnan(chunk).sum())
            posinf.append((chunk == float("inf")).sum())
        stack = (lambda xs: torch.stack(xs) if xs else torch.zeros(0, device=t.device))
        self.sums, self.abs_sums = stack(sums), stack(abs_sums)
        self.counts = torch.stack([stack(finite), stack(nan), stack(posinf)]) if sums else torch.zeros(0)

    def mismatch(self, other: "_FloatSketch", atol: float, rtol: float):
        """Why `other` (a live output) is not within tolerance of this one, or None."""
        if not torch.equal(self.counts.cpu(), other.counts.cpu()):
            return "its NaN/Inf elements are elsewhere"
        a, b = other.samples, self.samples
        a_bad, b_bad = ~torch.isfinite(a), ~torch.isfinite(b)
        if not torch.equal(a_bad, b_bad) or not torch.equal(a[a_bad].nan_to_num(), b[b_bad].nan_to_num()):
            return "its NaN/Inf elements are elsewhere"
        off = ((a - b).abs() > atol + rtol * b.abs()) & ~b_bad
        if bool(off.any()):
            return f"{int(off.sum())} of {a.numel()} sampled elements differ beyond tolerance"
        finite = self.counts[0].to(self.sums.device).double() if self.sums.numel() else self.sums
        allowed = atol * finite + rtol * self.abs_sums + 1e-9 * self.abs_sums + 1e-30
        if bool(((other.sums - self.sums).abs() > allowed).any()):
            return "its sums over chunks differ beyond tolerance"
        return None


class Sketch:
    """An output's fingerprint (see the module docstring), and its skeleton."""

    def __init__(self, output):
        self.skeleton = skeleton(output)
        self.parts = []
        for x in correctness.flatten(output):
            if isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex):
                real = torch.view_as_real(x) if x.dtype.is_complex else x
                self.parts.append(("float", type(x), tuple(x.shape), x.dtype, _FloatSketch(real)))
            elif isinstance(x, torch.Tensor):
                self.parts.append(("exact", type(x), tuple(x.shape), x.dtype, bits_hash(x)))
            else:
                self.parts.append(("value", type(x), None, None, x))

    def mismatch(self, other: "Sketch", tolerance_for):
        """Why `other` does not match this sketch within the tolerances (tolerance_for(dtype) gives
        (atol, rtol)), or None."""
        if type(self.skeleton) is not type(other.skeleton) or len(self.parts) != len(other.parts):
            return "its structure differs"
        for index, (mine, theirs) in enumerate(zip(self.parts, other.parts)):
            where = "output" if len(self.parts) == 1 else f"output[{index}]"
            if mine[:4] != theirs[:4]:
                return f"{where}: its type, shape or dtype differs"
            kind, value, other_value = mine[0], mine[4], theirs[4]
            if kind == "float":
                atol, rtol = tolerance_for(mine[3])
                why = value.mismatch(other_value, atol, rtol)
                if why:
                    return f"{where}: {why}"
            elif value != other_value:
                return f"{where}: its values differ"
        return None
