"""What differs between kernel formats: how a candidate compiles, whether it can run on this
device, and how its exceptions are classified.

  cuda      KernelBench's format: load_inline at import time (nvcc + the host compiler).
  triton    @triton.jit kernels; on the CPU they run under the Triton interpreter.
  cuda-rtc  extern "C" kernels compiled by NVRTC through kz_rtc (docs/formats.md).
  torch     plain PyTorch (ModelNew, or Model for the reference-as-candidate sanity check).

On a CPU-only machine `cuda` and `cuda-rtc` candidates are really compiled (nvcc / NVRTC) but
cannot run: their verdict is compiled_not_run, never ok.
"""
import errno
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import time

import torch

from . import cheats, gpu_lock
from . import verdict as v

_extension_builds = []  # names passed to load_inline in this process
_kept_builds = None      # the supervisor's kept builds of this candidate (read-only), or None
# Mutated, never rebound: the Guard refuses a harness module whose names change under it.
_build_parts = {}        # where this process's load_inline builds spent their seconds (build_parts)
_load_inline_calls = []  # time.monotonic() of each load_inline call


def prepare(fmt: str, device: torch.device, extensions=None, mute_extensions: bool = False) -> None:
    """`extensions` (the request's, for a `cuda` candidate): {"dir": where its builds go, in its own
    scratch dir; "prebuilt": the supervisor's kept builds of this very candidate, or None}.
    mute_extensions: the modules load_inline returns can be muted for the effect probe
    (cheats.muteable_extension; policy kernelbench)."""
    global _kept_builds
    # An fp32 reference means fp32: TF32 would put the reference itself ~1e-3 off.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if fmt == "cuda-rtc":
        import kz_rtc
        kz_rtc.set_compile_only(device.type != "cuda")
    if fmt == "cuda":
        if extensions:
            os.environ["TORCH_EXTENSIONS_DIR"] = extensions["dir"]
            _kept_builds = extensions.get("prebuilt")
        if device.type != "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            # No GPU to take the architecture from: torch's default then fails (IndexError in
            # _get_cuda_arch_flags). Build for kz_rtc's compile-only target instead.
            os.environ["TORCH_CUDA_ARCH_LIST"] = _torch_arch_list(os.environ.get("KZ_RTC_ARCH", "sm_90"))
        _use_parallel_nvcc()
        _count_extension_builds(mute_extensions)


def _use_parallel_nvcc() -> None:
    """load_inline's ninja runs $PYTORCH_NVCC as nvcc: kz-nvcc where the supervisor gives one
    (KZ_PARALLEL_NVCC, [worker] parallel_nvcc), which runs nvcc's own steps with the host and device
    halves at once and writes the same object (eval/include/kz/eval/parallel_nvcc.h). It runs the
    nvcc torch would have (KZ_REAL_NVCC). A PYTORCH_NVCC set already (ccache, say) is kept."""
    tool = os.environ.get("KZ_PARALLEL_NVCC")
    if not tool or os.environ.get("PYTORCH_NVCC"):
        return
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME:
        os.environ["KZ_REAL_NVCC"] = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    os.environ["PYTORCH_NVCC"] = tool


def _torch_arch_list(arch: str) -> str:
    """"sm_90" / "90" / "9.0" / "sm_90a" -> "9.0" / "9.0a" (TORCH_CUDA_ARCH_LIST form)."""
    match = re.fullmatch(r"(?:sm_|compute_)?(\d+)(\d)([a-z]?)", arch.strip().lower().replace(".", ""))
    return f"{match[1]}.{match[2]}{match[3]}" if match else "9.0"


def _count_extension_builds(muteable: bool = False) -> None:
    """Wraps load_inline so the harness knows whether the candidate built an extension, so that
    the build is named by its content (content_addressed_name), so that it parses fewer headers
    where it can (lighter_sources), and, `muteable`, so that the effect probe can mute the module's
    functions (cheats.muteable_extension)."""
    import torch.utils.cpp_extension as cpp_extension
    original = cpp_extension.load_inline

    def load_inline(name, *args, **kwargs):
        _load_inline_calls.append(time.monotonic())
        _extension_builds.append(name)
        lighter = lighter_sources(original, args, kwargs)
        if lighter is not None:
            light_kwargs, main_lightened = lighter
            light_name = content_addressed_name(name, (), light_kwargs)
            if (kept := kept_build(light_name, light_kwargs)) is not None:
                return kept
            failed_marker = None if _kept_marker(light_name) else os.path.join(
                _extension_build_dir(light_name), _LIGHTER_BUILD_FAILED)
            if failed_marker and not os.path.exists(failed_marker):
                try:
                    return _timed_build(original, light_name, (), light_kwargs)
                except Exception as exc:
                    if not _is_compile_exception(exc) or not may_need_the_full_header(str(exc), main_lightened):
                        raise  # as written, it would fail alike: no second build
                    _write_marker(failed_marker)  # kept with the build: the evaluation after a pre-build skips it
        full_name = content_addressed_name(name, args, kwargs)
        if (kept := kept_build(full_name, kwargs)) is not None:
            return kept
        return _timed_build(original, full_name, args, kwargs)

    def load_muteable(name, *args, **kwargs):
        return cheats.muteable_extension(load_inline(name, *args, **kwargs))

    # A build is CPU work: never inside a shared GPU hold (one called in a forward).
    cpp_extension.load_inline = gpu_lock.releasing(load_muteable if muteable else load_inline)


