"""load_inline builds named by their content: samples that call their extension alike do not share
(and fight over) one build directory, identical sources do."""
from kz_worker import formats

CPP = "torch::Tensor relu_cuda(torch::Tensor x);"
CUDA = "__global__ void relu_kernel(const float* x, float* y, long n) {}"


def name(cuda_source, **extra):
    return formats.content_addressed_name("relu_ext", (), {"cpp_sources": CPP, "cuda_sources": cuda_source,
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
    first = formats.content_addressed_name("ext", (CPP, CUDA), {})
    assert first != formats.content_addressed_name("ext", (CPP, CUDA + " "), {})


def test_a_module_bound_under_a_literal_name_keeps_it():
    own_binding = CPP + "\nPYBIND11_MODULE(relu_ext, m) { m.def(\"relu_cuda\", &relu_cuda); }"
    assert formats.content_addressed_name("relu_ext", (own_binding,), {"cuda_sources": CUDA}) == "relu_ext"
    macro_binding = CPP + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"
    assert formats.content_addressed_name("relu_ext", (macro_binding,), {"cuda_sources": CUDA}) != "relu_ext"
