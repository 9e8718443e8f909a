// Shared by the evaluation service tests: a service on loopback with a private verdict cache, and
// tiny torch-format sources that evaluate in a couple of seconds on the CPU.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "kz/core/files.h"
#include "kz/eval/service.h"
#include "kz/eval/service_client.h"

namespace kz::test {

// An 8-element elementwise reference: the cheapest module the worker can evaluate.
inline const std::string kTinyReference = R"(import torch
import torch.nn as nn

N = 8


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
)";

// A correct torch-format candidate; `variant` only changes a comment, so each variant is a
// distinct source (a distinct cache key) with the same verdict.
inline std::string correct_candidate(int variant = 0) {
  return "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
         "        return torch.add(x * 2.0, 1.0)  # variant " + std::to_string(variant) + "\n";
}

inline const std::string kWrongCandidate =
    "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 3.0\n";

// Sleeps in forward for ten minutes: a worker that runs until killed or timed out.
inline const std::string kSleeperCandidate =
    "import time\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
    "        time.sleep(600)\n        return x\n";

inline const std::string kRaisingCandidate =
    "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
    "        raise RuntimeError('kz-test: deliberate failure')\n";

inline ServiceItem item(nlohmann::json id, const std::string& candidate) {
  return ServiceItem{std::move(id), kTinyReference, candidate, "torch", "", ""};
}

// A service on 127.0.0.1 (any free port), torch format, one trial, its own cache file.
class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(std::filesystem::temp_directory_path(), "kz-service-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
  }
  void TearDown() override {
    if (service_) service_->stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // `adjust` may change the evaluation options, and `adjust_service` the service's, before it starts.
  void start(int workers = 2, const std::function<void(EvalOptions&)>& adjust = {},
             const std::function<void(ServiceOptions&)>& adjust_service = {}) {
    EvalOptions eval;
    eval.format = "torch";
    eval.trials = 1;
    eval.cache.path = dir_ / "verdicts.sqlite";
    if (adjust) adjust(eval);
    ServiceOptions options;
    options.workers = workers;
    if (adjust_service) adjust_service(options);
    auto service = EvalService::start(eval, options);
    ASSERT_TRUE(service.ok()) << service.status().to_string();
    service_ = std::move(*service);
  }

  ServiceClient client() const { return ServiceClient("127.0.0.1", service_->port()); }

  std::filesystem::path dir_;
  std::unique_ptr<EvalService> service_;
};

}  // namespace kz::test
