import os


def set_gpu_arch(arch_list):
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_list)
