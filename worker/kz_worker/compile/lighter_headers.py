"""The sources of a load_inline build with fewer of torch's headers (lighter_sources), and what
decides whether a lighter build that failed is built again as written (may_need_the_full_header).
scripts/prepare_lighter_builds.py prepares at setup what these read (the full header's names,
main.cpp's prelude precompiled)."""
import functools
import hashlib
import os
import re
import subprocess

import torch


# load_inline's build parses torch's headers three times over (nvcc's cudafe++ and cicc, then the
# host compiler on the CUDA file; the host compiler on main.cpp). kz lightens both files, keeping what
# the candidate wrote:
#  - the CUDA sources: load_inline puts <torch/types.h> ahead of them, which is ATen/ATen.h (every op
#    of ATen/Functions.h, ~2,500 headers) plus autograd's factories, and candidates add
#    <torch/extension.h> (torch's whole C++ API and pybind11). What kernels' host code uses is the
#    Tensor class with its methods, TORCH_CHECK, AT_DISPATCH, options and a few factories: kz puts
#    ATen/ATen.h's headers but Functions.h (and the three that include it) and IValue's ahead of
#    them, the op wrappers of the names the sources mention (op_wrappers), and torch::'s aliases of
#    at::. On the 07_softmax example nvcc takes ~7.7 s of CPU instead of ~16 s (torch/types.h) or
#    ~40 s (torch/extension.h).
#  - main.cpp, which load_inline writes as `#include <torch/extension.h>`, the cpp_sources and the
#    bindings: where the cpp_sources only declare functions over tensors, scalars, and vectors or
#    tuples of them (KernelBench's `torch::Tensor f(torch::Tensor x);`), the bindings need pybind11
#    and torch's casters for those types, all in torch/csrc/utils/pybind.h: ~4 s of the host
#    compiler instead of ~14 s, and ~0.4 GB instead of ~1.5 GB.
_FULL_TORCH_HEADER = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"][^\n]*$', re.M)
_MAIN_PRELUDE_HEADERS = ["torch/csrc/utils/pybind.h", "torch/csrc/Exceptions.h"]
_LIGHT_MAIN_PRELUDE = [
    "#include <torch/csrc/utils/pybind.h>  // kz: pybind11 and torch's casters, for the bindings below",
    "#include <torch/csrc/Exceptions.h>  // torch::wrap_pybind_function",
    "namespace torch { using namespace at; }  // torch::Tensor, as <torch/types.h> declares it",
    "#line 2  // kz: messages give main.cpp's line numbers as load_inline writes it (one include line)",
]
# Those two headers, precompiled at setup (keep_main_prelude_pch): ~3 s of the host compiler on
# main.cpp becomes ~1.6 s on this project's CPU. GCC ignores a precompiled header made with other
# options and uses the header's text, so a mismatch costs time, never the build. One is made with
# load_inline's own flags and one with -O3 too (candidates' usual extra_cflags), in the directory GCC
# searches for either (<header>.gch/).
_PCH_VARIANTS = {"default.gch": [], "O3.gch": ["-O3"]}
_MAIN_PRELUDE_FILE = "kz_main_prelude.h"
_PCH_MAIN_PRELUDE = [f'#include "{_MAIN_PRELUDE_FILE}"  // kz: pybind11 and torch\'s casters, precompiled at setup',
                     *_LIGHT_MAIN_PRELUDE[2:]]