_NVCC_REPORT = "kz_nvcc_report.jsonl"  # in the build dir: kz-nvcc's phases, one line per compile


def _timed_build(build, name: str, args: tuple, kwargs: dict):
    """load_inline(name, ...) as torch runs it, adding where its seconds went to build_parts(): the
    call's wall time, ninja's steps (from the lines its log gained) and kz-nvcc's phases."""
    directory = kwargs.get("build_directory") or _extension_build_dir(name)
    ninja_log, nvcc_report = os.path.join(directory, ".ninja_log"), os.path.join(directory, _NVCC_REPORT)
    _remove_quietly(nvcc_report)  # an earlier evaluation's build in this dir
    os.environ["KZ_NVCC_REPORT"] = nvcc_report
    try:
        log_size = os.path.getsize(ninja_log)
    except OSError:
        log_size = 0
    started, built = time.monotonic(), False
    try:
        module = build(name, *args, **kwargs)
        built = True
        return module
    finally:
        try:  # diagnostics: never in the way of the build's module or its error
            _add_part("load_inline", time.monotonic() - started)
            if built:  # ninja logs only the steps that succeeded: a failed build's would read as fast
                _add_ninja_parts(ninja_log, log_size)
            _add_nvcc_parts(nvcc_report)
        except Exception:
            pass


def build_parts(compile_started=None) -> dict:
    """Where this process's load_inline builds spent their seconds (a verdict's build_s, reported for
    the throughput benchmark, never part of a reward; a candidate could write these files itself):
      import_to_build   from the compile stage's start (compile_started, time.monotonic()) to the
                        candidate's first load_inline call: its import up to there
      load_inline       the calls that built (torch writing the sources and build.ninja, ninja, the
                        import of the library)
      ninja             ninja's span; ninja_cuda, ninja_cpp, ninja_link its steps (the .cu objects,
                        main.cpp's, the link): the first two run side by side. Only from builds that
                        succeeded (ninja logs no failed step)
      nvcc_plan         kz-nvcc's `nvcc --dryrun` and set-up; nvcc_host_chain (host preprocessing,
                        cudafe++); nvcc_device_wait (from the chains' start until the device chain
                        started: 0 side by side, the host chain's time after it); nvcc_device_chain
                        (device preprocessing, cicc, ptxas, fatbinary, and its rerun where the two
                        module ids differed); nvcc_host_compile (the host compiler on cudafe++'s
                        output, after both chains)
    Sums over this process's builds; empty where none ran (no load_inline, or a kept build). Only
    names and finite seconds: the candidate runs in this process and could put anything there."""
    parts = {name: seconds for name, seconds in _build_parts.items() if _is_seconds(name, seconds)}
    first_call = _load_inline_calls[0] if _load_inline_calls else None
    if parts and _is_seconds("", compile_started) and _is_seconds("", first_call):
        parts["import_to_build"] = max(0.0, first_call - compile_started)
    return parts


def _is_seconds(name, value) -> bool:
    return type(name) is str and type(value) is float and math.isfinite(value)


def _add_part(name: str, seconds: float) -> None:
    _build_parts[name] = _build_parts.get(name, 0.0) + float(seconds)


def _read_lines(path: str, offset: int = 0) -> list:
    """The file's lines from byte `offset` (all of them where it is shorter now: rewritten), with
    undecodable bytes replaced; none where it cannot be read."""
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size >= offset:
                file.seek(offset)
            return file.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


_NINJA_LOG_LINE = re.compile(r"([0-9]+)\t([0-9]+)\t[^\t]*\t([^\t]+)\t")


