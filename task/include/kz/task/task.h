// Reference tasks: KernelBench-format PyTorch modules and where they come from.
//
// A task is one reference module (`class Model`, `get_inputs()`, `get_init_inputs()`, size
// constants). Sources: a single `NAME.py`, a directory of them (KernelBench's `level1/19_ReLU.py`
// layout or flat; the task id is the file's stem, the level comes from a `levelN` folder), or a
// JSONL dataset whose rows carry `py_code` plus optional `id`, `ops` and `level` (rows with
// `"status": "rejected"`, as `kz propose` writes them, are skipped).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz {

struct Task {
  std::string id;                // file stem, or the JSONL row's `id` (else "<file stem>-<row>")
  std::string source;            // the Python module text
  std::string origin;            // "path/to/file.py" or "data.jsonl:12" (for error messages)
  int level = 0;                 // 0 when unknown
  std::vector<std::string> ops;  // the PyTorch APIs the module exercises, when known
};

// Loads a file (.py or .jsonl) or a directory (recursively, .py files, sorted by path).
// Every task is checked with check_reference_source; ids must be unique.
Result<std::vector<Task>> load_tasks(const std::filesystem::path& path);

Result<Task> load_task_file(const std::filesystem::path& path);
Result<std::vector<Task>> load_task_directory(const std::filesystem::path& dir);
Result<std::vector<Task>> load_task_jsonl(const std::filesystem::path& path);

// A static check that the source looks like a KernelBench reference: it defines `class Model`,
// `get_inputs` and `get_init_inputs`. The message names what is missing.
Status check_reference_source(const Task& task);

// The level encoded in a path component such as "level2" (0 if none).
int level_from_path(const std::filesystem::path& path);

}  // namespace kz