# ATen/ATen.h's own includes but ATen/Functions.h and those that include it (ScalarOps.h,
# TensorIndexing.h, TensorOperators.h): tensors with their methods, options, devices, dispatch macros.
# But for IValue too: ATen/core/ivalue.h, ATen/core/jit_type.h and ATen/DeviceGuard.h (which brings
# ivalue.h through ATen/core/IListRef.h) are ~30% of nvcc's time on a kernel's host code (on the
# 07_softmax example ~10.5 s of CPU with them, ~7.7 s without), for names kernels seldom use. A source
# naming one of _ON_MENTION's names gets its header; any other name they held is a missing name, for
# which the build is done again as written (may_need_the_full_header).
_LIGHT_ATEN_HEADERS = [
    "ATen/Context.h", "ATen/Device.h", "ATen/DimVector.h", "ATen/Dispatch.h",
    "ATen/Formatting.h", "ATen/NamedTensor.h", "ATen/Tensor.h", "ATen/TensorGeometry.h", "ATen/Version.h",
    "ATen/core/ATenGeneral.h", "ATen/core/Generator.h", "ATen/core/Reduction.h", "ATen/core/Scalar.h",
    "ATen/core/UnsafeFromTH.h", "c10/core/Allocator.h",
    "c10/core/InferenceMode.h", "c10/core/Layout.h", "c10/core/Storage.h", "c10/core/TensorOptions.h",
    "c10/util/Exception.h",
    # What every ATen/ops/<name>.h includes but ATen/DeviceGuard.h (op_wrappers).
    "ATen/TensorUtils.h", "ATen/TracerMode.h", "c10/util/Deprecated.h", "optional", "string_view",
]
_ON_MENTION = {"ATen/DeviceGuard.h": ("device_of", "DeviceGuard", "OptionalDeviceGuard")}
# The includes of ATen/ops/<name>.h that the prelude does not have itself (op_wrappers).
_OP_HEADER_INCLUDES = frozenset(("ATen/DeviceGuard.h", "ATen/core/Tensor.h", "c10/core/Scalar.h"))
# What <torch/types.h> adds to namespace torch (its factories with autograd aside: torch::empty and the
# like then resolve to at::'s, which are the same but for ignoring requires_grad in the options).
_TORCH_ALIASES = """namespace torch {  // kz: what <torch/types.h> declares here
using namespace at;
using std::nullopt;
using std::optional;
using Dtype = at::ScalarType;
inline constexpr auto kUInt8 = at::kByte, kInt8 = at::kChar, kInt16 = at::kShort, kInt32 = at::kInt,
    kInt64 = at::kLong, kUInt16 = at::kUInt16, kUInt32 = at::kUInt32, kUInt64 = at::kUInt64,
    kFloat16 = at::kHalf, kFloat32 = at::kFloat, kFloat64 = at::kDouble;
inline constexpr auto kU8 = kUInt8, kU16 = kUInt16, kU32 = kUInt32, kU64 = kUInt64, kI8 = kInt8,
    kI16 = kInt16, kI32 = kInt32, kI64 = kInt64, kF16 = kFloat16, kF32 = kFloat32, kF64 = kFloat64;
}  // namespace torch
#include <cuda.h>
#include <cuda_runtime.h>
#line 4  // kz: messages give the line numbers load_inline's own three include lines would"""

# A declaration main.cpp can bind with _LIGHT_MAIN_PRELUDE: every type one pybind11 or that header
# converts, so the bindings are the same code either way.
_TENSOR = r"(?:(?:torch|at)::)Tensor"
_SCALAR = r"(?:void|bool|int|long|float|double|(?:std::)?u?int(?:32|64)_t|(?:std::)?size_t)"
_VALUE = (rf"(?:{_TENSOR}|{_SCALAR}|std::vector\s*<\s*(?:{_TENSOR}|{_SCALAR})\s*>"
          rf"|std::tuple\s*<\s*{_TENSOR}(?:\s*,\s*{_TENSOR})*\s*>)")
_TYPE = rf"(?:const\s+)?{_VALUE}(?:\s+const)?\s*&?"
_PARAMETER = rf"{_TYPE}\s*(?:[A-Za-z_]\w*)?"
_DECLARATION = re.compile(rf"\s*{_TYPE}\s*[A-Za-z_]\w*\s*\(\s*(?:{_PARAMETER}(?:\s*,\s*{_PARAMETER})*)?\s*\)\s*")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def declarations_only(cpp_sources: list) -> bool:
    """Whether the cpp_sources hold nothing but `#include <torch/extension.h>` and declarations of
    functions over the types _LIGHT_MAIN_PRELUDE binds (no definitions, no other includes or macros)."""
    text = _FULL_TORCH_HEADER.sub("", _COMMENT.sub(" ", "\n".join(cpp_sources)))
    *declarations, rest = text.split(";")
    return not rest.strip() and all(_DECLARATION.fullmatch(d) for d in declarations if d.strip())