def _add_ninja_parts(ninja_log: str, size_before: int) -> None:
    """ninja's log gains a line per step that succeeded (start and end in ms from ninja's start, its
    mtime, the output, its command's hash; the same columns in logs v5-v7); the lines after
    size_before are this build's (the whole log where ninja rewrote it, which it does only past
    ~100 entries)."""
    spans = []
    for line in _read_lines(ninja_log, size_before):
        if not (match := _NINJA_LOG_LINE.match(line)):
            continue  # the header, or a line torn by a concurrent write
        start_ms, end_ms, output = int(match[1]), int(match[2]), match[3]
        spans.append((start_ms, end_ms))
        step = "ninja_cuda" if output.endswith(".cuda.o") else "ninja_cpp" if output.endswith(".o") else "ninja_link"
        _add_part(step, (end_ms - start_ms) / 1000)
    if spans:
        _add_part("ninja", (max(end for _, end in spans) - min(start for start, _ in spans)) / 1000)


_NVCC_PHASES = ("plan_s", "host_chain_s", "device_chain_started_s", "device_chain_s", "final_started_s", "total_s")


def _add_nvcc_parts(report: str) -> None:
    """kz-nvcc's line per compile ($KZ_NVCC_REPORT, eval/src/parallel_nvcc.cpp; seconds from its
    chains' start); none where nvcc itself ran or a chain failed (no final_started_s)."""
    for line in _read_lines(report):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        phases = {key: record.get(key) for key in _NVCC_PHASES}
        if not all(type(value) in (int, float) and math.isfinite(value) for value in phases.values()):
            continue
        rerun = record.get("device_rerun_s", 0.0)
        rerun = rerun if type(rerun) in (int, float) and math.isfinite(rerun) else 0.0
        _add_part("nvcc_plan", phases["plan_s"])
        _add_part("nvcc_host_chain", phases["host_chain_s"])
        _add_part("nvcc_device_wait", phases["device_chain_started_s"])
        _add_part("nvcc_device_chain", phases["device_chain_s"] - phases["device_chain_started_s"] + rerun)
        _add_part("nvcc_host_compile", phases["total_s"] - phases["final_started_s"])


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


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
_LIGHTER_BUILD_FAILED = "kz_lighter_build_failed"
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


def kept_build(name: str, kwargs: dict):
    """The module of extension `name` from the supervisor's kept builds of this candidate (its
    pre-build), imported as load_inline imports what it built; None where there is none, or where
    load_inline would not return a module (is_python_module=False, a build_directory of its own)."""
    if not _kept_builds or not kwargs.get("is_python_module", True) or kwargs.get("build_directory"):
        return None
    import torch.utils.cpp_extension as cpp_extension
    kept_dir = os.path.join(_kept_builds, name)
    if not os.path.isfile(os.path.join(kept_dir, name + cpp_extension.LIB_EXT)):
        return None
    return cpp_extension._import_module_from_library(name, kept_dir, True)


def _kept_marker(name: str) -> bool:
    """Whether the kept pre-build found that the lighter build of `name` fails (_write_marker)."""
    return bool(_kept_builds) and os.path.exists(os.path.join(_kept_builds, name, _LIGHTER_BUILD_FAILED))


def _extension_build_dir(name: str) -> str:
    import torch.utils.cpp_extension as cpp_extension
    return cpp_extension._get_build_directory(name, verbose=False)


