"""Loads a reference module (KernelBench format) and a candidate from source text.

Both are written to files in the scratch directory and imported from there, because Triton's
@triton.jit reads a kernel's source with inspect, and tracebacks should show real line numbers.
"""
import importlib.util
import pathlib
import sys
import types

import torch

from . import syntax_check
from . import verdict as v


def import_source(source: str, path: pathlib.Path, module_name: str) -> types.ModuleType:
    path.write_text(source)
    return import_path(path, module_name)


def import_path(path: pathlib.Path, module_name: str) -> types.ModuleType:
    """Imports the file at `path` as `module_name` (registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class Reference:
    """A loaded reference: its module, sizes applied, and the pieces the protocol needs."""

    def __init__(self, module: types.ModuleType, sizes: dict):
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise v.Failure(v.INFRA_ERROR, f"reference module defines no `{name}`", [v.REFERENCE_FAILED])
        self.module = module
        self.sizes = sizes
        for name, value in sizes.items():
            setattr(module, name, value)  # get_inputs() reads these globals at call time

    def init_inputs(self):
        return list(self.module.get_init_inputs())

    def inputs(self, seed: int, device: torch.device):
        torch.random.manual_seed(seed)
        # get_inputs' factory calls (torch.randn, ...) allocate on the device itself: on a GPU that
        # spares generating every input set on the CPU and copying it over, the costliest part of
        # load_reference when several workers share the host's cores. Tensors it builds otherwise
        # (from numpy, say) are moved as before.
        with torch.device(device):
            made = self.module.get_inputs()
        return [to_device(x, device) for x in made]

    def build(self, init_inputs, seed: int, device: torch.device) -> torch.nn.Module:
        torch.random.manual_seed(seed)
        return self.module.Model(*clone_all(init_inputs)).to(device).eval()


def load_reference(source: str, scratch: pathlib.Path, use_cpu_sizes: bool, overrides: dict) -> Reference:
    try:
        module = import_source(source, scratch / "reference.py", "kz_reference")
    except Exception as exc:
        raise v.Failure(v.INFRA_ERROR, "reference module failed to import:\n" + v.describe_exception(exc),
                        [v.REFERENCE_FAILED])
    sizes = dict(getattr(module, "cpu_sizes", {}) or {}) if use_cpu_sizes else {}
    sizes.update(overrides)
    unknown = [name for name in sizes if not hasattr(module, name)]
    if unknown:
        raise v.Failure(v.INFRA_ERROR, f"size override names no module-level constant: {unknown}",
                        [v.REFERENCE_FAILED])
    return Reference(module, sizes)


def load_candidate(source: str, scratch: pathlib.Path, model_class: str) -> type:
    """Imports the candidate; returns its model class. Import runs load_inline for `cuda`."""
    error = syntax_check.syntax_error(source, "candidate.py")  # as the supervisor's check before any worker
    if error is not None:
        raise v.Failure(v.COMPILE_ERROR, f"candidate is not valid Python: {error}", [v.PYTHON_SYNTAX])
    module = import_source(source, scratch / "candidate.py", "kz_candidate")
    cls = getattr(module, model_class, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise v.Failure(v.FORMAT_ERROR, f"candidate defines no nn.Module subclass `{model_class}`", [v.NO_MODEL_NEW])
    return cls


def to_device(x, device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def clone_all(values):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in values]


def share_weights(reference: torch.nn.Module, candidate: torch.nn.Module) -> int:
    """Copies every reference parameter/buffer whose name and shape the candidate shares.

    Both models are also built from the same seed, so a candidate that names its parameters
    differently still starts from the same values when it creates them in the same order."""
    ref_state = reference.state_dict()
    copied = 0
    with torch.no_grad():
        for name, tensor in candidate.state_dict().items():
            source = ref_state.get(name)
            if source is not None and source.shape == tensor.shape:
                tensor.copy_(source)
                copied += 1
    return copied
