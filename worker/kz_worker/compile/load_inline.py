"""load_inline as a `cuda` candidate's process runs it (LoadInlineBuilds): every build named by its
content, the supervisor's kept pre-build imported instead of built again, the sources built with
lighter headers where they compile so (lighter_headers.py), nvcc as kz-nvcc, and where each build's
seconds went (a verdict profile's build_s)."""
import hashlib
import json
import math
import os
import re
import time

from . import lighter_headers
from .. import cheats, errors, gpu_lock

_NVCC_REPORT = "kz_nvcc_report.jsonl"  # in the build dir: kz-nvcc's phases, one line per compile
# Kept beside a lighter build that failed, and with the supervisor's kept builds: the evaluation after
# a pre-build goes straight to the build as written.
_LIGHTER_BUILD_FAILED = "kz_lighter_build_failed"


class LoadInlineBuilds:
    """This process's load_inline builds: install() wraps torch's load_inline, which then names each
    build by its content (content_addressed_name), imports the supervisor's kept build of it where
    there is one (kept_build), tries the lighter headers first (lighter_headers.lighter_sources),
    and adds where the build's seconds went to build_parts().

    One object per process (`builds` below), installed before the Guard's snapshot and never rebound;
    its lists and dict only grow in place (as cheats._state does)."""

    def __init__(self):
        self.kept_dir = None  # the supervisor's kept builds of this candidate (read-only), or None
        self.names = []  # names passed to load_inline in this process
        self.parts = {}  # where the builds spent their seconds (build_parts)
        self.calls = []  # time.monotonic() of each load_inline call

    def install(self, kept_dir=None, muteable: bool = False) -> None:
        """Wraps load_inline (above); `muteable`: the modules it returns can be muted by the effect
        probe (cheats.muteable_extension). kz-nvcc as nvcc where the supervisor gives one."""
        import torch.utils.cpp_extension as cpp_extension
        self.kept_dir = kept_dir
        use_parallel_nvcc()
        original = cpp_extension.load_inline

        def load_inline(name, *args, **kwargs):
            return self.load(original, name, args, kwargs)

        def load_muteable(name, *args, **kwargs):
            return cheats.muteable_extension(load_inline(name, *args, **kwargs))

        # A build is CPU work: never inside a shared GPU hold (one called in a forward).
        cpp_extension.load_inline = gpu_lock.releasing(load_muteable if muteable else load_inline)

    def load(self, build, name: str, args: tuple, kwargs: dict):
        """load_inline(name, *args, **kwargs) by `build` (torch's): the lighter build first where it
        applies and has not failed before, else the build as written; either kept where it was."""
        self.calls.append(time.monotonic())
        self.names.append(name)
        lighter = lighter_headers.lighter_sources(build, args, kwargs)
        if lighter is not None:
            light_kwargs, main_lightened = lighter
            light_name = content_addressed_name(name, (), light_kwargs)
            if (kept := self.kept_build(light_name, light_kwargs)) is not None:
                return kept
            failed_marker = None if self._kept_lighter_failed(light_name) else os.path.join(
                _extension_build_dir(light_name), _LIGHTER_BUILD_FAILED)
            if failed_marker and not os.path.exists(failed_marker):
                try:
                    return self.timed_build(build, light_name, (), light_kwargs)
                except Exception as exc:
                    if (not errors.is_compile_exception(exc)
                            or not lighter_headers.may_need_the_full_header(str(exc), main_lightened)):
                        raise  # as written, it would fail alike: no second build
                    _write_marker(failed_marker)  # kept with the build: the evaluation after a pre-build skips it
        full_name = content_addressed_name(name, args, kwargs)
        if (kept := self.kept_build(full_name, kwargs)) is not None:
            return kept
        return self.timed_build(build, full_name, args, kwargs)

    def timed_build(self, build, name: str, args: tuple, kwargs: dict):
        """build(name, ...) as torch runs it, adding where its seconds went to build_parts(): the call's
        wall time, ninja's steps (from the lines its log gained) and kz-nvcc's phases."""
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
                self._add_part("load_inline", time.monotonic() - started)
                if built:  # ninja logs only the steps that succeeded: a failed build's would read as fast
                    self._add_ninja_parts(ninja_log, log_size)
                self._add_nvcc_parts(nvcc_report)
            except Exception:
                pass

    def build_parts(self, compile_started=None) -> dict:
        """Where this process's load_inline builds spent their seconds (a verdict profile's build_s, reported for
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
        parts = {name: seconds for name, seconds in self.parts.items() if _is_seconds(name, seconds)}
        first_call = self.calls[0] if self.calls else None
        if parts and _is_seconds("", compile_started) and _is_seconds("", first_call):
            parts["import_to_build"] = max(0.0, first_call - compile_started)
        return parts

    def kept_build(self, name: str, kwargs: dict):
        """The module of extension `name` from the supervisor's kept builds of this candidate (its
        pre-build), imported as load_inline imports what it built; None where there is none, or where
        load_inline would not return a module (is_python_module=False, a build_directory of its own)."""
        if not self.kept_dir or not kwargs.get("is_python_module", True) or kwargs.get("build_directory"):
            return None
        import torch.utils.cpp_extension as cpp_extension
        kept_dir = os.path.join(self.kept_dir, name)
        if not os.path.isfile(os.path.join(kept_dir, name + cpp_extension.LIB_EXT)):
            return None
        return cpp_extension._import_module_from_library(name, kept_dir, True)

    def _kept_lighter_failed(self, name: str) -> bool:
        """Whether the kept pre-build found that the lighter build of `name` fails (_write_marker)."""
        return bool(self.kept_dir) and os.path.exists(os.path.join(self.kept_dir, name, _LIGHTER_BUILD_FAILED))

    def _add_part(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + float(seconds)

    def _add_ninja_parts(self, ninja_log: str, size_before: int) -> None:
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
            self._add_part(step, (end_ms - start_ms) / 1000)
        if spans:
            self._add_part("ninja", (max(end for _, end in spans) - min(start for start, _ in spans)) / 1000)

    def _add_nvcc_parts(self, report: str) -> None:
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
            self._add_part("nvcc_plan", phases["plan_s"])
            self._add_part("nvcc_host_chain", phases["host_chain_s"])
            self._add_part("nvcc_device_wait", phases["device_chain_started_s"])
            self._add_part("nvcc_device_chain", phases["device_chain_s"] - phases["device_chain_started_s"] + rerun)
            self._add_part("nvcc_host_compile", phases["total_s"] - phases["final_started_s"])


builds = LoadInlineBuilds()


def use_parallel_nvcc() -> None:
    """load_inline's ninja runs $PYTORCH_NVCC as nvcc: kz-nvcc where the supervisor gives one
    (KZ_PARALLEL_NVCC, [tuning] parallel_nvcc), which runs nvcc's own steps with the host and device
    halves at once and writes the same object (eval/include/kz/eval/parallel_nvcc.h). It runs the
    nvcc torch would have (KZ_REAL_NVCC). A PYTORCH_NVCC set already (ccache, say) is kept."""
    tool = os.environ.get("KZ_PARALLEL_NVCC")
    if not tool or os.environ.get("PYTORCH_NVCC"):
        return
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME:
        os.environ["KZ_REAL_NVCC"] = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    os.environ["PYTORCH_NVCC"] = tool


def torch_arch_list(arch: str) -> str:
    """"sm_90" / "90" / "9.0" / "sm_90a" -> "9.0" / "9.0a" (TORCH_CUDA_ARCH_LIST form)."""
    match = re.fullmatch(r"(?:sm_|compute_)?(\d+)(\d)([a-z]?)", arch.strip().lower().replace(".", ""))
    return f"{match[1]}.{match[2]}{match[3]}" if match else "9.0"


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


def _is_seconds(name, value) -> bool:
    return type(name) is str and type(value) is float and math.isfinite(value)


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
_NVCC_PHASES = ("plan_s", "host_chain_s", "device_chain_started_s", "device_chain_s", "final_started_s", "total_s")


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


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
