// Near-duplicate detection: renamed-variable copies (with other comments, docstrings and sizes)
// are duplicates; different modules are not; an equal validation fingerprint is a duplicate.
#include <gtest/gtest.h>

#include "kz/curriculum/dedup.h"

namespace kz {
namespace {

const char* kGeluMatmul = R"PY(
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
const char* kGeluMatmulRenamed = R"PY(
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

const char* kConvPool = R"PY(
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

TEST(Normalize, RenamesAuthorNamesKeepsApisDropsCommentsAndDocstrings) {
  auto a = normalize_source_tokens("x = F.gelu(y)  # act\n\"\"\"doc\"\"\"\n");
  auto b = normalize_source_tokens("out = F.gelu(inp)\n");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (std::vector<std::string>{"v0", "=", "F", ".", "gelu", "(", "v1", ")"}));
  auto methods = normalize_source_tokens("total = self.scale * x.sum(dim=1) + 1e-6");
  EXPECT_EQ(methods, (std::vector<std::string>{"v0", "=", "self", ".", "v1", "*", "v2", ".", "sum", "(", "v3", "=",
                                               "N", ")", "+", "N"}));
  auto strings = normalize_source_tokens("s = 'a#b' + r\"c\"");
  EXPECT_EQ(strings, (std::vector<std::string>{"v0", "=", "S", "+", "S"}));
}

TEST(Shingles, JaccardOfSets) {
  std::vector<std::string> tokens{"a", "b", "c", "d", "e", "f"};
  EXPECT_EQ(shingles(tokens).size(), 2u);
  EXPECT_EQ(shingles({"a", "b"}).size(), 1u);  // shorter than n: one shingle
  EXPECT_DOUBLE_EQ(jaccard(shingles(tokens), shingles(tokens)), 1.0);
  EXPECT_DOUBLE_EQ(jaccard({1, 2, 3}, {2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(jaccard({}, {}), 1.0);
}

TEST(NearDuplicateIndex, RenamedCopyIsADuplicate) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-gelu");
  auto match = index.match(kGeluMatmulRenamed, "fp-other");
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->id, "m1");
  EXPECT_FALSE(match->same_fingerprint);
  EXPECT_GE(match->similarity, 0.8);
  EXPECT_EQ(index.find_duplicate(kGeluMatmulRenamed, ""), std::optional<std::string>("m1"));
}

TEST(NearDuplicateIndex, DifferentModulesAreNot) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-gelu");
  EXPECT_FALSE(index.find_duplicate(kConvPool, "fp-conv").has_value());
  index.add("m2", kConvPool, "fp-conv");
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.find_duplicate(kConvPool, "fp-new"), std::optional<std::string>("m2"));
}

TEST(NearDuplicateIndex, EqualFingerprintIsADuplicateEmptyIsNot) {
  NearDuplicateIndex index(0.8);
  index.add("m1", kGeluMatmul, "fp-same");
  auto match = index.match(kConvPool, "fp-same");
  ASSERT_TRUE(match.has_value());
  EXPECT_TRUE(match->same_fingerprint);
  EXPECT_EQ(match->id, "m1");
  NearDuplicateIndex no_fingerprints(0.8);
  no_fingerprints.add("m1", kGeluMatmul, "");
  EXPECT_FALSE(no_fingerprints.find_duplicate(kConvPool, "").has_value());
}

}  // namespace
}  // namespace kz
