// The static anti-cheating checks (kz/eval/static_checks.h): each rule on a small source, what must
// not fire (comments, docstrings, kernel code, annotations), and no false alarm on any honest
// example of the suite (all three formats) or on a reference evaluated as its own torch candidate.
#include "kz/eval/static_checks.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "test_support.h"

namespace kz {
namespace {

namespace fs = std::filesystem;

const char* kReference = R"(
import torch
import torch.nn as nn

class Helper(nn.Module):
    pass

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
)";

// A triton candidate skeleton with `body` inserted at module level.
std::string candidate(const std::string& body) {
  return "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n" + body +
         "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n";
}

std::vector<Check> checks_of(const std::string& source, Format format = Format::triton) {
  std::vector<Check> checks;
  for (const auto& f : static_checks(source, format, kReference)) checks.push_back(f.check);
  return checks;
}

bool fires(const std::string& body, Check check, Format format = Format::triton) {
  for (Check c : checks_of(candidate(body), format))
    if (c == check) return true;
  return false;
}

std::string describe(const std::string& body) {
  std::string text;
  for (const auto& f : static_checks(candidate(body), Format::triton, kReference))
    text += std::string(check_name(f.check)) + " line " + std::to_string(f.line) + ": " + f.excerpt + "\n";
  return text.empty() ? "(no finding)" : text;
}

TEST(SplitPython, RemovesCommentsAndBlanksStringsKeepingLines) {
  auto text = split_python("x = 1  # threading\ny = 'os.write'\nz = \"\"\"a\nb\"\"\"\nw = f'{os.write}'\n");
  EXPECT_EQ(text.code.find("threading"), std::string::npos);
  EXPECT_EQ(text.code.find("os.write'"), std::string::npos) << "a plain string is blanked";
  EXPECT_NE(text.code.find("{os.write}"), std::string::npos) << "an f-string's expressions are code";
  EXPECT_EQ(std::count(text.code.begin(), text.code.end(), '\n'), 5);
  ASSERT_EQ(text.strings.size(), 3u);
  EXPECT_EQ(text.strings[0].text, "os.write");
  EXPECT_EQ(text.strings[0].line, 2);
  EXPECT_EQ(text.strings[1].text, "a\nb");
  EXPECT_EQ(text.strings[2].line, 5);
}

TEST(SplitPython, HandlesEscapesPrefixesAndUnterminatedStrings) {
  auto text = split_python("a = r'\\'' + b\"x\\\"y\" # c\nd = 'open");
  ASSERT_EQ(text.strings.size(), 3u);
  EXPECT_EQ(text.strings[0].text, "\\'");
  EXPECT_EQ(text.strings[1].text, "x\\\"y");
  EXPECT_EQ(text.strings[2].text, "open");
  EXPECT_NE(text.code.find("+ b"), std::string::npos);
}

TEST(StaticChecks, InheritingTheReferencesClasses) {
  EXPECT_TRUE(fires("class ModelNew2(Model):\n    pass", Check::inherits_reference));
  EXPECT_TRUE(fires("class Fast(nn.Module, Helper):\n    pass", Check::inherits_reference));
  EXPECT_TRUE(fires("class Fast(ref.Model):\n    pass", Check::inherits_reference));
  EXPECT_FALSE(fires("class Fast(nn.Module):\n    pass", Check::inherits_reference));
  EXPECT_FALSE(fires("class Fast(ModelBase, metaclass=Model):\n    pass", Check::inherits_reference));
}

TEST(StaticChecks, Threads) {
  EXPECT_TRUE(fires("import threading", Check::background_thread));
  EXPECT_TRUE(fires("from concurrent.futures import ThreadPoolExecutor", Check::background_thread));
  EXPECT_TRUE(fires("import multiprocessing as mp", Check::background_thread));
  EXPECT_TRUE(fires("import _thread", Check::background_thread));
  EXPECT_TRUE(fires("pid = os.fork()", Check::background_thread));
  EXPECT_TRUE(fires("SRC = '''\n#include <thread>\nvoid f() { std::thread t(g); }\n'''", Check::background_thread));
  EXPECT_FALSE(fires("# threading would be faster\nN = 1", Check::background_thread));
  EXPECT_FALSE(fires("\"\"\"Each thread computes one element; threading is not used.\"\"\"", Check::background_thread));
  EXPECT_FALSE(fires("SRC = 'int i = threadIdx.x;'", Check::background_thread));
}

TEST(StaticChecks, SideStreams) {
  EXPECT_TRUE(fires("s = torch.cuda.Stream()", Check::side_stream));
  EXPECT_TRUE(fires("ctx = torch.cuda.stream(s)", Check::side_stream));
  EXPECT_TRUE(fires("from torch import cuda\ns = cuda.Stream()", Check::side_stream));
  EXPECT_TRUE(fires("SRC = 'cudaStream_t s; cudaStreamCreate(&s);'", Check::side_stream));
  EXPECT_TRUE(fires("SRC = 'auto s = at::cuda::getStreamFromPool();'", Check::side_stream));
  EXPECT_FALSE(fires("SRC = 'k<<<g, b, 0, at::cuda::getCurrentCUDAStream()>>>(x);'", Check::side_stream));
  EXPECT_FALSE(fires("torch.cuda.synchronize()", Check::side_stream));
}

TEST(StaticChecks, TensorSubclassesAndModes) {
  EXPECT_TRUE(fires("class Lazy(torch.Tensor):\n    pass", Check::tensor_subclass));
  EXPECT_TRUE(fires("from torch import Tensor\nclass Lazy(Tensor):\n    pass", Check::tensor_subclass));
  EXPECT_TRUE(fires("class A:\n    def __torch_function__(self, *a):\n        pass", Check::tensor_subclass));
  EXPECT_TRUE(fires("y = x.as_subclass(A)", Check::tensor_subclass));
  EXPECT_TRUE(fires("from torch.overrides import TorchFunctionMode", Check::tensor_subclass));
  EXPECT_TRUE(fires("from torch.utils._python_dispatch import TorchDispatchMode", Check::tensor_subclass));
  EXPECT_FALSE(fires("class Desc(TensorDescriptor):\n    pass", Check::tensor_subclass));
  EXPECT_FALSE(fires("w = nn.Parameter(torch.empty(3))", Check::tensor_subclass));
}

TEST(StaticChecks, HarnessAccess) {
  for (const char* body : {
           "import kz_worker.correctness",
           "kz_worker = None",
           "m = sys.modules['x']",
           "objs = gc.get_objects()",
           "f = inspect.currentframe().f_back",
           "os.write(3, b'{}')",
           "os._exit(0)",
           "fd = open('/proc/self/fd/3', 'w')",
           "import builtins\nbuiltins.len = None",
           "torch.relu = lambda x: x",
           "torch.Tensor.any = lambda *a: False",
           "time.perf_counter = lambda: 0.0",
           "torch.cuda.Event.elapsed_time = lambda a, b: 0.001",
           "E = torch.cuda.Event\nE.elapsed_time = fake",
           "setattr(torch, 'relu', f)",
           "torch.nn.modules.module.register_module_forward_hook(h)",
           "lib = torch.library.Library('aten', 'IMPL')",
           "m = __import__('gc')",
           "exec(code)",
           "signal.signal(signal.SIGALRM, h)",
           "class A:\n    def __del__(self):\n        pass",
           "n = kz_rtc._launches",
           "triton.runtime.jit.JITFunction.run = f",
           "f.__closure__[0].cell_contents = g",
           "f.__kwdefaults__['k'] = 2",
           "SRC = 'PyRun_SimpleString(\"x\");'",
           "SRC = 'write(3, buf, n);'",
       }) {
    EXPECT_TRUE(fires(body, Check::harness_access)) << body << "\n" << describe(body);
  }
  for (const char* body : {
           "def kernel(x_ptr, BLOCK: tl.constexpr = 1024):\n    pass",
           "model = ModelNew().eval()",
           "N = x.shape[0]  # os.write is not used",
           "\"\"\"We never touch sys.modules.\"\"\"",
           "torch.cuda.synchronize()",
           "out = torch.empty_like(x)",
           "arg = ctypes.c_uint32(n)",
           "t0 = time.perf_counter()",
           "if torch.version.cuda == '12.4':\n    pass",
           "def f(*, closure_size=4):\n    return closure_size",
       }) {
    EXPECT_FALSE(fires(body, Check::harness_access)) << body << "\n" << describe(body);
  }
}

TEST(StaticChecks, TorchFormatOnlyChecksHarnessAccess) {
  std::string reference_with_helper = "class Model(Helper):\n    pass\nimport threading\n";
  EXPECT_TRUE(checks_of(reference_with_helper, Format::torch).empty());
  EXPECT_EQ(checks_of("import kz_worker\n", Format::torch), std::vector<Check>{Check::harness_access});
}

TEST(StaticChecks, VerdictNamesEveryCheckOnceWithLines) {
  auto findings = static_checks(candidate("import threading\nimport kz_worker\nimport threading as t2"),
                                Format::triton, kReference);
  ASSERT_EQ(findings.size(), 3u);
  EXPECT_EQ(findings[0].line, 6);
  Verdict v = static_checks_verdict(findings);
  EXPECT_EQ(v.status, EvalStatus::cheat_detected);
  EXPECT_EQ(v.stage, "static_checks");
  EXPECT_EQ(v.checks, (std::vector<Check>{Check::background_thread, Check::harness_access}));
  EXPECT_NE(v.message.find("line 7: harness_access"), std::string::npos) << v.message;
}

// ---- no false alarm on the honest examples ------------------------------------------------------

using test::source_dir;

std::string reference_for(const std::string& task_file) {
  for (const char* level : {"level1", "level2"}) {
    fs::path path = source_dir() / "suite/kzbench" / level / task_file;
    if (fs::exists(path)) return *read_file(path);
  }
  return "";
}

TEST(StaticChecks, NoFindingOnAnyHonestExampleOrReference) {
  if (source_dir().empty()) GTEST_FAIL() << "KZ_SOURCE_DIR is not set (run through ctest)";
  int scanned = 0;
  for (auto [dir, format] : {std::pair{"triton", Format::triton}, std::pair{"cuda-rtc", Format::cuda_rtc},
                             std::pair{"cuda", Format::cuda}}) {
    for (const auto& entry : fs::directory_iterator(source_dir() / "suite/examples" / dir)) {
      std::string reference = reference_for(entry.path().filename().string());
      ASSERT_FALSE(reference.empty()) << entry.path();
      auto findings = static_checks(*read_file(entry.path()), format, reference);
      for (const auto& f : findings)
        ADD_FAILURE() << entry.path() << ":" << f.line << ": " << check_name(f.check) << " " << f.what << " `"
                      << f.excerpt << "`";
      ++scanned;
    }
  }
  for (const char* level : {"level1", "level2"}) {
    for (const auto& entry : fs::directory_iterator(source_dir() / "suite/kzbench" / level)) {
      std::string reference = *read_file(entry.path());
      EXPECT_TRUE(static_checks(reference, Format::torch, reference).empty()) << entry.path();
      ++scanned;
    }
  }
  EXPECT_EQ(scanned, 80);
}

}  // namespace
}  // namespace kz
