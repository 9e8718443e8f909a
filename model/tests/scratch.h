// Scratch directories for the model tests (torch-free, so model_io_test can use them too).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace kz::model::test {

namespace fs = std::filesystem;

// Scratch checkpoints of one test process, removed when it ends.
inline fs::path scratch_root() { return fs::temp_directory_path() / ("kz_model_tests_" + std::to_string(::getpid())); }

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(scratch_root()); }
};
inline const auto* const kScratchCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

// An empty directory `name` under scratch_root().
inline fs::path scratch_dir(const std::string& name) {
  fs::path dir = scratch_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace kz::model::test
