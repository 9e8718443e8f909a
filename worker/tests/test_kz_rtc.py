"""kz_rtc: NVRTC compilation (runs on the CPU) and kernel launches (GPU only)."""

import ctypes
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kz_rtc  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GOOD = r"""
#include <cuda_fp16.h>
// extern "C" __global__ void commented_out(float* x)
extern "C" __global__ void __launch_bounds__(256) scale(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
extern "C" {
__device__ float twice(float v) { return 2.f * v; }
__global__ void block_one(const float* __restrict__ x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(x[i]);
}
__global__ void
block_two(half* h) { h[0] = __float2half(1.f); }
}
__global__ void cpp_linkage(float* x) { x[0] = 0.f; }
"""

VADD = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

SCALARS = r"""
extern "C" __global__ void scalars(double* out, int i, long long l, float f, double d, bool flag) {
    out[0] = i; out[1] = (double)l; out[2] = f; out[3] = d; out[4] = flag ? 1.0 : 0.0;
}
"""


@pytest.fixture
def compile_only():
    kz_rtc.set_compile_only(True)
    yield
    kz_rtc.set_compile_only(False)


def test_finds_extern_c_kernels(compile_only):
    mod = kz_rtc.compile(GOOD, name="good")
    assert list(mod.kernels) == ["scale", "block_one", "block_two"]
    assert mod.arch.startswith("sm_") and len(mod.cubin) > 0
    assert mod in kz_rtc.compiled_modules()


def test_syntax_error_raises_compile_error_with_log(compile_only):
    with pytest.raises(kz_rtc.CompileError) as info:
        kz_rtc.compile('extern "C" __global__ void f(float* x) { x[0] = ; }', name="broken")
    message = str(info.value)
    assert "broken" in message
    assert "error: expected an expression" in message


def test_launch_in_compile_only_mode_raises(compile_only):
    mod = kz_rtc.compile(VADD, name="vadd")
    with pytest.raises(kz_rtc.NotRunnable):
        mod.vadd(1, 2, 3, 4, grid=1, block=32)


def test_unknown_kernel_attribute(compile_only):
    mod = kz_rtc.compile(VADD, name="vadd")
    with pytest.raises(AttributeError, match="vadd"):
        mod.no_such_kernel


def test_parameter_kinds_parsed(compile_only):
    mod = kz_rtc.compile(SCALARS, name="scalars")
    assert mod.scalars.kinds == ["pointer", "int", "int", "float", "double", "bool"]


def test_compile_cache_returns_same_module(compile_only):
    a = kz_rtc.compile(VADD, name="vadd")
    assert kz_rtc.compile(VADD, name="vadd") is a
    assert kz_rtc.compile(VADD, name="vadd", options=["-DX=1"]) is not a


def test_compile_seconds_count_nvrtc_runs_and_no_cache_hit(compile_only):
    before = kz_rtc.compile_seconds()
    kz_rtc.compile(VADD, name="vadd", options=["-DKZ_SECONDS_TEST=1"])
    after_compile = kz_rtc.compile_seconds()
    assert after_compile > before
    kz_rtc.compile(VADD, name="vadd", options=["-DKZ_SECONDS_TEST=1"])  # cached: no NVRTC
    assert kz_rtc.compile_seconds() == after_compile
    with pytest.raises(kz_rtc.CompileError):
        kz_rtc.compile("this is not CUDA", name="broken_for_seconds")
    assert kz_rtc.compile_seconds() > after_compile  # a failed compile took NVRTC's time too


def test_bad_grid_rejected_before_launch():
    kz_rtc.set_compile_only(False)
    with pytest.raises(ValueError, match="grid"):
        kz_rtc._dims((1, 2, 3, 4), "grid", "k")
    assert kz_rtc._dims(5, "grid", "k") == (5, 1, 1)
    assert kz_rtc._dims((2, 3), "block", "k") == (2, 3, 1)


