// Shared by the evaluation engine's tests: where the sources are, whether nvcc is here, and the
// processes alive now (for the tests that look for what kz started, or left behind).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace kz::test {

// The repository root (KZ_SOURCE_DIR, which CTest sets): the suite, the fixtures, the worker.
// Empty when unset; tests that need it fail with a hint.
inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir && *dir ? std::filesystem::path(dir) : std::filesystem::path();
}

// nvcc as load_inline finds it: $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, else "nvcc" (PATH).
inline std::string nvcc_path() {
  const char* cuda_home = std::getenv("CUDA_HOME");
  if (cuda_home && std::filesystem::exists(std::filesystem::path(cuda_home) / "bin" / "nvcc"))
    return (std::filesystem::path(cuda_home) / "bin" / "nvcc").string();
  return std::filesystem::exists("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : "nvcc";
}

// Whether load_inline can find nvcc (nvcc_path): the `cuda` builds' tests skip without it.
inline bool have_nvcc() {
  return nvcc_path() != "nvcc" || std::system("command -v nvcc > /dev/null 2>&1") == 0;
}

// A file under /proc through read(2), "" once its process is gone: a process that exits while its
// file is read makes the read fail with ESRCH, which std::ifstream's buffer turns into an exception.
inline std::string read_proc_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char buffer[4096];
  ssize_t got;
  while ((got = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, size_t(got));
  ::close(fd);
  return got < 0 ? std::string() : text;
}

// A process as /proc/<pid> showed it when it was read.
struct ProcessEntry {
  pid_t pid = 0;
  std::string cmdline;     // its arguments, NUL-separated ("" for a kernel thread)
  char state = '?';        // stat's field 3 (Z: a zombie)
  pid_t ppid = 0;          // field 4
  pid_t pgrp = 0;          // field 5
  int nice = 0;            // field 19
  double started_s = 0;    // field 22: seconds after boot

  std::filesystem::path dir() const { return std::filesystem::path("/proc") / std::to_string(pid); }
  std::string read(const char* file) const { return read_proc_file(dir() / file); }  // "" once gone
};

// Process `pid` now, or nothing where it is gone (or its stat cannot be read).
inline std::optional<ProcessEntry> process_entry(pid_t pid) {
  ProcessEntry entry;
  entry.pid = pid;
  std::string stat = entry.read("stat");
  size_t close = stat.rfind(')');  // the command's name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) entry.state = field[0];
    if (i == 4) entry.ppid = std::stoi(field);
    if (i == 5) entry.pgrp = std::stoi(field);
    if (i == 19) entry.nice = std::stoi(field);
    if (i == 22) entry.started_s = std::stod(field) / double(::sysconf(_SC_CLK_TCK));
  }
  entry.cmdline = entry.read("cmdline");
  return entry;
}

// Every process alive now, zombies left out.
inline std::vector<ProcessEntry> live_processes() {
  std::vector<ProcessEntry> live;
  std::error_code error;
  for (const auto& dir : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = dir.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto entry = process_entry(std::stoi(name));
    if (entry && entry->state != 'Z') live.push_back(std::move(*entry));
  }
  return live;
}

}  // namespace kz::test
