// Scratch dirs (kz/eval/scratch_dirs.h): one unlistable parent per user, dirs named by their kz
// process's owner token, and the dirs of a process that died swept by the next one.
#include "kz/eval/scratch_dirs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kz/core/files.h"

namespace kz {
namespace {
namespace fs = std::filesystem;

class ScratchDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A root per test: a process keeps its token per parent for its whole life.
    root_ = fs::temp_directory_path() / ("kz_scratch_dirs_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path parent() const { return root_ / ("kz-scratch-" + std::to_string(::geteuid())); }
  static void touch(const fs::path& path) {
    fs::create_directories(path.parent_path());
    ASSERT_TRUE(write_file_atomic(path, "x").is_ok()) << path;
  }

  fs::path root_;
};

TEST_F(ScratchDirsTest, DirsSitInAnUnlistableParentNamedByTheirOwner) {
  auto first = make_scratch_dir(root_, "kz-eval-", false);
  auto second = make_scratch_dir(root_, "kz-eval-", false);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status().to_string();
  EXPECT_EQ(first->parent_path(), parent());
  struct stat info {};
  ASSERT_EQ(::lstat(parent().c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, ::geteuid() == 0 ? 0311u : 0700u);
  // kz-eval-<token>-XXXXXX, one token per process, and that token's lock held.
  std::string name = first->filename().string(), token = name.substr(8, name.size() - 8 - 7);
  EXPECT_EQ(second->filename().string().substr(0, name.size() - 6), name.substr(0, name.size() - 6));
  EXPECT_NE(*first, *second);
  int fd = ::open((parent() / ("owner-" + token + ".lock")).c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << "no lock for token " << token;
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0) << "this process's lock is free";
  ::close(fd);
  EXPECT_EQ(sweep_dead_owners(parent()), 0);
  EXPECT_TRUE(fs::is_directory(*first)) << "a live owner's dir was swept";
  // keep_scratch: no token, never swept.
  auto kept = make_scratch_dir(root_, "kz-eval-", true);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->filename().string().size(), std::string("kz-eval-XXXXXX").size());
}

TEST_F(ScratchDirsTest, OnlyTheDirsOfOwnersWhoseLockIsFreeAreSwept) {
  ASSERT_TRUE(scratch_parent(root_).ok());
  touch(parent() / "owner-dead00000001.lock");
  touch(parent() / "kz-eval-dead00000001-a1b2c3" / "request-1" / "candidate.py");
  touch(parent() / "kz-validate-dead00000001-d4e5f6" / "candidate.py");
  touch(parent() / "owner-cafe00000001.lock");
  touch(parent() / "kz-eval-cafe00000001-a1b2c3" / "candidate.py");
  touch(parent() / "kz-eval-oldstyle" / "candidate.py");  // before owner tokens: left alone
  int held = ::open((parent() / "owner-cafe00000001.lock").c_str(), O_RDWR);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);

