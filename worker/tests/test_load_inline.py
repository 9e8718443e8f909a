"""load_inline as kz wraps it: builds named by their content (samples that call their extension alike
do not share, and fight over, one build directory; identical sources do), and CUDA sources built
with lighter headers where they compile so, as written where not."""
import functools
import json
import os
import pathlib
import re
import time

import pytest
import torch

from kz_worker.compile import lighter_headers
from kz_worker.compile import load_inline as inline_builds  # the tests' load_inline is the wrapped function

@pytest.fixture(scope="module")
def module_extensions_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_extensions")


@pytest.fixture(autouse=True)
def extensions_dir(module_extensions_dir, monkeypatch):
    """What the tests build or keep (the full header's names) goes to a temporary directory."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(module_extensions_dir))


CPP = "torch::Tensor relu_cuda(torch::Tensor x);"
CUDA = "__global__ void relu_kernel(const float* x, float* y, long n) {}"


def name(cuda_source, **extra):
    return inline_builds.content_addressed_name("relu_ext", (), {"cpp_sources": CPP, "cuda_sources": cuda_source,
                                                           "functions": ["relu_cuda"], **extra})


def test_same_sources_same_name_other_sources_other_name():
    assert name(CUDA) == name(CUDA)
    assert name(CUDA) != name(CUDA + "\n// another sample")
    assert name(CUDA).startswith("relu_ext_")
    assert name(CUDA).isidentifier()


def test_build_flags_count_verbosity_does_not():
    assert name(CUDA, extra_cuda_cflags=["-O3"]) != name(CUDA)
    assert name(CUDA, verbose=True) == name(CUDA)


def test_positional_sources_count_too():
    first = inline_builds.content_addressed_name("ext", (CPP, CUDA), {})
    assert first != inline_builds.content_addressed_name("ext", (CPP, CUDA + " "), {})


def test_a_module_bound_under_a_literal_name_keeps_it():
    own_binding = CPP + "\nPYBIND11_MODULE(relu_ext, m) { m.def(\"relu_cuda\", &relu_cuda); }"
    assert inline_builds.content_addressed_name("relu_ext", (own_binding,), {"cuda_sources": CUDA}) == "relu_ext"
    macro_binding = CPP + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"
    assert inline_builds.content_addressed_name("relu_ext", (macro_binding,), {"cuda_sources": CUDA}) != "relu_ext"


# ---- lighter headers for load_inline's sources ---------------------------------------------------

FULL_INCLUDE = "#include <torch/extension.h>\n"
DEFINITION = "torch::Tensor relu_cuda(torch::Tensor x) { return x; }"  # main.cpp keeps the full header


def lighter(*args, **kwargs):
    import torch.utils.cpp_extension as cpp_extension
    return lighter_headers.lighter_sources(cpp_extension.load_inline, args, kwargs)


def test_the_full_torch_header_becomes_a_comment_on_the_same_line():
    source = FULL_INCLUDE + "#include <cuda_runtime.h>\n" + CUDA
    kwargs, main_lightened = lighter(cpp_sources=DEFINITION, cuda_sources=source)
    prelude, light = kwargs["cuda_sources"]
    assert "torch/extension.h>\n#" not in light and "#include <cuda_runtime.h>" in light
    assert light.count("\n") == source.count("\n"), "compiler messages keep their line numbers"
    assert light.splitlines()[0].startswith("//")
    assert prelude == lighter_headers.light_cuda_prelude([DEFINITION, source])
    # main.cpp as load_inline writes it, since kz now writes the CUDA file's headers itself.
    assert kwargs["cpp_sources"] == ["#include <torch/extension.h>", DEFINITION] and not main_lightened
    assert kwargs["no_implicit_headers"] is True


def test_positional_and_listed_sources_are_lightened_too():
    # load_inline(name, cpp_sources, cuda_sources, ...): the wrapper passes what follows the name.
    kwargs, _ = lighter(DEFINITION, [CUDA, '  # include "torch/extension.h"\n'], None, ["f"])
    assert kwargs["cpp_sources"][1:] == [DEFINITION] and kwargs["functions"] == ["f"]
    assert kwargs["cuda_sources"][1] == CUDA and kwargs["cuda_sources"][2].lstrip().startswith("//")


def test_sources_without_the_full_header_get_the_lighter_prelude_too():
    # load_inline would put <torch/types.h> (all of ATen/Functions.h) ahead of them.
    kwargs, _ = lighter(cpp_sources=DEFINITION, cuda_sources=CUDA)
    assert kwargs["cuda_sources"][1:] == [CUDA] and "#include <torch/types.h>" not in kwargs["cuda_sources"][0]


def test_the_cuda_prelude_brings_the_ops_the_sources_name():
    source = ("// at::addmm in a comment is not a use\n"
              "auto y = torch::zeros_like(x); auto z = at::empty({2}, x.options()); using namespace torch; sigmoid(x);")
    prelude = lighter_headers.light_cuda_prelude([source])
    ops = {re.fullmatch(r"#include <ATen/ops/(\w+?)(?:_ops)?\.h>", line)[1] for line in prelude.splitlines()
           if line.startswith("#include <ATen/ops/")}
    assert ops == {"zeros_like", "empty", "sigmoid"}, "op headers: the ATen ops named, not x, y or torch"
    assert "inline at::Tensor zeros_like(" in prelude, "the op's wrappers, without its header's includes"
    assert "#include <ATen/Functions.h>" not in prelude and "ivalue.h" not in prelude and "DeviceGuard" not in prelude
    assert prelude.splitlines()[-1].startswith("#line 4 "), "messages: the lines as load_inline's three includes give"


def _op_header(op: str) -> str:
    import torch.utils.cpp_extension as cpp_extension
    with open(os.path.join(cpp_extension.include_paths()[0], "ATen", "ops", f"{op}.h")) as header:
        return header.read()


def test_the_cuda_prelude_brings_the_heavier_headers_only_where_named():
    # ATen/DeviceGuard.h brings IValue (~30% of nvcc's time): only for a source that names what it holds.
    guarded = lighter_headers.light_cuda_prelude(["const at::OptionalDeviceGuard guard(device_of(x));"])
    assert "#include <ATen/DeviceGuard.h>" in guarded.splitlines()
    # An op whose wrappers take torch's list references keeps its own header, which has what they need.
    assert "ITensorListRef" in _op_header("cat")
    assert "#include <ATen/ops/cat.h>" in lighter_headers.light_cuda_prelude(["at::cat({x, y}, 1);"]).splitlines()


# Ops whose wrappers take what the stripped includes of their headers held: generators, reductions,
# dimension names, lists, optional arrays, streams, strings, several outputs.
OPS_OF_EVERY_KIND = ["empty", "zeros_like", "full", "arange", "randn", "bernoulli", "nll_loss", "mse_loss",
                     "sum", "amax", "max", "topk", "sort", "softmax", "log_softmax", "layer_norm", "conv2d",
                     "addmm", "matmul", "linear", "where", "index_select", "split", "unbind", "stack", "cat",
                     "rename", "align_to", "view_as_real", "to", "copy", "fill", "upsample_nearest2d",
                     "native_batch_norm", "embedding_bag", "scaled_dot_product_attention", "einsum"]


def test_the_op_wrappers_compile_without_their_headers_includes(tmp_path):
    """Every op's wrappers, without the includes of its header, must compile against the prelude:
    a sample here (all 1,333 of torch 2.11's did, ~76 s of g++ on this project's CPU)."""
    import subprocess
    import torch.utils.cpp_extension as cpp_extension
    ops = [op for op in OPS_OF_EVERY_KIND if op in lighter_headers._aten_op_names()]
    assert len(ops) > 30
    prelude = lighter_headers.light_cuda_prelude([" ".join(f"at::{op}" for op in ops)])
    stripped = [op for op in ops if f"#include <ATen/ops/{op}_ops.h>" in prelude]
    assert len(stripped) >= len(ops) - 2, "nearly all go without their header's includes"
    source = tmp_path / "ops.cpp"
    source.write_text(prelude + "\nint main() { return 0; }\n")
    includes = [*cpp_extension.include_paths(device_type="cuda")]
    done = subprocess.run([cpp_extension.get_cxx_compiler(), "-std=c++17", "-fsyntax-only",
                           *(f"-I{d}" for d in includes), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("cpp", [DEFINITION, CPP])  # main.cpp as written, and lightened
def test_the_lighter_build_never_changes_the_candidates_lists(cpp):
    cpp_sources, cuda_sources = [cpp], [FULL_INCLUDE + CUDA]
    kwargs, _ = lighter(cpp_sources, cuda_sources, functions=["relu_cuda"])
    kwargs["cpp_sources"].insert(0, "#include <torch/extension.h>")  # what load_inline does to its lists
    kwargs["cpp_sources"] += ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"]
    kwargs["cuda_sources"].insert(0, "#include <torch/types.h>")
    assert cpp_sources == [cpp] and cuda_sources == [FULL_INCLUDE + CUDA], "the build as written gets them intact"


def test_declarations_only_main_gets_the_binding_header():
    kwargs, main_lightened = lighter(FULL_INCLUDE + CPP, CUDA, functions=["relu_cuda"])
    assert main_lightened and kwargs["no_implicit_headers"] is True
    assert kwargs["cpp_sources"] == lighter_headers._LIGHT_MAIN_PRELUDE + [FULL_INCLUDE + CPP]
    assert "torch/extension.h" not in "".join(lighter_headers._LIGHT_MAIN_PRELUDE)
    assert lighter_headers._LIGHT_MAIN_PRELUDE[-1].startswith("#line 2 ")  # as load_inline's one include line gives
    assert kwargs["cuda_sources"] == [lighter_headers.light_cuda_prelude([FULL_INCLUDE + CPP, CUDA]), CUDA]


@pytest.mark.parametrize("cpp, light", [
    (CPP, True),
    ("// a comment\n" + FULL_INCLUDE + "std::vector<torch::Tensor> f(const torch::Tensor& x, int64_t k, double a,"
     " bool b, std::vector<int64_t> shape);\nstd::tuple<at::Tensor, at::Tensor> g(at::Tensor x);", True),
    ("void launch(torch::Tensor out, torch::Tensor in);", True),
    (DEFINITION, False),                                          # code: it may use anything
    ("#include <vector>\n" + CPP, False),                         # another include
    ("torch::Tensor f(c10::optional<torch::Tensor> x);", False),  # a type beyond pybind.h's usual casters
    ("torch::Tensor f(at::IntArrayRef size);", False),
    ("torch::Tensor f(torch::Tensor x, float a = 1.0);", False),  # a default argument
    ("torch::Tensor f(torch::Tensor x)", False),                  # no semicolon: not a declaration
])
def test_only_declarations_over_known_types_lighten_main(cpp, light):
    assert lighter_headers.declarations_only([cpp]) is light


@pytest.mark.parametrize("case", ["own pybind module", "own build directory", "no implicit headers",
                                  "no cuda sources"])
def test_sources_that_need_the_full_header_or_could_collide_are_left_as_written(case):
    kwargs = {"cpp_sources": CPP, "cuda_sources": FULL_INCLUDE + CUDA}
    if case == "own pybind module":
        kwargs["cuda_sources"] += "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"
    elif case == "own build directory":
        kwargs["build_directory"] = "/tmp/somewhere"
    elif case == "no implicit headers":
        kwargs["no_implicit_headers"] = True
    else:
        del kwargs["cuda_sources"]
    assert lighter(**kwargs) is None


# The real builds (nvcc and the host compiler, no GPU needed): ~20 s for the lighter one, ~70 s for a
# source that needs the full header (its lighter build fails first).

KERNEL = """
__global__ void twice_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
torch::Tensor twice(torch::Tensor x) {
    auto y = torch::zeros_like(x);  // an op header the lighter prelude brings for the name
    twice_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""


@pytest.fixture
def recorded_builds(tmp_path, monkeypatch):
    """load_inline as kz wraps it, over torch's own, recording the names torch is asked to build."""
    import torch.utils.cpp_extension as cpp_extension
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    if not torch.cuda.is_available():
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    built = []
    torch_load_inline = cpp_extension.load_inline

    @functools.wraps(torch_load_inline)  # kz's wrapper binds the arguments by torch's signature
    def recording(name, *args, **kwargs):
        built.append(name)
        return torch_load_inline(name, *args, **kwargs)

    monkeypatch.setattr(cpp_extension, "load_inline", recording)
    for name in ("PYTORCH_NVCC", "KZ_REAL_NVCC"):  # recorded, so the test's own are undone after it
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("KZ_NVCC_REPORT", "")  # the wrapper points it into each build's dir
    monkeypatch.setattr(inline_builds, "builds", inline_builds.LoadInlineBuilds())  # a fresh worker's
    inline_builds.builds.install()  # kz-nvcc where KZ_PARALLEL_NVCC names it (CTest: the one built)
    return cpp_extension.load_inline, built, tmp_path


def test_a_kernel_builds_with_the_lighter_header(recorded_builds):
    load_inline, built, ext_dir = recorded_builds
    module = load_inline("kz_light", cpp_sources="torch::Tensor twice(torch::Tensor x);",
                         cuda_sources=FULL_INCLUDE + KERNEL, functions=["twice"])
    assert hasattr(module, "twice")
    assert len(built) == 1, built
    assert "// <torch/extension.h>" in (ext_dir / built[0] / "cuda.cu").read_text()
    main = (ext_dir / built[0] / "main.cpp").read_text()
    assert "torch/extension.h" not in main and lighter_headers._LIGHT_MAIN_PRELUDE[0] in main
    if os.environ.get("KZ_NVCC_SIDE_BY_SIDE") == "always":  # under CTest: nvcc was kz-nvcc, its two halves at once
        report = [json.loads(line) for line in (ext_dir / built[0] / inline_builds._NVCC_REPORT).read_text().splitlines()]
        assert report and all(r["parallel"] and r["module_ids_agree"] and r["status"] == 0 for r in report), report


def test_a_build_reports_where_its_seconds_went(recorded_builds):
    load_inline, built, ext_dir = recorded_builds
    compile_started = time.monotonic()
    load_inline("kz_parts", cpp_sources="torch::Tensor twice(torch::Tensor x);",
                cuda_sources=FULL_INCLUDE + KERNEL, functions=["twice"])
    parts = inline_builds.builds.build_parts(compile_started)
    for step in ("load_inline", "ninja", "ninja_cuda", "ninja_cpp", "ninja_link", "import_to_build"):
        assert step in parts, parts
    assert parts["ninja"] <= parts["load_inline"]
    assert max(parts["ninja_cuda"], parts["ninja_cpp"]) <= parts["ninja"] + 0.01  # ninja logs whole ms
    assert parts["ninja_cuda"] + parts["ninja_link"] <= parts["ninja"] + 0.01, "the link follows the objects"
    assert parts["ninja_cuda"] > 1.0, "nvcc over torch's headers takes seconds"
    if os.environ.get("KZ_PARALLEL_NVCC"):  # under CTest: kz-nvcc, whose phases lie inside ninja's step
        nvcc = ("nvcc_plan", "nvcc_host_chain", "nvcc_device_wait", "nvcc_device_chain", "nvcc_host_compile")
        assert all(parts[name] >= 0 for name in nvcc), parts
        chains = max(parts["nvcc_host_chain"], parts["nvcc_device_wait"] + parts["nvcc_device_chain"])
        assert parts["nvcc_plan"] + chains + parts["nvcc_host_compile"] <= parts["ninja_cuda"] + 0.01, parts
    # A second load of the same build runs no ninja step: nothing is added but the call.
    before = dict(parts)
    load_inline("kz_parts", cpp_sources="torch::Tensor twice(torch::Tensor x);",
                cuda_sources=FULL_INCLUDE + KERNEL, functions=["twice"])
    after = inline_builds.builds.build_parts(compile_started)
    assert {k: after[k] for k in after if k != "load_inline"} == {k: before[k] for k in before if k != "load_inline"}


@pytest.fixture
def fresh_parts(monkeypatch):
    monkeypatch.setattr(inline_builds, "builds", inline_builds.LoadInlineBuilds())
    monkeypatch.setenv("KZ_NVCC_REPORT", "")


def test_build_parts_come_from_ninjas_log_and_kz_nvccs_report(tmp_path, fresh_parts):
    def build(name, build_directory):  # what ninja and kz-nvcc leave, without compiling
        (tmp_path / ".ninja_log").write_text("# ninja log v6\n0\t6000\t1\tkz.cuda.o\tab\n"
                                             "10\t2010\t1\tmain.o\tcd\n6000\t6500\t1\tkz.so\tef\n")
        report = {"parallel": True, "plan_s": 0.25, "host_chain_s": 3.0, "device_chain_started_s": 0.5,
                  "device_chain_s": 2.5, "device_rerun_s": 1.0, "final_started_s": 4.0, "total_s": 5.5}
        pathlib.Path(os.environ["KZ_NVCC_REPORT"]).write_text(json.dumps(report) + "\n")
        return "module"
    assert inline_builds.builds.timed_build(build, "kz_parts", (), {"build_directory": str(tmp_path)}) == "module"
    parts = inline_builds.builds.build_parts()
    assert {k: parts[k] for k in parts if k != "load_inline"} == {
        "ninja_cuda": 6.0, "ninja_cpp": 2.0, "ninja_link": 0.5, "ninja": 6.5, "nvcc_plan": 0.25,
        "nvcc_host_chain": 3.0, "nvcc_device_wait": 0.5, "nvcc_device_chain": 3.0, "nvcc_host_compile": 1.5}
    assert "import_to_build" not in parts, "no compile stage start given"


@pytest.mark.parametrize("report, log", [
    (b'1\n"total_s"\n{"total_s": 1}\n{"plan_s": "x"}\n[]\n', "\u00b2\t5\t1\tx.o\th\n".encode()),
    (b"\xff\xfe{not json\n", b"12\t\n\t\t\t\n\xff\t1\t1\tx.o\th\n"),
    (None, None),
])
def test_a_malformed_report_or_log_never_gets_in_the_builds_way(tmp_path, fresh_parts, report, log):
    def build(name, build_directory):
        if report is not None:
            pathlib.Path(os.environ["KZ_NVCC_REPORT"]).write_bytes(report)
            (tmp_path / ".ninja_log").write_bytes(log)
        return "module"
    assert inline_builds.builds.timed_build(build, "kz_bad", (), {"build_directory": str(tmp_path)}) == "module"
    assert set(inline_builds.builds.build_parts()) == {"load_inline"}


def test_a_failed_build_keeps_its_error_and_reports_no_ninja_steps(tmp_path, fresh_parts):
    def build(name, build_directory):
        (tmp_path / ".ninja_log").write_text("# ninja log v6\n0\t900\t1\tmain.o\tcd\n")
        pathlib.Path(os.environ["KZ_NVCC_REPORT"]).write_text("not json\n")
        raise RuntimeError("Error building extension 'kz_broken'")
    with pytest.raises(RuntimeError, match="kz_broken"):
        inline_builds.builds.timed_build(build, "kz_broken", (), {"build_directory": str(tmp_path)})
    assert set(inline_builds.builds.build_parts()) == {"load_inline"}, "ninja logs no failed step: main.o alone would mislead"


def test_only_names_and_finite_seconds_leave_build_parts(fresh_parts):
    inline_builds.builds.parts.update({"load_inline": 2.0, ("a",): 1.0, "nan": float("nan"), "text": "1"})
    inline_builds.builds.calls.append(None)  # what a candidate in the process could do
    assert inline_builds.builds.build_parts(0.5) == {"load_inline": 2.0}


def keep_like_the_supervisor(ext_dir, kept_dir):
    """What the supervisor keeps of a request's builds (eval/src/evaluator.cpp, keep_extension_builds):
    each extension's library and the failed-lighter-build marker."""
    import shutil
    for build in ext_dir.iterdir():
        for file in (build.name + ".so", inline_builds._LIGHTER_BUILD_FAILED):
            if (build / file).is_file():
                (kept_dir / build.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(build / file, kept_dir / build.name / file)


def test_the_evaluation_after_a_pre_build_imports_the_kept_build(recorded_builds, tmp_path_factory, monkeypatch):
    load_inline, built, ext_dir = recorded_builds
    kwargs = dict(cpp_sources="torch::Tensor twice(torch::Tensor x);", cuda_sources=FULL_INCLUDE + KERNEL,
                  functions=["twice"])
    load_inline("kz_kept", **kwargs)  # the pre-build, in its own scratch dir
    kept = tmp_path_factory.mktemp("kept")
    keep_like_the_supervisor(ext_dir, kept)
    # The evaluation: another, empty scratch dir, and the kept build, read-only.
    evaluation_dir = tmp_path_factory.mktemp("evaluation")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(evaluation_dir))
    monkeypatch.setattr(inline_builds.builds, "kept_dir", str(kept))
    module = load_inline("kz_kept", **kwargs)
    # (This process loaded the pre-build's library already, so its __file__ is that one's; an
    # evaluation is a fresh process.)
    assert hasattr(module, "twice") and len(built) == 1, f"built again: {built}"
    assert not any(evaluation_dir.iterdir()), "nothing built or written in the evaluation's dir"
    other = load_inline("kz_kept", **dict(kwargs, cuda_sources=kwargs["cuda_sources"] + "\n// other bytes"))
    assert hasattr(other, "twice") and len(built) == 2, "what was not kept is built, in the evaluation's dir"


def test_a_kept_build_is_imported_only_where_load_inline_would_return_a_module(tmp_path, monkeypatch):
    import subprocess
    import sysconfig
    (tmp_path / "kz_tiny").mkdir()
    source = tmp_path / "tiny.c"
    source.write_text("#include <Python.h>\n"
                      "static struct PyModuleDef tiny = {PyModuleDef_HEAD_INIT, \"kz_tiny\", NULL, -1, NULL};\n"
                      "PyMODINIT_FUNC PyInit_kz_tiny(void) {\n"
                      "  PyObject* m = PyModule_Create(&tiny); PyModule_AddIntConstant(m, \"answer\", 42); return m;\n}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source),
                    "-o", str(tmp_path / "kz_tiny" / "kz_tiny.so")], check=True)
    monkeypatch.setattr(inline_builds.builds, "kept_dir", None)
    assert inline_builds.builds.kept_build("kz_tiny", {}) is None, "no kept builds: build it"
    monkeypatch.setattr(inline_builds.builds, "kept_dir", str(tmp_path))
    assert inline_builds.builds.kept_build("kz_tiny", {}).answer == 42
    assert inline_builds.builds.kept_build("kz_other", {}) is None
    assert inline_builds.builds.kept_build("kz_tiny", {"is_python_module": False}) is None
    assert inline_builds.builds.kept_build("kz_tiny", {"build_directory": str(tmp_path)}) is None


