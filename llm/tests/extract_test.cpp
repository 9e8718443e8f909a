// extract_code: the shapes model replies really take (reasoning, several blocks, odd fences,
// truncation, Windows line endings, no Markdown at all).
#include <gtest/gtest.h>

#include "kz/llm/extract.h"

namespace kz {
namespace {

ExtractOptions first() {
  ExtractOptions o;
  o.choice = BlockChoice::first;
  return o;
}

TEST(Extract, SinglePythonBlock) {
  auto code = extract_code("Here you go:\n```python\nimport torch\nx = 1\n```\nDone.");
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, "import torch\nx = 1\n");
}

TEST(Extract, EmptyReplyIsNoCode) { EXPECT_FALSE(extract_code("")); }

TEST(Extract, ProseWithoutCodeIsNoCode) {
  EXPECT_FALSE(extract_code("I cannot write this kernel, sorry. The operator is not supported."));
}

TEST(Extract, LastBlockByDefaultFirstOnRequest) {
  std::string reply = "Sketch:\n```python\nv1 = 1\n```\nBetter:\n```python\nv2 = 2\n```\n";
  EXPECT_EQ(*extract_code(reply), "v2 = 2\n");
  EXPECT_EQ(*extract_code(reply, first()), "v1 = 1\n");
}

TEST(Extract, UntaggedBlockCounts) {
  EXPECT_EQ(*extract_code("```\nclass ModelNew: pass\n```"), "class ModelNew: pass\n");
}

TEST(Extract, LanguageTagVariants) {
  for (std::string tag : {"python", "py", "Python3", "PYTHON", " python ", "python {.numberLines}"}) {
    std::string reply = "```cpp\nint x;\n```\n```" + tag + "\nx = 1\n```\n```cuda\n__global__ void k() {}\n```\n";
    auto code = extract_code(reply);
    ASSERT_TRUE(code) << tag;
    EXPECT_EQ(*code, "x = 1\n") << "tag: '" << tag << "'";
  }
}

TEST(Extract, PythonPreferredOverCudaAndCpp) {
  std::string reply = "```python\nmodel = 1\n```\n```cpp\nint helper();\n```\n";
  EXPECT_EQ(*extract_code(reply), "model = 1\n");  // the last block is cpp, but a python one exists
  ExtractOptions any;
  any.prefer_python = false;
  EXPECT_EQ(*extract_code(reply, any), "int helper();\n");
}

TEST(Extract, OnlyNonPythonBlocksStillYieldCode) {
  std::string reply = "```cuda\n__global__ void a() {}\n```\n```c++\nint b();\n```\n";
  EXPECT_EQ(*extract_code(reply), "int b();\n");
  EXPECT_EQ(*extract_code(reply, first()), "__global__ void a() {}\n");
}

TEST(Extract, CodeInsideThinkIsSkipped) {
  std::string reply =
      "<think>\nLet me try:\n```python\nwrong = True\n```\nHmm, no.\n</think>\nFinal:\n```python\nright = True\n```\n";
  EXPECT_EQ(*extract_code(reply), "right = True\n");
  EXPECT_EQ(*extract_code(reply, first()), "right = True\n");
  ExtractOptions keep;
  keep.skip_reasoning = false;
  keep.choice = BlockChoice::first;
  EXPECT_EQ(*extract_code(reply, keep), "wrong = True\n");
}

TEST(Extract, OnlyCodeInsideThinkIsNoCode) {
  EXPECT_FALSE(extract_code("<think>\n```python\nsketch = 1\n```\n</think>\nI give up."));
}

TEST(Extract, UnclosedThinkHidesTheRest) {
  // Truncated while still reasoning: the sketch is not an answer.
  EXPECT_FALSE(extract_code("<think>\nPlan:\n```python\nsketch = 1\n```\nand then"));
}

TEST(Extract, ReplyStartingInsideReasoning) {
  // Chat templates that open <think> in the prompt: the reply holds only the closing tag.
  std::string reply = "plan...\n```python\nsketch = 1\n```\n</think>\n```python\nanswer = 2\n```\n";
  EXPECT_EQ(*extract_code(reply, first()), "answer = 2\n");
}

TEST(Extract, NestedThinkOpenedTwice) {
  // The first <think> is only closed together with the second: code after that </think> counts.
  std::string reply = "<think>a <think> b\n```python\nno = 1\n```\n</think>\n```python\nyes = 1\n```\n";
  EXPECT_EQ(*extract_code(reply, first()), "yes = 1\n");
}

TEST(Extract, TildeFences) {
  EXPECT_EQ(*extract_code("~~~python\nx = 1\n~~~\n"), "x = 1\n");
  // A backtick line does not close a tilde fence.
  EXPECT_EQ(*extract_code("~~~\na = 1\n```\nb = 2\n~~~\n"), "a = 1\n```\nb = 2\n");
}

TEST(Extract, UnclosedFenceRunsToTheEnd) {
  EXPECT_EQ(*extract_code("Answer:\n```python\nimport torch\nclass ModelNew:\n    pass"),
            "import torch\nclass ModelNew:\n    pass\n");
}

TEST(Extract, BackticksInsidePythonStringDoNotClose) {
  std::string reply = "```python\nFENCE = \"```\"\ndoc = '''\n    ```\n'''\nx = 1\n```\n";
  EXPECT_EQ(*extract_code(reply), "FENCE = \"```\"\ndoc = '''\n    ```\n'''\nx = 1\n");
}

TEST(Extract, FourBacktickFenceHoldsTripleBacktickLines) {
  std::string reply = "````python\nTEXT = '''\n```\ninner\n```\n'''\n````\n";
  EXPECT_EQ(*extract_code(reply), "TEXT = '''\n```\ninner\n```\n'''\n");
}

TEST(Extract, ShorterFenceDoesNotCloseLongerOne) {
  EXPECT_EQ(*extract_code("`````\na\n````\nb\n`````"), "a\n````\nb\n");
}

TEST(Extract, ClosingFenceWithTextIsContent) {
  EXPECT_EQ(*extract_code("```python\na = 1\n``` not a fence\nb = 2\n```\n"), "a = 1\n``` not a fence\nb = 2\n");
}

TEST(Extract, CrlfLineEndings) {
  auto code = extract_code("Code:\r\n```python\r\nimport torch\r\nx = 1\r\n```\r\n");
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, "import torch\nx = 1\n");
}