  EXPECT_EQ(sweep_dead_owners(parent()), 2);
  EXPECT_FALSE(fs::exists(parent() / "kz-eval-dead00000001-a1b2c3"));
  EXPECT_FALSE(fs::exists(parent() / "kz-validate-dead00000001-d4e5f6"));
  EXPECT_FALSE(fs::exists(parent() / "owner-dead00000001.lock"));
  EXPECT_TRUE(fs::exists(parent() / "kz-eval-cafe00000001-a1b2c3" / "candidate.py"));
  EXPECT_TRUE(fs::exists(parent() / "owner-cafe00000001.lock"));
  EXPECT_TRUE(fs::exists(parent() / "kz-eval-oldstyle"));
  ::close(held);
}

// Where the parent is writable (no read-only mount), a planted lock must not pass for a dead owner
// of other processes' dirs: only owner-<12 hex>.lock, regular, this user's, names an owner, and
// only <prefix>-<token>-XXXXXX are its dirs.
TEST_F(ScratchDirsTest, PlantedLockNamesSweepNothingElse) {
  auto live = make_scratch_dir(root_, "kz-eval-", false);
  ASSERT_TRUE(live.ok());
  touch(parent() / "owner-eval.lock");             // would match every kz-eval-* dir by "-eval-"
  touch(parent() / "owner-a1b2c3d4e5f6.lock");     // a well-formed token: only its own dirs
  touch(parent() / "kz-eval-x-a1b2c3d4e5f6-y-Q1w2e3");  // contains the mark, not where a token sits
  fs::create_directories(parent() / "owner-0123456789ab.lock");  // a directory, not a lock file
  touch(parent() / "kz-eval-0123456789ab-Q1w2e3" / "candidate.py");
  EXPECT_EQ(sweep_dead_owners(parent()), 0);
  EXPECT_TRUE(fs::is_directory(*live));
  EXPECT_TRUE(fs::exists(parent() / "kz-eval-x-a1b2c3d4e5f6-y-Q1w2e3"));
  EXPECT_TRUE(fs::exists(parent() / "kz-eval-0123456789ab-Q1w2e3" / "candidate.py"));
}

// A kz process killed with its scratch dir in place: the next one to make a scratch dir there
// sweeps it.
TEST_F(ScratchDirsTest, AKilledProcesssDirIsSweptByTheNextProcess) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();
  if (child == 0) {
    auto dir = make_scratch_dir(root_, "kz-eval-", false);
    std::string path = dir.ok() ? dir->string() : "";
    (void)!::write(pipe_fds[1], path.data(), path.size());
    ::_exit(0);  // no clean-up: as if killed
  }
  ::close(pipe_fds[1]);
  char buffer[4096];
  ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_GT(n, 0);
  fs::path orphan(std::string(buffer, static_cast<size_t>(n)));
  touch(orphan / "candidate.py");
  auto mine = make_scratch_dir(root_, "kz-eval-", false);
  ASSERT_TRUE(mine.ok());
  EXPECT_FALSE(fs::exists(orphan)) << "the dead process's dir was not swept";
  EXPECT_TRUE(fs::is_directory(*mine));
}

TEST_F(ScratchDirsTest, AScratchDirPastItsBoundIsFoundByBytesOrByEntries) {
  fs::path dir = root_ / "worker";
  fs::create_directories(dir / "sub");
  EXPECT_FALSE(scratch_over_bound(dir, {})) << "no bound";
  std::string mebibyte(1 << 20, '\0');  // random: no filesystem stores it in fewer blocks
  std::mt19937_64 random(7);
  for (char& c : mebibyte) c = static_cast<char>(random());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(write_file_atomic(dir / "sub" / std::to_string(i), mebibyte).is_ok());
  EXPECT_FALSE(scratch_over_bound(dir, {.max_bytes = 4 << 20, .max_entries = 10}));
  auto bytes = scratch_over_bound(dir, {.max_bytes = 2 << 20});
  ASSERT_TRUE(bytes);
  EXPECT_NE(bytes->find("more than 2 MB"), std::string::npos) << *bytes;
  auto entries = scratch_over_bound(dir, {.max_entries = 3});  // sub and its three files
  ASSERT_TRUE(entries);
  EXPECT_NE(entries->find("more than 3 files"), std::string::npos) << *entries;

  // What a file uses, not its length: a sparse 1 TiB file holds almost nothing.
  int fd = ::open((dir / "sparse").c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{1} << 40), 0);
  ::close(fd);
  EXPECT_FALSE(scratch_over_bound(dir, {.max_bytes = 4 << 20}));
  // A link out of the dir is not followed: what it points at is not the worker's.
  fs::path outside = root_ / "outside";
  fs::create_directories(outside);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(write_file_atomic(outside / std::to_string(i), mebibyte).is_ok());
  fs::create_directory_symlink(outside, dir / "link");
  EXPECT_FALSE(scratch_over_bound(dir, {.max_bytes = 4 << 20}));
  EXPECT_FALSE(scratch_over_bound(root_ / "gone", {.max_bytes = 1})) << "nothing to read: within";
}