def _write_marker(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as marker:
            marker.write("the build with lighter headers failed; built as written\n")
    except OSError:
        pass  # only a cache of the decision: the next load tries the lighter build again


def content_addressed_name(name: str, args: tuple, kwargs: dict) -> str:
    """The extension name with a digest of everything load_inline builds from.

    torch keys a build by name alone, and a candidate's pre-build and its evaluation must agree on
    it (kept_build); a name of the content also keeps two extensions of one candidate apart when
    they are called alike. Sources that bind a module under a literal name of their
    own (PYBIND11_MODULE without TORCH_EXTENSION_NAME) must keep theirs."""
    texts = [str(x) for x in (*args, *kwargs.values())]
    if any("PYBIND11_MODULE" in t and "TORCH_EXTENSION_NAME" not in t for t in texts):
        return name
    build = {key: value for key, value in kwargs.items() if key != "verbose"}
    digest = hashlib.sha256(repr((args, sorted(build.items()))).encode()).hexdigest()[:16]
    return f"{name}_{digest}"


def nvrtc_seconds(fmt: str):
    """kz_rtc's NVRTC seconds so far in this process for a `cuda-rtc` request (a verdict's compile_s
    part), else None (another format, or anything gone wrong: the candidate runs in this process and
    could replace kz_rtc's function). Diagnostics only."""
    if fmt != "cuda-rtc":
        return None
    try:
        import kz_rtc
        seconds = kz_rtc.compile_seconds()
    except Exception:
        return None
    return float(seconds) if type(seconds) is float and math.isfinite(seconds) else None


def note_nvrtc_seconds(fmt: str, before, into: dict) -> None:
    """into["nvrtc"]: NVRTC's seconds since `before` (nvrtc_seconds at the compile stage's start)."""
    after = nvrtc_seconds(fmt)
    if before is not None and after is not None:
        into["nvrtc"] = after - before


def model_class_name(fmt: str, source: str) -> str:
    if fmt == "torch" and not re.search(r"^class\s+ModelNew\b", source, re.M):
        return "Model"
    return "ModelNew"


def runnable(fmt: str, device: torch.device) -> bool:
    return device.type == "cuda" or fmt in ("triton", "torch")


def finish_compile_only(fmt, candidate_model, reference, seed, device) -> None:
    """Makes sure something was really compiled before reporting compiled_not_run."""
    if fmt == "cuda-rtc":
        import kz_rtc
        if not kz_rtc.compiled_modules():
            # Some candidates compile lazily in forward; run it until its first launch.
            try:
                with torch.no_grad():
                    candidate_model(*reference.inputs(seed, device))
            except kz_rtc.NotRunnable:
                pass
            except kz_rtc.CompileError:
                raise
            except Exception:
                pass  # CPU tensors where the kernel expects CUDA ones: only compilation matters here
        if not kz_rtc.compiled_modules():
            raise v.Failure(v.FORMAT_ERROR, "no kernel was compiled through kz_rtc.compile", [v.NO_KERNEL_COMPILED])
    elif fmt == "cuda" and not _extension_builds:
        raise v.Failure(v.FORMAT_ERROR, "no CUDA extension was built with load_inline", [v.NO_KERNEL_COMPILED])


def compile_only_message(fmt: str, device: torch.device) -> str:
    if device.type == "cuda":
        return "compiled (compile-only request)"
    tool = {"cuda": "nvcc (load_inline)", "cuda-rtc": "NVRTC"}.get(fmt, fmt)
    return f"compiled with {tool}; not run: no GPU on this machine"


def classify_exception(exc: BaseException, stage: str):
    """(status, check) for an exception raised by candidate code in `stage`."""
    if _is_compile_exception(exc):
        return v.COMPILE_ERROR, v.KERNEL_COMPILE
    # A refused allocation (the sandbox's CPU address-space limit, the GPU memory fraction, or the
    # machine's memory) is an ordinary failure of the kernel, as a CUDA OOM is: runtime_error.
    if is_memory_exception(exc):
        return v.RUNTIME_ERROR, v.MEMORY_LIMIT
    if _chain_has(exc, lambda e: isinstance(e, OSError) and e.errno == errno.EFBIG):  # SIGXFSZ ignored
        return v.SANDBOX_VIOLATION, v.FILE_SIZE_LIMIT
    if stage == "compile":
        return v.RUNTIME_ERROR, v.CONSTRUCTOR_FAILED
    return v.RUNTIME_ERROR, v.FORWARD_FAILED


def _chain_has(exc: BaseException, test) -> bool:
    """test() on the exception and the ones it was raised from (a few levels)."""
    for _ in range(6):
        if exc is None:
            return False
        if test(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_OUT_OF_MEMORY = ("DefaultCPUAllocator: not enough memory", "DefaultCPUAllocator: can't allocate memory",
                  "CUDA out of memory", "Cannot allocate memory", "CUDA error: out of memory",
                  "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_memory_exception(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    return _chain_has(exc, lambda e: isinstance(e, (MemoryError, oom))
                      or (isinstance(e, RuntimeError) and any(text in str(e) for text in _OUT_OF_MEMORY)))


def _is_compile_exception(exc: BaseException) -> bool:
    kind = type(exc)
    if kind.__name__ == "CompileError" and kind.__module__.startswith("kz_rtc"):
        return True
    if kind.__module__.startswith("triton") and "Compil" in kind.__name__:
        return True
    # Under TRITON_INTERPRET=1 (the CPU) there is no Triton frontend: a kernel body using an
    # unknown tl function or mistyped values fails while interpreted, wrapped in InterpreterError.
    # On a GPU the same errors are CompilationErrors, so classify them alike. (Assertions and
    # NotImplementedError, i.e. device_assert or an interpreter limitation, stay runtime errors.)
    if kind.__name__ == "InterpreterError" and kind.__module__.startswith("triton"):
        return isinstance(exc.__cause__, (AttributeError, NameError, TypeError, ValueError))
    return isinstance(exc, RuntimeError) and "Error building extension" in str(exc)


def synchronize(device: torch.device) -> None:
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
