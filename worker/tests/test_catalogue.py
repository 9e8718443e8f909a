"""The PyTorch API catalogue (task/data/api_catalogue.toml) against the installed torch.

Every `aten` name must be a real ATen operator (torch.ops.aten.<name>), or the validator's
"executes the requested APIs" check could never pass for that API. A sample of APIs is also
traced with the validator's own recorder, so the "any of" lists match what PyTorch really runs.
"""
import pathlib
import tomllib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kz_worker.validate import OpRecorder

CATALOGUE = pathlib.Path(__file__).resolve().parents[2] / "task" / "data" / "api_catalogue.toml"


def entries():
    with open(CATALOGUE, "rb") as f:
        return tomllib.load(f)["api"]


def test_catalogue_shape():
    apis = entries()
    assert len(apis) >= 150
    names = [api["name"] for api in apis]
    assert len(names) == len(set(names))
    for api in apis:
        assert api["category"], api
        assert api["aten"] and all(isinstance(a, str) for a in api["aten"]), api


def test_every_aten_name_exists_in_torch():
    missing = [(api["name"], a) for api in entries() for a in api["aten"]
               if "::" in a or "." in a or not hasattr(torch.ops.aten, a)]
    assert not missing, f"not torch.ops.aten ops in torch {torch.__version__}: {missing}"


x, w = torch.randn(4, 16), torch.randn(16, 16)
img = torch.randn(2, 3, 8, 8)
SAMPLES = {
    "torch.nn.functional.gelu": lambda: F.gelu(x),
    "torch.matmul": lambda: torch.matmul(x, w),
    "torch.nn.functional.linear": lambda: F.linear(x, w, torch.randn(16)),
    "torch.nn.Linear": lambda: nn.Linear(16, 8)(x),
    "torch.nn.Conv2d": lambda: nn.Conv2d(3, 4, 3)(img),
    "torch.nn.functional.layer_norm": lambda: F.layer_norm(x, (16,)),
    "torch.nn.BatchNorm2d": lambda: nn.BatchNorm2d(3).eval()(img),
    "torch.softmax": lambda: torch.softmax(x, -1),
    "torch.nn.functional.max_pool2d": lambda: F.max_pool2d(img, 2),
    "torch.nn.functional.adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(img, 1),
    "torch.sum": lambda: torch.sum(x, 1),
    "torch.einsum": lambda: torch.einsum("ij,jk->ik", x, w),
    "torch.nn.functional.scaled_dot_product_attention":
        lambda: F.scaled_dot_product_attention(*(torch.randn(2, 2, 16, 8) for _ in range(3))),
    "torch.nn.functional.cross_entropy": lambda: F.cross_entropy(x, torch.randint(0, 16, (4,))),
    "torch.cumsum": lambda: torch.cumsum(x, 1),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_api_executes_one_of_its_aten_ops(name):
    aten = {api["name"]: api["aten"] for api in entries()}[name]
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        SAMPLES[name]()
    assert set(aten) & set(recorder.ops), f"{name}: traced {sorted(set(recorder.ops))}, catalogue {aten}"
