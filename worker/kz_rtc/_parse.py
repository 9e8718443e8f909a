"""Find the ``extern "C" __global__`` kernels declared in a CUDA source.

kz_rtc only exposes kernels with C linkage: their symbol in the CUBIN is their plain name, so no
name lowering is needed. Two spellings are recognised:

    extern "C" __global__ void f(...)            // one declaration
    extern "C" { __global__ void g(...) ... }    // every __global__ inside the block

Templates, C++-linkage kernels and kernels whose names are produced by macros are not found.
"""

from __future__ import annotations

import re

_COMMENT_OR_LITERAL = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S
)
_EXTERN_C = re.compile(r'\bextern\s+"C"\s*')
_PAREN_ATTRS = re.compile(r"\b(?:__launch_bounds__|__maxnreg__|__cluster_dims__|__attribute__)\s*\(")
_GLOBAL_NAME = re.compile(r"\b__global__\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(")


def _blank_comments(source: str) -> str:
    """Replace comments and string/char literals by spaces, keeping ``"C"`` itself."""

    def repl(m: re.Match) -> str:
        text = m.group(0)
        return text if text == '"C"' else " " * len(text)

    return _COMMENT_OR_LITERAL.sub(repl, source)


def _matching_brace(text: str, open_at: int) -> int:
    """Index just past the brace that closes ``text[open_at] == '{'`` (or len(text))."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _strip_paren_attrs(text: str) -> str:
    """Blank ``__launch_bounds__(...)`` and friends, whose parentheses would hide the name."""
    out, pos = [], 0
    for m in _PAREN_ATTRS.finditer(text):
        if m.start() < pos:
            continue
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        out.append(text[pos:m.start()] + " " * (i - m.start()))
        pos = i
    out.append(text[pos:])
    return "".join(out)


def _extern_c_regions(text: str) -> list[str]:
    """The text governed by each ``extern "C"``: a whole block, or one declaration."""
    regions = []
    for m in _EXTERN_C.finditer(text):
        start = m.end()
        if text.startswith("{", start):
            regions.append(text[start:_matching_brace(text, start)])
        else:
            stop = min(x for x in (text.find(";", start), text.find("{", start), len(text)) if x >= 0)
            regions.append(text[start:stop])
    return regions


_FLOAT_WORDS = {"float": "float", "double": "double"}
_INT_WORDS = {"int", "long", "short", "char", "unsigned", "signed", "size_t", "ptrdiff_t", "int8_t", "int16_t",
              "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t"}


def _param_kind(decl: str) -> str:
    """'pointer', 'float', 'double', 'int', 'bool' or 'other' for one parameter declaration."""
    decl = decl.split("=")[0]
    words = set(re.findall(r"[A-Za-z_]\w*", decl))
    if "*" in decl or "&" in decl or "[" in decl:
        return "pointer"
    for word, kind in _FLOAT_WORDS.items():
        if word in words:
            return kind
    if "bool" in words:
        return "bool"
    return "int" if words & _INT_WORDS else "other"


def _param_kinds(region: str, open_paren: int) -> list[str]:
    """Kinds of the parameters whose list opens at ``region[open_paren]``."""
    depth, start, decls = 0, open_paren + 1, []
    for i in range(open_paren, len(region)):
        ch = region[i]
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        if (ch == "," and depth == 1) or depth == 0:
            decls.append(region[start:i])
            start = i + 1
        if depth == 0:
            break
    decls = [d for d in decls if d.strip() and d.strip() != "void"]
    return [_param_kind(d) for d in decls]


def find_kernel_params(source: str) -> dict[str, list[str]]:
    """Each ``extern "C" __global__`` function of ``source`` (in source order) -> its parameter kinds."""
    text = _strip_paren_attrs(_blank_comments(source))
    found: dict[str, list[str]] = {}
    for region in _extern_c_regions(text):
        for m in _GLOBAL_NAME.finditer(region):
            found.setdefault(m.group(1), _param_kinds(region, m.end() - 1))
    return found


def find_kernels(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions of ``source``, in source order."""
    return list(find_kernel_params(source))