TEST(Extract, IndentedFenceIsDedented) {
  std::string reply = "1. Write this:\n   ```python\n   def f():\n       return 1\n   ```\n";
  EXPECT_EQ(*extract_code(reply), "def f():\n    return 1\n");
}

TEST(Extract, FourSpaceIndentIsNotAFence) {
  EXPECT_FALSE(extract_code("Look:\n    ```python\n    x = 1\n    ```\n"));
}

TEST(Extract, InlineTripleBackticksAreNotAFence) {
  EXPECT_FALSE(extract_code("Use ```x``` for code. Nothing else here."));
}

TEST(Extract, EmptyBlockIsNotCode) {
  EXPECT_EQ(*extract_code("```python\nx = 1\n```\n```python\n\n```\n"), "x = 1\n");
  EXPECT_FALSE(extract_code("```\n```"));
}

TEST(Extract, BareCodeWithoutFences) {
  std::string source = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    pass\n";
  EXPECT_EQ(*extract_code(source), source);
  EXPECT_EQ(*extract_code("\n\nfrom torch import nn\nx = 1\n\n"), "from torch import nn\nx = 1\n");
  EXPECT_EQ(*extract_code("<think>hmm</think>\nimport torch\n"), "import torch\n");
  EXPECT_EQ(*extract_code("Sure.\nclass ModelNew(nn.Module):\n    pass"), "Sure.\nclass ModelNew(nn.Module):\n    pass\n");
}

TEST(Extract, BareCodeInsideReasoningDoesNotCount) {
  EXPECT_FALSE(extract_code("<think>\nimport torch\nclass ModelNew: pass\n</think>\nNo answer."));
}

}  // namespace
}  // namespace kz