def test_a_kernel_that_needs_the_full_header_is_built_as_written_and_kept_so(recorded_builds, tmp_path_factory,
                                                                             monkeypatch):
    """One build as written (nvcc on torch's whole headers, ~2 min on a 2-core CPU) for both halves:
    the process that built it, and the evaluation after a pre-build, which skips the lighter build the
    pre-build found failing."""
    load_inline, built, ext_dir = recorded_builds
    # torch::cuda::device_count comes with torch/extension.h (torch/all.h), not torch/types.h.
    needs_full = KERNEL.replace("auto y =", "TORCH_CHECK(torch::cuda::device_count() >= 0);\n    auto y =")
    kwargs = dict(cpp_sources="torch::Tensor twice(torch::Tensor x);", cuda_sources=FULL_INCLUDE + needs_full,
                  functions=["twice"])
    assert hasattr(load_inline("kz_full", **kwargs), "twice")  # the pre-build: lighter (fails), then as written
    light, full = built
    assert (ext_dir / light / inline_builds._LIGHTER_BUILD_FAILED).exists()
    assert "#include <torch/extension.h>" in (ext_dir / full / "cuda.cu").read_text()
    assert hasattr(load_inline("kz_full", **kwargs), "twice")
    assert built[2:] == [full], "a second load goes straight to the build as written"

    kept = tmp_path_factory.mktemp("kept")
    keep_like_the_supervisor(ext_dir, kept)
    evaluation_dir = tmp_path_factory.mktemp("evaluation")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(evaluation_dir))
    monkeypatch.setattr(inline_builds.builds, "kept_dir", str(kept))
    assert hasattr(load_inline("kz_full", **kwargs), "twice")
    assert built[3:] == [], f"the evaluation built again: {built}"
    assert not any(evaluation_dir.iterdir())


