import os
import time

import torch


class KernelExecResult:
    def __init__(self, compiled=False, correctness=False, metadata=None, runtime=-1.0, ref_runtime=-1.0):
        self.compiled, self.correctness, self.metadata = compiled, correctness, metadata or {}
        self.runtime, self.ref_runtime = runtime, ref_runtime
        self.runtime_stats = {"mean": runtime} if runtime > 0 else {}


def get_torch_dtype_from_string(name):
    return {"fp32": torch.float32}[name]


def load_original_model_and_inputs(source, context):
    exec(source, context)
    return context.get("Model"), context.get("get_init_inputs"), context.get("get_inputs")


def build_compile_cache(custom_model_src, verbose=False, build_dir=None):
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "built"), "w") as f:
        f.write(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    if "kz_variant_undefined_symbol" in custom_model_src:
        return False, "", "error: identifier undefined"
    return True, "", None


def eval_kernel_against_ref(original_model_src, custom_model_src, build_dir=None, **settings):
    assert settings["num_correct_trials"] == 5 and settings["num_perf_trials"] == 100
    assert os.path.exists(os.path.join(build_dir, "built")), "evaluated before its pre-build"
    if "FAKE_HANG" in custom_model_src:
        time.sleep(600)
    if "kz_variant_undefined_symbol" in custom_model_src or "class ModelNew(:" in custom_model_src:
        return KernelExecResult(compiled=False, metadata={"compilation_error": "failed"})
    if "_kz_variant_failed_launch" in custom_model_src:
        return KernelExecResult(compiled=True, metadata={"runtime_error": "kernel launch failed"})
    if "_kz_variant_off_by_one" in custom_model_src or "_kz_variant_extra_dim" in custom_model_src:
        return KernelExecResult(compiled=True, metadata={"correctness_issue": "Output mismatch"})
    return KernelExecResult(compiled=True, correctness=True, runtime=0.1, ref_runtime=0.12)
