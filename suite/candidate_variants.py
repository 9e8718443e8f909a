"""Broken variants of a candidate module, made from a correct one by editing its source text.

Shared by the scripted model server (suite_bench/tests/replay_model_server.py), which answers with
them like a model that sometimes fails, and the benchmark batch (bench/make_eval_batch.py), which
needs candidates of every failure class. Each kind names the status kz gives it on a GPU
(`EXPECTED`); none of them computes with torch inside `forward`, so none is a cheat and the
status is decided by the check the kind is about.

    make_variant(source, "wrong_result", "triton", salt="b7")
"""
import ast
import io
import re
import tokenize

# kind -> kz status on a GPU (on a CPU machine, cuda/cuda-rtc candidates that compile are
# compiled_not_run instead: nothing runs there).
EXPECTED = {
    "correct": "ok",
    "wrong_result": "incorrect",          # reads its first input one element off (an indexing bug)
    "wrong_shape": "incorrect",           # returns the output with an extra leading dimension
    "python_syntax": "compile_error",     # the module is not valid Python
    "kernel_compile_error": "compile_error",  # nvcc / NVRTC / Triton rejects the kernel
    "runtime_error": "runtime_error",     # forward raises (a failed launch)
    "no_model_new": "format_error",       # the class is not called ModelNew
}
KINDS = tuple(EXPECTED)
FORMATS = ("cuda", "cuda-rtc", "triton")

# Appended to a correct module: ModelNew.forward rebound at module level. Only views, slices and
# copies run in forward (the kernel formats' policy allows them), so kz's audit stays quiet and the
# output comparison decides.
_TAILS = {
    "wrong_result": '''

_kz_variant_forward = ModelNew.forward


def _kz_variant_off_by_one(self, *args):
    # An indexing bug: the first input is read one element further on (cyclically).
    flat = args[0].reshape(-1)
    shifted = torch.empty_like(flat)
    shifted[:-1].copy_(flat[1:])
    shifted[-1:].copy_(flat[:1])
    return _kz_variant_forward(self, shifted.view_as(args[0]), *args[1:])


ModelNew.forward = _kz_variant_off_by_one
''',
    "wrong_shape": '''

_kz_variant_forward = ModelNew.forward


def _kz_variant_extra_dim(self, *args):
    return _kz_variant_forward(self, *args).unsqueeze(0)


ModelNew.forward = _kz_variant_extra_dim
''',
    "runtime_error": '''

def _kz_variant_failed_launch(self, *args):
    raise RuntimeError("kernel launch failed: invalid configuration argument (injected by candidate_variants)")


ModelNew.forward = _kz_variant_failed_launch
''',
}

# A use of an undefined identifier: nvcc, NVRTC and Triton's front end all reject it.
_BAD_CUDA_LINE = "static const int kz_variant_broken = kz_variant_undefined_symbol;"
_BAD_TRITON_LINE = "kz_variant_broken = kz_variant_undefined_symbol"


def make_variant(source: str, kind: str, fmt: str = "", salt: str = "") -> str:
    """The candidate `source` turned into `kind`. A non-empty `salt` is first written as a
    comment into the kernel source itself, so that two variants never share a compiled artefact
    (a harness gets no free cache hit from a duplicate). The format (`fmt`) is needed only to find
    the kernel: with a salt, and for kernel_compile_error."""
    if kind not in EXPECTED:
        raise ValueError(f"unknown variant kind {kind!r}; expected one of {KINDS}")
    if (salt or kind == "kernel_compile_error") and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if salt:
        source = insert_in_kernel(source, fmt, comment_line(fmt, f"variant {salt}"))
    if kind in _TAILS:
        return source + _TAILS[kind]
    if kind == "python_syntax":
        return _replace_once(source, "class ModelNew", "class ModelNew(:")
    if kind == "no_model_new":
        return re.sub(r"\bModelNew\b", "ModelFast", source)
    if kind == "kernel_compile_error":
        return insert_in_kernel(source, fmt, _BAD_TRITON_LINE if fmt == "triton" else _BAD_CUDA_LINE)
    return source


def comment_line(fmt: str, text: str) -> str:
    return ("# " if fmt == "triton" else "// ") + text


def insert_in_kernel(source: str, fmt: str, line: str) -> str:
    """`line` inserted at the top of the first kernel: the first line of the string literal that
    holds `__global__` code (cuda, cuda-rtc), or the first statement of the first @triton.jit
    function's body, after its docstring (triton)."""
    if fmt == "triton":
        return _insert_in_triton_kernel(source, line)
    return _insert_in_cuda_string(source, line)


def _replace_once(source: str, old: str, new: str) -> str:
    if old not in source:
        raise ValueError(f"source has no {old!r}")
    return source.replace(old, new, 1)


def _insert_in_cuda_string(source: str, line: str) -> str:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING and "__global__" in token.string:
            quote = re.match(r"[rRbBuU]*('''|\"\"\"|'|\")", token.string)
            if quote is None or len(quote.group(1)) != 3:
                continue  # kernels live in triple-quoted strings; a one-line string cannot take a line
            offset = _offset(source, token.start) + quote.end()
            return source[:offset] + "\n" + line + "\n" + source[offset:]
    raise ValueError("no triple-quoted string with __global__ code in the source")


def _insert_in_triton_kernel(source: str, line: str) -> str:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            body = node.body
            has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                       and isinstance(body[0].value.value, str))
            first = body[1] if has_doc and len(body) > 1 else body[0]
            lines = source.splitlines(keepends=True)
            lines.insert(first.lineno - 1, " " * first.col_offset + line + "\n")
            return "".join(lines)
    raise ValueError("no @triton.jit function in the source")


def _offset(source: str, position) -> int:
    row, col = position
    lines = source.splitlines(keepends=True)
    return sum(len(x) for x in lines[:row - 1]) + col