@pytest.mark.parametrize("message, as_written", [
    ('identifier "my_made_up_fn" is undefined', False),
    ('namespace "torch" has no member "totally_bogus_name"', False),
    ('identifier "PyObject" is undefined', True),           # Python.h comes with the full header
    ('namespace "torch" has no member "cuda"', True),       # so does torch/cuda.h
    ('namespace "std" has no member "cout"', True),         # and std headers it includes
    ('expected a ";"', True),                               # not a missing name: build it as written
    ("'device_count' is not a member of 'torch::cuda'", True),   # GCC names the scope after the name
    ("'made_up_count' is not a member of 'torch::cuda'", False),
    ("'cout' is not a member of 'std'", True),
])
def test_only_errors_the_full_header_cannot_fix_skip_the_second_build(message, as_written):
    assert lighter_headers.may_need_the_full_header(f"/ext/x/cuda.cu(3): error: {message}\n") is as_written
    assert lighter_headers.may_need_the_full_header(f"/ext/x/main.cpp:3:5: error: 'f' was not declared in this scope\n") is False
    assert lighter_headers.may_need_the_full_header("ninja: build stopped: subcommand failed.\n") is True


def test_a_lightened_main_cpps_errors_count():
    made_up = "/ext/x/main.cpp:3:5: error: 'twice_made_up' was not declared in this scope\n"
    assert lighter_headers.may_need_the_full_header(made_up, main_lightened=True) is False
    missing_python = "/ext/x/main.cpp:3:5: error: 'PyObject' was not declared in this scope\n"
    assert lighter_headers.may_need_the_full_header(missing_python, main_lightened=False) is False  # as written alike
    assert lighter_headers.may_need_the_full_header(missing_python, main_lightened=True) is True


