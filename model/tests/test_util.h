// Helpers shared by the libtorch engine's tests (model_test, train_test): the fixtures that
// make_fixtures.py and train_reference.py write, loading and comparing; scratch.h's directories.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/model/transformer.h"
#include "scratch.h"

namespace kz::model::test {

namespace fs = std::filesystem;

// A directory named by an environment variable (CTest sets them); empty when unset.
inline fs::path env_dir(const char* name) {
  const char* dir = std::getenv(name);
  return dir ? fs::path(dir) : fs::path();
}
inline fs::path fixtures() { return env_dir("KZ_MODEL_FIXTURES"); }

inline nlohmann::json read_json(const fs::path& path) {
  auto text = read_file(path);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  return nlohmann::json::parse(text.ok() ? *text : "{}");
}

inline std::shared_ptr<CausalLM> load(const fs::path& dir, LoadOptions options = {}) {
  auto m = CausalLM::load(dir, options);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

// A JSON list of lists of numbers -> an [R, C] tensor of `type`.
inline at::Tensor to_tensor(const nlohmann::json& nested, at::ScalarType type = at::kFloat) {
  std::vector<double> flat;
  for (const auto& row : nested)
    for (const auto& v : row) flat.push_back(v.get<double>());
  return at::tensor(flat, at::kDouble).view({static_cast<int64_t>(nested.size()), -1}).to(type);
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

}  // namespace kz::model::test