def lighter_sources(load_inline, args: tuple, kwargs: dict):
    """(keyword arguments for load_inline, whether main.cpp was lightened) with lighter headers (above):
    the CUDA sources always, main.cpp where its sources allow; None where the build stays as written.

    A build that fails this way is built again as written (the caller), so a candidate that needs
    the full header loses only time, never its verdict; code that compiles against the lighter
    headers is the same code against the same library. Left as written: sources that bind their own
    pybind11 module (they need torch/python.h), builds without load_inline's implicit headers, and
    builds in a directory of the candidate's choosing (the two builds would share it)."""
    import inspect
    try:
        bound = inspect.signature(load_inline).bind("name", *args, **kwargs).arguments
    except TypeError:
        return None  # torch's own call says what is wrong
    cpp, cuda = (_source_list(bound.get(key)) for key in ("cpp_sources", "cuda_sources"))
    if (not cuda or cpp is None or bound.get("no_implicit_headers") or bound.get("build_directory")
            or any("PYBIND11" in t for t in cpp + cuda)):
        return None
    light_cuda = [_FULL_TORCH_HEADER.sub("// <torch/extension.h>: kz builds with lighter headers", t) for t in cuda]
    light_main = declarations_only(cpp)
    light = {key: value for key, value in bound.items() if key != "name"}
    precompiled = main_prelude_pch() if light_main else None
    main_prelude = _PCH_MAIN_PRELUDE if precompiled else _LIGHT_MAIN_PRELUDE
    # New lists, never the candidate's: load_inline inserts its headers and appends the bindings to
    # the lists it gets, and the build as written after a failed lighter one must get them unchanged.
    light.update(no_implicit_headers=True,
                 cpp_sources=(main_prelude if light_main else ["#include <torch/extension.h>"]) + cpp,
                 cuda_sources=[light_cuda_prelude(cpp + cuda)] + light_cuda)
    if precompiled:
        light["extra_include_paths"] = [*(bound.get("extra_include_paths") or []), precompiled]
    return light, light_main


@functools.lru_cache(maxsize=None)  # not a module global: see _aten_op_names
def main_prelude_pch():
    """The directory with _MAIN_PRELUDE_FILE and its precompiled header for this installation, made at
    setup in KZ_LIGHTER_BUILDS_DIR (keep_main_prelude_pch); None where there is none."""
    root = os.environ.get("KZ_LIGHTER_BUILDS_DIR")
    if not root:
        return None
    directory = _main_prelude_dir(root, _main_prelude_command()[1])
    return directory if _main_prelude_ready(directory) else None


def keep_main_prelude_pch(root: str) -> str:
    """Precompiles _MAIN_PRELUDE_HEADERS into root/main-prelude-<key>/ unless there already (key: the
    compiler command and torch's version, so a new torch never reads an old one); the directory."""
    command, key = _main_prelude_command()
    directory = _main_prelude_dir(root, key)
    if _main_prelude_ready(directory):
        return directory
    building = f"{directory}.{os.getpid()}.tmp"
    header = os.path.join(building, _MAIN_PRELUDE_FILE)
    os.makedirs(header + ".gch", exist_ok=True)
    with open(header, "w") as f:
        f.write("".join(f"#include <{h}>\n" for h in _MAIN_PRELUDE_HEADERS))
    for name, flags in _PCH_VARIANTS.items():
        subprocess.run(command + [header, *flags, "-o", os.path.join(header + ".gch", name)],
                       capture_output=True, text=True, timeout=600, check=True)
    os.replace(building, directory)  # whole, or not at all
    return directory


def _main_prelude_dir(root: str, key: str) -> str:
    return os.path.join(root, f"main-prelude-{key}")


def _main_prelude_ready(directory: str) -> bool:
    """Whether keep_main_prelude_pch finished there (it moves the directory in whole)."""
    return os.path.isdir(os.path.join(directory, _MAIN_PRELUDE_FILE + ".gch"))


def _main_prelude_command():
    """The compiler command (but the header) that precompiles main.cpp's prelude as load_inline compiles
    main.cpp (its flags but the extension's name, which the headers do not use), and a key naming it
    with torch's version."""
    import torch.utils.cpp_extension as cpp_extension
    command = [cpp_extension.get_cxx_compiler(), "-x", "c++-header", "-DTORCH_API_INCLUDE_EXTENSION_H",
               *(arg for d in _extension_includes() for arg in ("-isystem", d)), "-fPIC", "-std=c++17"]
    return command, hashlib.sha256(repr((command, torch.__version__)).encode()).hexdigest()[:16]


def _extension_includes() -> list:
    """The include directories load_inline compiles a CUDA extension with: torch's first."""
    import sysconfig
    import torch.utils.cpp_extension as cpp_extension
    return [*cpp_extension.include_paths(device_type="cuda"), sysconfig.get_paths()["include"]]


