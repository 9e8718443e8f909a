// Reference modules shared by the near-duplicate tests (dedup_test) and the frontier's leak tests
// (frontier_test): a gelu-matmul module, the same module with every name changed, other comments,
// a docstring removed and other sizes (a near duplicate), and an unrelated conv-pool module.
#pragma once

namespace kz::test {

inline const char* kGeluMatmul = R"PY(
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul with a weight, then exact GELU."""

    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)

    def forward(self, x):
        y = torch.matmul(x, self.weight)  # (batch, n)
        return F.gelu(y)


batch = 1024
k = 4096
n = 2048
cpu_sizes = {"batch": 8, "k": 32}


def get_inputs():
    return [torch.randn(batch, k)]


def get_init_inputs():
    return [k, n]
)PY";

// The same module with every name changed, other comments, a docstring removed, other sizes.
inline const char* kGeluMatmulRenamed = R"PY(
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, in_dim, out_dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(in_dim, out_dim) * 0.2)
    def forward(self, inp):
        # project, then activate
        hidden = torch.matmul(inp, self.w)
        return F.gelu(hidden)

rows = 512
in_dim = 8192
out_dim = 1024
cpu_sizes = {'rows': 4, 'in_dim': 16}

def get_inputs():
    return [torch.randn(rows, in_dim)]

def get_init_inputs():
    return [in_dim, out_dim]
)PY";

inline const char* kConvPool = R"PY(
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, cout, kernel):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, images, bias):
        z = self.norm(self.conv(images))
        z = torch.relu(z) + bias.view(1, -1, 1, 1)
        z = nn.functional.max_pool2d(z, 2)
        return z.mean(dim=(2, 3)).softmax(dim=-1)


batch_size = 32
cin, cout, kernel = 16, 64, 3
height = width = 128
cpu_sizes = {"batch_size": 2, "height": 12, "width": 12}


def get_inputs():
    return [torch.randn(batch_size, cin, height, width), torch.randn(cout)]


def get_init_inputs():
    return [cin, cout, kernel]
)PY";

}  // namespace kz::test
