// The GPU lock files the supervisor makes for its workers (kz/eval/sandbox.h): named as
// worker/kz_worker/gpu_lock.py names them, made once, never truncated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kz/core/files.h"
#include "kz/eval/sandbox.h"

namespace kz {
namespace {
namespace fs = std::filesystem;

TEST(GpuLockFilesTest, NamedByUuidWithoutNvidiaSmisPrefix) {
  // The same cases as worker/tests/test_gpu_lock.py: both sides must agree on every name.
  EXPECT_EQ(gpu_lock_file_stem("GPU-1cf2d1e7-ec4d-4df4-9a10-0c9e"), "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e");
  EXPECT_EQ(gpu_lock_file_stem("1cf2d1e7-ec4d-4df4-9a10-0c9e"), "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e");
  EXPECT_EQ(gpu_lock_file_stem("index0/x"), "gpu-index0_x");
}

TEST(GpuLockFilesTest, MakesBothFilesOfEachGpuAndKeepsExistingOnes) {
  fs::path dir = fs::temp_directory_path() / ("kz_gpu_locks_test_" + std::to_string(::getpid())) / "locks";
  fs::remove_all(dir.parent_path());
  ASSERT_TRUE(make_gpu_lock_files(dir, {"GPU-aaaa"}).is_ok());
  ASSERT_TRUE(write_file_atomic(dir / "gpu-aaaa.lock", "in use").is_ok());
  ASSERT_TRUE(make_gpu_lock_files(dir, {"GPU-aaaa", "GPU-bbbb"}).is_ok());
  for (const char* name : {"gpu-aaaa.lock", "gpu-aaaa.turnstile", "gpu-bbbb.lock", "gpu-bbbb.turnstile"})
    EXPECT_TRUE(fs::is_regular_file(dir / name)) << name;
  auto kept = read_file(dir / "gpu-aaaa.lock");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "in use");
  fs::remove_all(dir.parent_path());
}

TEST(GpuLockFilesTest, AnUnmakeableDirIsAnErrorNamingIt) {
  fs::path file = fs::temp_directory_path() / ("kz_gpu_locks_file_" + std::to_string(::getpid()));
  ASSERT_TRUE(write_file_atomic(file, "").is_ok());
  Status made = make_gpu_lock_files(file / "locks", {"GPU-aaaa"});
  EXPECT_FALSE(made.is_ok());
  EXPECT_NE(made.message().find((file / "locks").string()), std::string::npos) << made.to_string();
  fs::remove(file);
}

}  // namespace
}  // namespace kz
