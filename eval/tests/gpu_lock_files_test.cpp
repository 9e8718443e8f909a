// The GPU lock files the supervisor makes for its workers (kz/eval/sandbox.h): named as
// worker/kz_worker/gpu_lock.py and gpu_memory.py name them, made once, never truncated.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/eval/cache.h"
#include "kz/eval/sandbox.h"

namespace kz {
namespace {
namespace fs = std::filesystem;

TEST(GpuLockFilesTest, NamedByUuidWithoutNvidiaSmisPrefix) {
  // The same cases as worker/tests/test_gpu_lock.py: both sides must agree on every name.
  EXPECT_EQ(gpu_lock_file_stem("GPU-1cf2d1e7-ec4d-4df4-9a10-0c9e"), "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e");
  EXPECT_EQ(gpu_lock_file_stem("1cf2d1e7-ec4d-4df4-9a10-0c9e"), "gpu-1cf2d1e7-ec4d-4df4-9a10-0c9e");
  EXPECT_EQ(gpu_lock_file_stem("MIG-5f3c0a4e-aa"), "gpu-5f3c0a4e-aa");
  EXPECT_EQ(gpu_lock_file_stem("index0/x"), "gpu-index0_x");
}

TEST(GpuLockFilesTest, UuidsOfGpusAndMigInstancesFromNvidiaSmiList) {
  EXPECT_EQ(uuids_in_device_list({"GPU 0: NVIDIA H200 (UUID: GPU-7a539482-5e14-49d3)",
                                  "  MIG 1g.18gb     Device  0: (UUID: MIG-5f3c0a4e-aa)",
                                  "No devices were found"}),
            (std::vector<std::string>{"GPU-7a539482-5e14-49d3", "MIG-5f3c0a4e-aa"}));
}

TEST(GpuLockFilesTest, UuidsFromTheDriversProcFiles) {
  fs::path gpus = fs::temp_directory_path() / ("kz_gpu_info_test_" + std::to_string(::getpid()));
  fs::remove_all(gpus);
  for (const char* bus : {"0000:1a:00.0", "0000:0a:00.0"}) fs::create_directories(gpus / bus);
  ASSERT_TRUE(write_file_atomic(gpus / "0000:1a:00.0" / "information",
                                "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-bbbb\nBus Location: \t 0000:1a:00.0\n")
                  .is_ok());
  ASSERT_TRUE(write_file_atomic(gpus / "0000:0a:00.0" / "information", "GPU UUID: \t GPU-aaaa\n").is_ok());
  EXPECT_EQ(uuids_in_driver_info(gpus), (std::vector<std::string>{"GPU-aaaa", "GPU-bbbb"}));
  EXPECT_TRUE(uuids_in_driver_info(gpus / "absent").empty());
  EXPECT_EQ(fields_in_driver_info(gpus, "Model"), (std::vector<std::string>{"NVIDIA H200"})) << "the whole name";
  fs::remove_all(gpus);
}

// Every file of one GPU: the timing lock's two (gpu_lock.py) and the memory reservation's turnstile
// and kGpuMemorySlots slots (gpu_memory.py), named as the workers open them.
std::vector<std::string> lock_file_names(const std::string& stem) {
  std::vector<std::string> names = {stem + ".lock", stem + ".turnstile", stem + ".memory-turnstile"};
  for (int slot = 0; slot < kGpuMemorySlots; ++slot) names.push_back(stem + ".memory-slot-" + std::to_string(slot));
  return names;
}

TEST(GpuLockFilesTest, MakesEveryFileOfEachGpuAndKeepsExistingOnes) {
  fs::path dir = fs::temp_directory_path() / ("kz_gpu_locks_test_" + std::to_string(::getpid())) / "locks";
  fs::remove_all(dir.parent_path());
  ASSERT_TRUE(make_gpu_lock_files(dir, {"GPU-aaaa"}).is_ok());
  ASSERT_TRUE(write_file_atomic(dir / "gpu-aaaa.lock", "in use").is_ok());
  ASSERT_TRUE(write_file_atomic(dir / "gpu-aaaa.memory-slot-3", "held").is_ok());
  ASSERT_TRUE(make_gpu_lock_files(dir, {"GPU-aaaa", "GPU-bbbb"}).is_ok());
  for (const char* stem : {"gpu-aaaa", "gpu-bbbb"})
    for (const std::string& name : lock_file_names(stem)) EXPECT_TRUE(fs::is_regular_file(dir / name)) << name;
  EXPECT_EQ(kGpuMemorySlots, 16) << "worker/kz_worker/gpu_memory.py's SLOTS";
  EXPECT_FALSE(fs::exists(dir / ("gpu-aaaa.memory-slot-" + std::to_string(kGpuMemorySlots)))) << "no slot beyond them";
  size_t files = std::distance(fs::directory_iterator(dir), fs::directory_iterator());
  EXPECT_EQ(files, 2 * lock_file_names("gpu-aaaa").size()) << "nothing else in the lock dir";
  for (const auto& [name, text] : {std::pair{"gpu-aaaa.lock", "in use"}, std::pair{"gpu-aaaa.memory-slot-3", "held"}}) {
    auto kept = read_file(dir / name);
    ASSERT_TRUE(kept.ok()) << name;
    EXPECT_EQ(*kept, text) << name << " was truncated";
  }
  fs::remove_all(dir.parent_path());
}

// Left by a candidate while the directory was writable to workers: a symlink (the lock would follow
// it to a file candidates can unlink) and a FIFO (an open would block). Both become regular files.
TEST(GpuLockFilesTest, ASymlinkOrFifoInALockFilesPlaceIsReplaced) {
  fs::path root = fs::temp_directory_path() / ("kz_gpu_locks_planted_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::path dir = root / "locks";
  fs::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(root / "elsewhere", "theirs").is_ok());
  fs::create_symlink(root / "elsewhere", dir / "gpu-aaaa.lock");
  fs::create_symlink(root / "elsewhere", dir / "gpu-aaaa.memory-slot-0");
  ASSERT_EQ(::mkfifo((dir / "gpu-aaaa.turnstile").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((dir / "gpu-aaaa.memory-turnstile").c_str(), 0644), 0);
  ASSERT_TRUE(make_gpu_lock_files(dir, {"GPU-aaaa"}).is_ok());
  for (const char* name : {"gpu-aaaa.lock", "gpu-aaaa.turnstile", "gpu-aaaa.memory-turnstile", "gpu-aaaa.memory-slot-0"})
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / name))) << name;
  auto untouched = read_file(root / "elsewhere");
  ASSERT_TRUE(untouched.ok());
  EXPECT_EQ(*untouched, "theirs");
  fs::remove_all(root);
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
