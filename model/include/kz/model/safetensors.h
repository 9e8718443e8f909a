// The safetensors format, read and written without libtorch, and sharded checkpoints.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data; offsets are relative to the byte after the header. Files are memory-mapped, so
// opening a 15 GB checkpoint costs no reads until a tensor is used. Every offset and size is
// checked against the file length: a truncated file is an error naming the file and tensor.
//
// A sharded checkpoint is a directory with model.safetensors.index.json
//   {"metadata": {"total_size": bytes}, "weight_map": {"<name>": "model-00001-of-00002.safetensors"}}
// and the shards it names; a plain checkpoint has one model.safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::model {

enum class StDType { f32, f16, bf16, f64, i64, i32, i16, i8, u8, boolean };
const char* st_dtype_name(StDType dtype);           // "F32", "BF16", ...
Result<StDType> parse_st_dtype(const std::string& name);
size_t st_dtype_size(StDType dtype);                // bytes per element

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  size_t begin = 0;  // byte offsets into the data section
  size_t end = 0;
  size_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// One memory-mapped .safetensors file. Move-only; tensor data stay valid while it lives.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const fs::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const fs::path& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }  // in file order
  const StTensorInfo* find(const std::string& name) const;
  const void* data(const StTensorInfo& info) const { return data_ + info.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  fs::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: raw little-endian bytes, row-major.
struct StTensorView {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;  // must equal numel * element size
};

// Writes one .safetensors file (tensors in the given order, header padded to 8 bytes so data are
// aligned), through a temporary file renamed into place.
Status write_safetensors(const fs::path& path, const std::vector<StTensorView>& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// All tensors of a checkpoint directory, plain or sharded.
class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json and its shards, or `dir`/model.safetensors, or a
  // single .safetensors file given directly.
  static Result<Checkpoint> open(const fs::path& dir);

  struct Entry {
    const SafetensorsFile* file;
    const StTensorInfo* info;
  };
  // nullptr entry when the name is absent.
  const Entry* find(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;
};

// Writes `tensors` into `dir`: one model.safetensors when they fit in max_shard_bytes (0: no
// limit), otherwise model-0000i-of-0000n.safetensors shards (a tensor larger than the limit gets
// a shard of its own) plus model.safetensors.index.json, as transformers' save_pretrained does.
// Stale shards or index from an earlier save with another layout are removed.
Status write_checkpoint(const fs::path& dir, const std::vector<StTensorView>& tensors, size_t max_shard_bytes);

}  // namespace kz::model