def light_cuda_prelude(sources: list) -> str:
    """What kz puts ahead of the CUDA sources instead of load_inline's <torch/types.h>: the lighter
    ATen headers (and _ON_MENTION's where the sources name them), the wrappers of every name in the
    sources that is an ATen op (`at::zeros`, `torch::empty_like`, an unqualified `addmm` under `using
    namespace torch`), torch::'s aliases."""
    words = set(re.findall(r"[A-Za-z_]\w*", _COMMENT.sub(" ", "\n".join(sources))))
    includes = _LIGHT_ATEN_HEADERS + [header for header, names in _ON_MENTION.items() if words.intersection(names)]
    lines = [f"#include <{header}>" for header in includes]
    lines += [op_wrappers(name) for name in sorted(_aten_op_names().intersection(words))]
    return "\n".join(lines) + "\n" + _TORCH_ALIASES


@functools.lru_cache(maxsize=None)  # not a module global: see _aten_op_names
def op_wrappers(name: str) -> str:
    """The prelude's text for ATen op `name`: its ATen/ops/<name>.h with that header's own includes
    replaced by <ATen/ops/<name>_ops.h> (the prelude has the others, and leaves out ATen/DeviceGuard.h,
    whose IValue the op wrappers do not need); the header itself where it includes anything else or
    takes an I*ListRef (torch's list arguments, whose callers need ATen/core/IListRef.h)."""
    import torch.utils.cpp_extension as cpp_extension
    path = os.path.join(cpp_extension.include_paths()[0], "ATen", "ops", f"{name}.h")
    plain = f"#include <ATen/ops/{name}.h>"
    try:
        with open(path) as header:
            text = header.read()
    except OSError:
        return plain
    includes = set(re.findall(r"^#include [<\"]([^>\"]+)[>\"]", text, re.M)) - {f"ATen/ops/{name}_ops.h"}
    if not includes <= _OP_HEADER_INCLUDES.union(_LIGHT_ATEN_HEADERS) or "ListRef" in text:
        return plain
    body = "\n".join(line for line in text.split("\n") if not line.startswith(("#include", "#pragma once")))
    return f"// kz: ATen/ops/{name}.h without its includes\n#include <ATen/ops/{name}_ops.h>\n{body.strip()}"


# Cached by lru_cache, never in a module global: the Guard snapshots this module's globals before the
# candidate is imported, and a global set during its load_inline would read as the harness patched.
@functools.lru_cache(maxsize=None)
def _aten_op_names() -> frozenset:
    """The ATen ops with a public header (ATen/ops/<name>.h beside its <name>_ops.h) in torch's headers."""
    import torch.utils.cpp_extension as cpp_extension
    files = set(os.listdir(os.path.join(cpp_extension.include_paths()[0], "ATen", "ops")))
    return frozenset(f[:-len("_ops.h")] for f in files if f.endswith("_ops.h") and f[:-len("_ops.h")] + ".h" in files)


def _source_list(sources):
    """load_inline's str-or-list sources as a list of strings; None when something else."""
    texts = [sources] if isinstance(sources, str) else list(sources or [])
    return texts if all(isinstance(t, str) for t in texts) else None


# Compiler messages that name something missing: EDG's (nvcc's front end) and GCC's. `name`: what is
# missing, as written (maybe qualified); `scope`, where there is one: the namespace or class it was
# looked up in.
_MISSING_NAME = [re.compile(pattern) for pattern in (
    r'identifier "(?P<name>[\w:]+)" is undefined',
    r'(?:namespace|class|struct) "(?P<scope>[\w:<>, ]+)" has no member (?:class |function |template )?"(?P<name>\w+)"',
    r"'(?P<name>[\w:]+)' (?:was not declared in this scope|has not been declared|does not name a type)",
    r"'(?P<name>[\w:]+)' (?:is not a member of|in namespace) '(?P<scope>[\w:]+)'",
    r'no instance of (?:overloaded function|function template|constructor) "(?P<name>[\w:]+)"',
    r"no matching function for call to '(?P<name>[\w:]+)",
    r'incomplete type "(?P<name>[\w:]+)"',
    r"incomplete type '(?:class |struct )?(?P<name>[\w:]+)'",
    r'"(?P<name>[\w:]+)" is not a (?:type name|template|class or namespace name)',
)]
_ERROR_LINE = re.compile(r"^(.*?)(?:\(\d+\)|:\d+:\d+): (?:fatal )?error:? (.*)$", re.M)