TEST_F(ScratchDirsTest, NeitherDepthNorLongNamesHideWhatAScratchDirHolds) {
  // Past PATH_MAX: 30 levels of 200-character names, a file at the bottom.
  fs::path dir = root_ / "worker";
  fs::create_directories(dir);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  std::string name(200, 'd');
  for (int level = 0; level < 30; ++level) {
    ASSERT_EQ(::mkdirat(fd, name.c_str(), 0700), 0) << level;
    int next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY);
    ::close(fd);
    ASSERT_GE(next, 0);
    fd = next;
  }
  int file = ::openat(fd, "big", O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(file, 0);
  std::string block(1 << 20, '\0');
  std::mt19937_64 random(11);
  for (char& c : block) c = static_cast<char>(random());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(::write(file, block.data(), block.size()), ssize_t(block.size()));
  ::close(file);
  ::close(fd);
  auto over = scratch_over_bound(dir, {.max_bytes = 2 << 20});
  ASSERT_TRUE(over) << "3 MiB at a depth past PATH_MAX";
  EXPECT_NE(over->find("more than 2 MB"), std::string::npos) << *over;

  // Nesting deeper than any build's: a verdict of its own, whatever it holds.
  fs::path deep = root_ / "deep";
  fs::path path = deep;
  for (int level = 0; level < 70; ++level) path /= "d";
  fs::create_directories(path);
  auto too_deep = scratch_over_bound(deep, {.max_entries = 1000});
  ASSERT_TRUE(too_deep);
  EXPECT_NE(too_deep->find("deeper than 64"), std::string::npos) << *too_deep;
}

// A file written, then removed while still open (or mapped), takes its disk until let go of, and no
// walk of the dir finds it: each look counts those of the holders it is given, each file once; open
// ones wherever they lie on the dir's filesystem, mapped ones where they lay under the dir.
TEST_F(ScratchDirsTest, FilesRemovedButStillHeldCountForTheirHolders) {
  fs::path dir = root_ / "worker";
  fs::create_directories(dir);
  std::string block(1 << 20, '\0');  // random: no filesystem stores it in fewer blocks
  std::mt19937_64 random(13);
  for (char& c : block) c = static_cast<char>(random());
  // A file of `mebibytes`, written and closed (so no filesystem keeps blocks preallocated for more),
  // then held open read-only.
  auto held_file = [&](const fs::path& path, int mebibytes) {
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path;
    for (int i = 0; i < mebibytes; ++i) EXPECT_EQ(::write(fd, block.data(), block.size()), ssize_t(block.size()));
    ::fsync(fd);  // allocated now, not at writeback
    ::close(fd);
    return ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  };
  const std::vector<pid_t> me{::getpid()};
  const ScratchBound bound{.max_bytes = 3 << 19};  // 1.5 MiB

  // Open and still named: the walk counts it, the holders' look does not count it again.
  int named = held_file(dir / "named", 1);
  ASSERT_GE(named, 0);
  EXPECT_FALSE(scratch_over_bound(dir, bound, me)) << "1 MiB, counted once";
  int removed = held_file(dir / "removed", 1);
  ASSERT_GE(removed, 0);
  ASSERT_EQ(::unlink((dir / "removed").c_str()), 0);
  EXPECT_FALSE(scratch_over_bound(dir, bound)) << "without its holders the removed file is not seen";
  auto over = scratch_over_bound(dir, bound, me);
  ASSERT_TRUE(over) << "2 MiB, 1 of them in a removed file this process keeps open";
  EXPECT_NE(over->find("more than 1 MB (sandbox.scratch_mb), 1.0 MB of it in files removed but still open or mapped"),
            std::string::npos) << *over;
  EXPECT_FALSE(scratch_over_bound(dir, {.max_bytes = 5 << 19}, {::getpid(), ::getpid()}))
      << "2 MiB within 2.5 MiB: each file once, whoever holds it";

  // Mapped, its descriptor closed: only /proc/<pid>/map_files shows it, which needs CAP_SYS_ADMIN.
  // Low in the address space where it may be: maps pads such an address with zeros, map_files not.
  void* low = reinterpret_cast<void*>(uintptr_t{0x2000000});
  void* mapped = ::mmap(low, 1 << 20, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, removed, 0);
  if (mapped == MAP_FAILED) mapped = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, removed, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  ::close(removed);
  std::error_code error;
  bool map_files_readable = false;
  for (const auto& entry : fs::directory_iterator("/proc/self/map_files", error)) {
    struct stat info {};
    map_files_readable = ::stat(entry.path().c_str(), &info) == 0;
    break;
  }
  if (map_files_readable) EXPECT_TRUE(scratch_over_bound(dir, bound, me)) << "mapped only, at " << mapped;
  ::munmap(mapped, 1 << 20);
  EXPECT_FALSE(scratch_over_bound(dir, bound, me)) << "let go of: its disk is free";

  // Open, past PATH_MAX: its link cannot be read, its file still counts.
  int level = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(level, 0);
  const std::string name(250, 'd');
  for (int depth = 0; depth < 18; ++depth) {
    ASSERT_EQ(::mkdirat(level, name.c_str(), 0700), 0) << depth;
    int next = ::openat(level, name.c_str(), O_RDONLY | O_DIRECTORY);
    ::close(level);
    ASSERT_GE(next, 0);
    level = next;
  }
  int deep = ::openat(level, "deep", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(deep, 0);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(::write(deep, block.data(), block.size()), ssize_t(block.size()));
  ::fsync(deep);
  ASSERT_EQ(::unlinkat(level, "deep", 0), 0);
  ::close(level);
  fs::remove_all(dir / name);
  EXPECT_TRUE(scratch_over_bound(dir, bound, me)) << "a removed file opened past PATH_MAX";
  ::close(deep);
  EXPECT_FALSE(scratch_over_bound(dir, bound, me));

  // Removed beside the dir on its filesystem: open, it counts (a worker writes nowhere else there);
  // mapped only (a library replaced under a long-lived server), it does not.
  fs::create_directories(root_ / "beside");
  int beside = held_file(root_ / "beside" / "old.so", 1);
  ASSERT_GE(beside, 0);
  ASSERT_EQ(::unlink((root_ / "beside" / "old.so").c_str()), 0);
  EXPECT_TRUE(scratch_over_bound(dir, bound, me)) << "a removed file open beside the scratch dir";
  void* library = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, beside, 0);
  ASSERT_NE(library, MAP_FAILED);
  ::close(beside);
  EXPECT_FALSE(scratch_over_bound(dir, bound, me)) << "a removed file mapped beside the scratch dir";
  ::munmap(library, 1 << 20);
  std::string shm_name = "/kz-scratch-test-" + std::to_string(::getpid());
  int elsewhere = ::shm_open(shm_name.c_str(), O_CREAT | O_RDWR, 0600);
  if (elsewhere >= 0) {
    ::shm_unlink(shm_name.c_str());
    for (int i = 0; i < 2; ++i) EXPECT_EQ(::write(elsewhere, block.data(), block.size()), ssize_t(block.size()));
    EXPECT_FALSE(scratch_over_bound(dir, bound, me)) << "a removed file in /dev/shm";
    ::close(elsewhere);
  }
  ::close(named);
}

