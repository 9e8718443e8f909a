// Format detection from candidate source text.
#include <gtest/gtest.h>

#include "kz/eval/evaluator.h"
#include "kz/eval/format.h"

namespace kz {
namespace {

TEST(Format, DetectsEachFormat) {
  EXPECT_EQ(detect_format("import triton\n@triton.jit\ndef k(x): pass\nclass ModelNew: pass"), Format::triton);
  EXPECT_EQ(detect_format("from torch.utils.cpp_extension import load_inline\nm = load_inline(name='x')"),
            Format::cuda);
  EXPECT_EQ(detect_format("import torch\nimport kz_rtc\nSRC = '...'\n"), Format::cuda_rtc);
  EXPECT_EQ(detect_format("from kz_rtc import compile\n"), Format::cuda_rtc);
}

TEST(Format, PlainTorchIsNotDetected) {
  EXPECT_FALSE(detect_format("import torch\nclass ModelNew(torch.nn.Module):\n  def forward(self, x): return x\n"));
  EXPECT_FALSE(detect_format(""));
}

TEST(Format, ExplicitFormatWinsOverDetection) {
  EXPECT_EQ(resolve_format("torch", "@triton.jit"), Format::torch);
  EXPECT_EQ(resolve_format("auto", "@triton.jit"), Format::triton);
  EXPECT_FALSE(resolve_format("fortran", "@triton.jit"));
  EXPECT_EQ(parse_format(format_name(Format::cuda_rtc)), Format::cuda_rtc);
}

}  // namespace
}  // namespace kz
