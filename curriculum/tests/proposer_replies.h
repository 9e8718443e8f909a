// Proposer replies shared by the Proposer's tests (propose_test: `kz propose` through the CLI;
// proposer_test: the ProposerPipeline library): a valid level-1 module, the same module with other
// names (a near duplicate), and a reply's fenced code block.
#pragma once

#include <string>

namespace kz::test {

inline const char* kGood = R"PY(import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)

    def forward(self, x):
        return F.gelu(torch.matmul(x, self.weight))


batch = 1024
k = 2048
n = 2048
cpu_sizes = {"batch": 8, "k": 32, "n": 16}


def get_inputs():
    return [torch.randn(batch, k)]


def get_init_inputs():
    return [k, n]
)PY";

inline const char* kGoodRenamed = R"PY(import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d_in, d_out) * 0.1)

    def forward(self, inp):
        # the same computation, other names
        return F.gelu(torch.matmul(inp, self.w))

rows = 1024
d_in = 2048
d_out = 2048
cpu_sizes = {"rows": 8, "d_in": 32, "d_out": 16}

def get_inputs():
    return [torch.randn(rows, d_in)]

def get_init_inputs():
    return [d_in, d_out]
)PY";

inline std::string fenced(const std::string& prose, const std::string& code) {
  return prose + "\n\n```python\n" + code + "```\n";
}

}  // namespace kz::test