@pytest.fixture(scope="module")
def lighter_builds_dir(tmp_path_factory):
    """What scripts/prepare_lighter_builds.py makes at setup: main.cpp's prelude precompiled."""
    root = str(tmp_path_factory.mktemp("lighter-builds"))
    return root, lighter_headers.keep_main_prelude_pch(root)


@pytest.fixture
def precompiled_prelude(lighter_builds_dir, monkeypatch):
    root, directory = lighter_builds_dir
    monkeypatch.setenv("KZ_LIGHTER_BUILDS_DIR", root)  # as the supervisor names it
    lighter_headers.main_prelude_pch.cache_clear()
    yield directory
    lighter_headers.main_prelude_pch.cache_clear()


def test_main_cpp_gets_its_prelude_precompiled_at_setup(lighter_builds_dir, precompiled_prelude):
    root, directory = lighter_builds_dir
    assert sorted(os.listdir(os.path.join(directory, "kz_main_prelude.h.gch"))) == ["O3.gch", "default.gch"]
    assert lighter_headers.keep_main_prelude_pch(root) == directory, "kept, not made again"
    kwargs, main_lightened = lighter(FULL_INCLUDE + CPP, CUDA, functions=["relu_cuda"])
    assert main_lightened and kwargs["cpp_sources"][0].startswith('#include "kz_main_prelude.h"')
    assert kwargs["cpp_sources"][-2].startswith("#line 2 ") and kwargs["extra_include_paths"] == [directory]
    kwargs, main_lightened = lighter(DEFINITION, CUDA)
    assert not main_lightened and "extra_include_paths" not in kwargs, "main.cpp as written: its own headers"