@needs_gpu
def test_vector_add_matches_torch():
    mod = kz_rtc.compile(VADD, name="vadd")
    n = 100_003
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    mod.vadd(a, b, c, n, grid=((n + 255) // 256,), block=(256,))
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_compile_only_loads_nothing(compile_only):
    if torch.cuda.is_available():
        torch.cuda.init()  # so that compile-only mode, not an uninitialised CUDA, is what stops the load
    mod = kz_rtc.compile(VADD, name="vadd_unloaded")
    assert mod._loaded == {} and mod.vadd._functions == {}


@needs_gpu
def test_compile_loads_the_module_and_its_kernels_where_cuda_is_initialised():
    """So that a kernel's first launch, inside kz's shared GPU hold, only launches."""
    torch.cuda.init()
    device = torch.cuda.current_device()
    mod = kz_rtc.compile(VADD + "// preloaded", name="vadd_preloaded")
    assert device in mod._loaded and device in mod.vadd._functions
    a = torch.ones(8, device="cuda")
    c = torch.empty_like(a)
    mod.vadd(a, a, c, 8, grid=1, block=8)
    torch.cuda.synchronize()
    assert c.tolist() == [2.0] * 8


@needs_gpu
def test_scalar_conversion_by_parameter_size():
    mod = kz_rtc.compile(SCALARS, name="scalars")
    out = torch.zeros(5, dtype=torch.float64, device="cuda")
    mod.scalars(out, -7, 2**40 + 3, 1.5, 1e-300, True, grid=1, block=1)
    torch.cuda.synchronize()
    assert out.tolist() == [-7.0, float(2**40 + 3), 1.5, 1e-300, 1.0]
    with pytest.raises(OverflowError):
        mod.scalars(out, 2**31, 0, 0.0, 0.0, False, grid=1, block=1)
    with pytest.raises(TypeError, match="argument 1"):
        mod.scalars(out, 1.5, 0, 0.0, 0.0, False, grid=1, block=1)
    mod.scalars(out, ctypes.c_int32(3), 4, 5, 6, False, grid=1, block=1)  # ints for float/double: converted
    torch.cuda.synchronize()
    assert out.tolist() == [3.0, 4.0, 5.0, 6.0, 0.0]


@needs_gpu
def test_wrong_argument_count_and_cpu_tensor():
    mod = kz_rtc.compile(VADD, name="vadd")
    a = torch.zeros(4, device="cuda")
    with pytest.raises(TypeError, match=r"'vadd' takes 4 arguments but 3 were given"):
        mod.vadd(a, a, a, grid=1, block=4)
    with pytest.raises(TypeError, match="CUDA tensor"):
        mod.vadd(a, torch.zeros(4), a, 4, grid=1, block=4)


@needs_gpu
def test_launch_count_increments_and_stream():
    mod = kz_rtc.compile(VADD, name="vadd")
    a = torch.ones(8, device="cuda")
    c = torch.empty_like(a)
    before = kz_rtc.launch_count()
    mod.vadd(a, a, c, 8, grid=1, block=8)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mod.vadd(a, c, c, 8, grid=1, block=8)
    stream.synchronize()
    assert kz_rtc.launch_count() == before + 2
    assert c.tolist() == [3.0] * 8


@needs_gpu
def test_launch_error_names_kernel():
    mod = kz_rtc.compile(VADD, name="vadd")
    a = torch.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match=r"cuLaunchKernel failed \(kernel 'vadd'\): CUDA_ERROR_INVALID_VALUE"):
        mod.vadd(a, a, a, 4, grid=1, block=4096)


@needs_gpu
def test_default_stream_is_torchs_current_stream():
    device = torch.cuda.current_device()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        assert kz_rtc._stream_handle(None, device) == stream.cuda_stream
    assert kz_rtc._stream_handle(None, device) == torch.cuda.current_stream().cuda_stream
    assert kz_rtc._stream_handle(stream, device) == stream.cuda_stream