def may_need_the_full_header(build_log: str, main_lightened: bool = False) -> bool:
    """Whether a build that failed with lighter headers (lighter_sources) might succeed as written: an
    error in a lightened source that is not a missing name (conservative: syntax, types, anything not
    recognised), or a missing name that the full header or std could provide. False only when every
    error there names something the full header cannot declare (the usual compile error: a name the
    candidate made up or misspelt), which then costs no second build. main.cpp's errors count only
    where it was lightened: as written, it is the same either way."""
    errors = _ERROR_LINE.findall(build_log)
    lightened = [message for path, message in errors if main_lightened or not path.endswith(".cpp")]
    if not lightened:
        return not errors  # nothing recognisable: build it as written
    names = set()
    for message in lightened:
        found = next((m for pattern in _MISSING_NAME if (m := pattern.search(message))), None)
        if found is None:
            return True
        qualified = [p for p in re.split(r"\W+", found["name"] + " " + (found.groupdict().get("scope") or "")) if p]
        if "std" in qualified:
            return True
        names.add(re.split(r"\W+", found["name"])[-1])
    try:
        known = _full_header_names()
    except (OSError, subprocess.SubprocessError):  # no compiler to ask: build it as written
        return True
    return not names.isdisjoint(known)


@functools.lru_cache(maxsize=None)  # not a module global: see _aten_op_names
def _full_header_names() -> frozenset:
    """Every identifier of torch/extension.h as the compiler sees it (preprocessed, with its macro
    definitions, so everything it includes, Python.h and the std headers too), plus every identifier in
    torch's header tree (for code in branches the preprocessor left out). ~2.6 s of CPU, needed only
    after a lightened build failed: scripts/setup.sh computes it for the build's interpreter into the
    directory the supervisor names in KZ_LIGHTER_BUILDS_DIR (read-only for workers); without it a
    failing build computes it and keeps it beside its builds (the request's own extensions
    directory, so only that request reads it again). Either file is named by the compiler, torch
    and the include paths."""
    command, key = _header_names_command()
    name = _HEADER_NAMES_FILE.format(key=key)
    import torch.utils.cpp_extension as cpp_extension
    kept_dir = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    for directory in (os.environ.get("KZ_LIGHTER_BUILDS_DIR"), kept_dir):
        kept = _read_header_names(os.path.join(directory, name), key) if directory else None
        if kept is not None:
            return kept
    names = _compute_header_names(command)
    _write_header_names(os.path.join(kept_dir, name), key, names)
    return frozenset(names)


def keep_full_header_names(directory: str) -> str:
    """Writes the full header's names (_full_header_names) into `directory` unless a complete list
    for this installation is there already; its path (scripts/prepare_lighter_builds.py, at setup)."""
    command, key = _header_names_command()
    path = os.path.join(directory, _HEADER_NAMES_FILE.format(key=key))
    if _read_header_names(path, key) is None:
        _write_header_names(path, key, _compute_header_names(command))
    return path


def _header_names_command():
    """The preprocessor command behind the names, and the key naming them (the command and torch)."""
    import torch.utils.cpp_extension as cpp_extension
    command = [cpp_extension.get_cxx_compiler(), "-E", "-dD", "-x", "c++", "-std=c++17",
               "-DTORCH_API_INCLUDE_EXTENSION_H", *(f"-I{d}" for d in _extension_includes()), "-"]
    return command, hashlib.sha256(repr((command, torch.__version__)).encode()).hexdigest()[:16]


def _compute_header_names(command: list) -> set:
    text = subprocess.run(command, input="#include <torch/extension.h>\n", capture_output=True, text=True,
                          timeout=120, check=True).stdout
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    for root_dir, _, files in os.walk(_extension_includes()[0]):
        for file in files:
            with open(os.path.join(root_dir, file), errors="replace") as header:
                names.update(re.findall(r"[A-Za-z_]\w*", header.read()))
    return names


_HEADER_NAMES_FILE = "kz_full_header_names_{key}.txt"


def _read_header_names(path: str, key: str):
    """The names kept at path, or None where there are none or they are not a complete list for key
    (its first line names the key, its last says how many names came before)."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    if len(lines) < 3 or lines[0] != f"# {key}" or lines[-1] != f"# {len(lines) - 2}":
        return None
    return frozenset(lines[1:-1])


def _write_header_names(path: str, key: str, names: set) -> None:
    """Written whole, then renamed into place: a reader sees all of it or nothing."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            f.write("\n".join([f"# {key}", *sorted(names), f"# {len(names)}"]))
        os.replace(temporary, path)
    except OSError:
        pass  # only a cache: the next failing build computes the names again