def test_main_cpp_builds_with_its_prelude_precompiled(precompiled_prelude, recorded_builds):
    load_inline, built, ext_dir = recorded_builds
    module = load_inline("kz_precompiled", cpp_sources="torch::Tensor twice(torch::Tensor x);",
                         cuda_sources=FULL_INCLUDE + KERNEL, functions=["twice"], extra_cflags=["-O3"])
    assert hasattr(module, "twice") and len(built) == 1, built
    assert '#include "kz_main_prelude.h"' in (ext_dir / built[0] / "main.cpp").read_text()


def test_a_kernel_with_its_own_compile_error_is_built_once(recorded_builds):
    load_inline, built, ext_dir = recorded_builds
    broken = KERNEL.replace("auto y =", "int k = my_made_up_constant;\n    auto y =")
    source = FULL_INCLUDE + broken
    line = source.splitlines().index("    int k = my_made_up_constant;") + 1
    # The line number as the build as written would give it (after load_inline's three includes).
    with pytest.raises(RuntimeError, match=rf"cuda\.cu\({line + 3}\): error: identifier \"my_made_up_constant\""):
        load_inline("kz_broken", cpp_sources="torch::Tensor twice(torch::Tensor x);",
                    cuda_sources=source, functions=["twice"])
    assert len(built) == 1, built


