// validate_module through the real Python worker (device cpu): a good module is valid with its
// ATen ops and fingerprint; a module that skips a requested API, one that kills its worker, one
// that writes outside its scratch dir and one that hangs are rejected with a reason naming the check.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "kz/curriculum/validation.h"
#include "kz/task/catalogue.h"

namespace kz {
namespace {

std::string module_with_forward(const std::string& forward_body) {
  return R"PY(
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)

    def forward(self, x):
)PY" + forward_body +
         R"PY(

batch = 256
k = 512
n = 256
cpu_sizes = {"batch": 8, "k": 32, "n": 16}


def get_inputs():
    return [torch.randn(batch, k)]


def get_init_inputs():
    return [k, n]
)PY";
}

std::vector<ApiEntry> gelu_and_matmul() {
  auto catalogue = load_api_catalogue(default_api_catalogue_path());
  EXPECT_TRUE(catalogue.ok()) << catalogue.status().to_string();
  if (!catalogue.ok()) return {};
  auto apis = find_apis(*catalogue, {"torch.nn.functional.gelu", "torch.matmul"});
  EXPECT_TRUE(apis.ok());
  return apis.ok() ? *apis : std::vector<ApiEntry>{};
}

ModuleVerdict validate(const std::string& source, ModuleValidationOptions options = {}) {
  auto verdict = validate_module(source, gelu_and_matmul(), options);
  EXPECT_TRUE(verdict.ok()) << verdict.status().to_string();
  return verdict.ok() ? *verdict : ModuleVerdict{};
}

TEST(ValidateModule, GoodModuleIsValid) {
  auto verdict = validate(module_with_forward("        return F.gelu(torch.matmul(x, self.weight))"));
  EXPECT_TRUE(verdict.valid) << verdict.reason;
  EXPECT_EQ(verdict.reason, "valid");
  EXPECT_TRUE(verdict.failed_check.empty());
  for (const char* op : {"gelu", "mm"})
    EXPECT_NE(std::find(verdict.aten_ops.begin(), verdict.aten_ops.end(), op), verdict.aten_ops.end()) << op;
  EXPECT_EQ(verdict.output_shapes, (std::vector<std::vector<int64_t>>{{8, 16}}));
  EXPECT_EQ(verdict.fingerprint.size(), 32u);
  EXPECT_GT(verdict.runtime_ms, 0);
}

// The supervisor's syntax check rejects a module that is not valid Python before any worker starts,
// in the worker's own words.
TEST(ValidateModule, InvalidPythonIsRejectedAsTheWorkerWouldBeforeAnyWorker) {
  std::string source = module_with_forward("        return F.gelu(torch.matmul(x, self.weight)");
  ModuleValidationOptions by_worker;
  by_worker.tuning.syntax_check = false;
  auto expected = validate(source, by_worker);
  EXPECT_EQ(expected.failed_check, "loads") << expected.reason;
  auto started = std::chrono::steady_clock::now();
  auto verdict = validate(source);
  // No worker (~1 ms; a worker's start takes seconds): room for a cold checker on a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5)) << "no worker: ~1 ms";
  EXPECT_FALSE(verdict.valid);
  EXPECT_EQ(verdict.failed_check, "loads");
  EXPECT_EQ(verdict.reason, expected.reason);
  EXPECT_NE(verdict.reason.find("not valid Python"), std::string::npos) << verdict.reason;
}

TEST(ValidateModule, MissingApiIsRejectedAndNamed) {
  auto verdict = validate(module_with_forward("        return F.relu(torch.matmul(x, self.weight))"));
  EXPECT_FALSE(verdict.valid);
  EXPECT_EQ(verdict.failed_check, "apis");
  EXPECT_NE(verdict.reason.find("torch.nn.functional.gelu"), std::string::npos) << verdict.reason;
  EXPECT_TRUE(verdict.fingerprint.empty());
}

TEST(ValidateModule, CrashingModuleIsRejected) {
  auto verdict = validate(module_with_forward("        import os\n        os._exit(3)"));
  EXPECT_FALSE(verdict.valid);
  EXPECT_EQ(verdict.failed_check, "worker_crashed");
  EXPECT_NE(verdict.reason.find("exit code 3"), std::string::npos) << verdict.reason;
}

// The module is model-written code: it runs in the evaluations' sandbox, and what the sandbox
// refuses rejects it, even when the module catches the refusal and returns a correct output.
TEST(ValidateModule, ModuleReachingOutOfTheSandboxIsRejected) {
  auto verdict = validate(module_with_forward(
      "        try:\n"
      "            open('/tmp/kz-proposer-was-here', 'w').write('x')\n"
      "        except PermissionError:\n"
      "            pass\n"
      "        return F.gelu(torch.matmul(x, self.weight))"));
  EXPECT_FALSE(verdict.valid);
  EXPECT_EQ(verdict.failed_check, "sandbox") << verdict.reason;
  EXPECT_NE(verdict.reason.find("/tmp/kz-proposer-was-here"), std::string::npos) << verdict.reason;
  EXPECT_FALSE(std::filesystem::exists("/tmp/kz-proposer-was-here"));
}

// A module that writes its own "valid" result on the worker's message pipe and exits: the message
// lacks the request's token, so the module is rejected (before, an internal error: no verdict).
TEST(ValidateModule, ModuleForgingItsResultIsRejected) {
  auto verdict = validate(module_with_forward(
      "        import json, os\n"
      "        line = json.dumps({'type': 'result', 'valid': True, 'reason': 'valid'}) + '\\n'\n"
      "        for fd in range(3, 4096):\n"
      "            try:\n"
      "                os.write(fd, line.encode())\n"
      "            except OSError:\n"
      "                pass\n"
      "        os._exit(0)"));
  EXPECT_FALSE(verdict.valid) << verdict.reason;
  EXPECT_EQ(verdict.failed_check, "forged_message") << verdict.reason;
}

TEST(ValidateModule, HangingModuleIsKilledAtTheDeadline) {
  ModuleValidationOptions options;
  options.check_s = 3;
  auto verdict = validate(module_with_forward("        import time\n        time.sleep(600)"), options);
  EXPECT_FALSE(verdict.valid);
  EXPECT_EQ(verdict.failed_check, "stage_timeout");
  EXPECT_NE(verdict.reason.find("stage 'build'"), std::string::npos) << verdict.reason;
}

TEST(ValidateModule, InvalidOptionsAreAnError) {
  ModuleValidationOptions options;
  options.time_band_min_ms = 5;
  options.time_band_max_ms = 1;
  auto verdict = validate_module("", {}, options);
  ASSERT_FALSE(verdict.ok());
  EXPECT_EQ(verdict.status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kz