TEST(ScrubScratchPaths, WritesEveryScratchPathAsScratch) {
  EXPECT_EQ(scrub_scratch_paths("File \"/tmp/kz-scratch-0/kz-eval-Wn7ipQ/request-4-0123456789abcdef/candidate.py\", "
                                "line 3"),
            "File \"<scratch>/candidate.py\", line 3");
  EXPECT_EQ(scrub_scratch_paths("in /var/tmp/x/kz-scratch-1000/kz-eval-abc123-Q1w2e3/torch_extensions/relu.so: bad"),
            "in <scratch>/torch_extensions/relu.so: bad");
  EXPECT_EQ(scrub_scratch_paths("two: /tmp/kz-scratch-0/kz-eval-a (and '/tmp/kz-scratch-0/kz-eval-b/request-1')"),
            "two: <scratch> (and '<scratch>')");
  EXPECT_EQ(scrub_scratch_paths("/tmp/kz-scratch-0"), "<scratch>");
  const std::string plain = "correct, speedup 1.02x; /tmp/other/kz-eval-x stays";
  EXPECT_EQ(scrub_scratch_paths(plain), plain);
  // A path's lead-in stays; doubled slashes do not hide a dir's name.
  EXPECT_EQ(scrub_scratch_paths("cwd=/tmp/kz-scratch-0/kz-eval-a end"), "cwd=<scratch> end");
  EXPECT_EQ(scrub_scratch_paths("nvcc -I/tmp/kz-scratch-0//kz-eval-a/inc"), "nvcc -I<scratch>/inc");
  // A path cut by a tail, its kz-scratch part gone: the dirs' names alone.
  EXPECT_EQ(scrub_scratch_paths("ch-0/kz-eval-0123456789ab-Qw1e2r/request-3-0123456789abcdef/candidate.py\", line 9"),
            "<scratch>/candidate.py\", line 9");
}

}  // namespace
}  // namespace kz