def test_lightening_leaves_the_module_globals_as_the_guard_saw_them():
    """The Guard snapshots kz_worker's globals before the candidate is imported and checks them after:
    what load_inline's wrapper computes lazily during the import must not land in one."""
    lighter_headers._aten_op_names.cache_clear()
    lighter_headers._full_header_names.cache_clear()
    before = {module: dict(vars(module)) for module in (lighter_headers, inline_builds)}
    assert lighter(cpp_sources=CPP, cuda_sources=FULL_INCLUDE + CUDA) is not None
    assert lighter_headers.may_need_the_full_header('/ext/x/cuda.cu(3): error: identifier "made_up_name" is undefined\n') is False
    changed = [name for module, names in before.items() for name, value in vars(module).items()
               if names.get(name) is not value]
    assert not changed, changed


def test_the_full_headers_names_indexed_at_setup_are_read_first(tmp_path, monkeypatch):
    # scripts/prepare_lighter_builds.py at setup; the supervisor names the directory (KZ_LIGHTER_BUILDS_DIR).
    setup_dir, extensions = tmp_path / "lighter-builds", tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    path = lighter_headers.keep_full_header_names(str(setup_dir))
    assert os.path.dirname(path) == str(setup_dir) and lighter_headers.keep_full_header_names(str(setup_dir)) == path
    lighter_headers._full_header_names.cache_clear()  # as a worker would start
    monkeypatch.setenv("KZ_LIGHTER_BUILDS_DIR", str(setup_dir))
    monkeypatch.setattr(lighter_headers.subprocess, "run", lambda *args, **kwargs: pytest.fail("computed again"))
    try:
        assert {"Tensor", "PyObject", "cout"} <= lighter_headers._full_header_names()
    finally:
        lighter_headers._full_header_names.cache_clear()
    assert not extensions.exists(), "nothing written beside the builds"


def test_the_full_headers_names_are_kept_for_the_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lighter_headers._full_header_names.cache_clear()
    computed = lighter_headers._full_header_names()
    [kept] = tmp_path.glob("kz_full_header_names_*.txt")
    assert {"Tensor", "PyObject", "cout"} <= computed
    lighter_headers._full_header_names.cache_clear()  # as a new process would start
    monkeypatch.setattr(lighter_headers.subprocess, "run", lambda *args, **kwargs: pytest.fail("computed again"))
    assert lighter_headers._full_header_names() == computed
    lighter_headers._full_header_names.cache_clear()
    kept.write_text("\n".join(kept.read_text().split("\n")[:-5]))  # a cut-off file is not used
    with pytest.raises(pytest.fail.Exception, match="computed again"):
        lighter_headers._full_header_names()
    lighter_headers._full_header_names.cache_clear()
