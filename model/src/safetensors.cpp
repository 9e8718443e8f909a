// safetensors reading (mmap + checked header) and writing, and sharded checkpoints.
#include "kz/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace kz::model {
namespace {

using nlohmann::json;

constexpr size_t kMaxHeaderBytes = 100u << 20;  // the format's own limit
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

struct DTypeRow {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::f32, "F32", 4}, {StDType::f16, "F16", 2}, {StDType::bf16, "BF16", 2},
    {StDType::f64, "F64", 8}, {StDType::i64, "I64", 8}, {StDType::i32, "I32", 4},
    {StDType::i16, "I16", 2}, {StDType::i8, "I8", 1},   {StDType::u8, "U8", 1},
    {StDType::boolean, "BOOL", 1},
};

Status st_error(const fs::path& path, const std::string& what) {
  return invalid_argument(fmt::format("safetensors file {}: {}", path.string(), what));
}

// Parses one tensor entry of the header and checks it against the data section's size.
Result<StTensorInfo> parse_entry(const std::string& name, const json& e, size_t data_size, const fs::path& path) {
  auto bad = [&](const std::string& what) { return st_error(path, "tensor '" + name + "': " + what); };
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    return bad("entry needs dtype, shape and data_offsets");
  StTensorInfo info;
  info.name = name;
  if (!e["dtype"].is_string()) return bad("dtype is not a string");
  auto dt = parse_st_dtype(e["dtype"].get<std::string>());
  if (!dt.ok()) return bad(dt.status().message());
  info.dtype = *dt;
  if (!e["shape"].is_array()) return bad("shape is not a list");
  for (const json& d : e["shape"]) {
    if (!d.is_number_unsigned()) return bad("shape holds " + d.dump());
    info.shape.push_back(d.get<int64_t>());
  }
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return bad("data_offsets must be [begin, end]");
  info.begin = off[0].get<size_t>();
  info.end = off[1].get<size_t>();
  if (info.begin > info.end) return bad("data_offsets begin > end");
  if (info.end > data_size)
    return bad(fmt::format("data ends at byte {} but the file holds only {} data bytes (truncated?)", info.end,
                           data_size));
  size_t expected = st_dtype_size(info.dtype);
  for (int64_t d : info.shape)
    if (__builtin_mul_overflow(expected, static_cast<size_t>(d), &expected)) return bad("shape overflows");
  if (info.nbytes() != expected)
    return bad(fmt::format("{} data bytes for a shape needing {}", info.nbytes(), expected));
  return info;
}

Status errno_status(const std::string& what, const fs::path& path) {
  std::string msg = fmt::format("{} {}: {}", what, path.string(), std::strerror(errno));
  return errno == ENOENT ? not_found(msg) : io_error(msg);
}

bool write_all(std::FILE* f, const void* data, size_t n) { return n == 0 || std::fwrite(data, 1, n, f) == n; }

}  // namespace

const char* st_dtype_name(StDType dtype) {
  for (const auto& row : kDTypes)
    if (row.dtype == dtype) return row.name;
  return "?";
}

Result<StDType> parse_st_dtype(const std::string& name) {
  for (const auto& row : kDTypes)
    if (name == row.name) return row.dtype;
  return invalid_argument("unsupported dtype '" + name + "'");
}

size_t st_dtype_size(StDType dtype) {
  for (const auto& row : kDTypes)
    if (row.dtype == dtype) return row.size;
  return 0;
}

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("opening", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return errno_status("stat of", path);
  }
  f.map_size_ = static_cast<size_t>(st.st_size);
  if (f.map_size_ < 8) {
    ::close(fd);
    return st_error(path, fmt::format("{} bytes is shorter than the 8-byte header length (truncated?)", f.map_size_));
  }
  // MAP_PRIVATE: nobody else's writes reach us, and we never write.
  void* map = ::mmap(nullptr, f.map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return errno_status("mapping", path);
  f.map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];  // little-endian
  if (header_size > kMaxHeaderBytes || header_size > f.map_size_ - 8)
    return st_error(path, fmt::format("header of {} bytes does not fit in a file of {} bytes (truncated or not "
                                      "safetensors)", header_size, f.map_size_));
  json header = json::parse(bytes + 8, bytes + 8 + header_size, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return st_error(path, "header is not a JSON object");
  f.data_ = bytes + 8 + header_size;
  size_t data_size = f.map_size_ - 8 - header_size;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) f.metadata_[k] = v.get<std::string>();
      continue;
    }
    auto info = parse_entry(name, entry, data_size, path);
    if (!info.ok()) return info.status();
    f.index_[name] = f.tensors_.size();
    f.tensors_.push_back(std::move(info).value());
  }
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this == &o) return *this;
  if (map_) ::munmap(map_, map_size_);
  path_ = std::move(o.path_);
  map_ = std::exchange(o.map_, nullptr);
  map_size_ = std::exchange(o.map_size_, 0);
  data_ = std::exchange(o.data_, nullptr);
  tensors_ = std::move(o.tensors_);
  index_ = std::move(o.index_);
  metadata_ = std::move(o.metadata_);
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status write_safetensors(const fs::path& path, const std::vector<StTensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (t.nbytes != static_cast<size_t>(numel) * st_dtype_size(t.dtype))
      return internal_error(fmt::format("writing {}: tensor '{}' has {} bytes for its shape", path.string(),
                                        t.name, t.nbytes));
    if (header.contains(t.name)) return internal_error("writing " + path.string() + ": duplicate tensor " + t.name);
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data start 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  fs::path tmp = path;
  tmp += ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return errno_status("creating", tmp);
  bool ok = write_all(f, len, 8) && write_all(f, text.data(), text.size());
  for (size_t i = 0; ok && i < tensors.size(); ++i) ok = write_all(f, tensors[i].data, tensors[i].nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    Status s = errno_status("writing", tmp);
    std::remove(tmp.c_str());
    return s;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return io_error(fmt::format("renaming {} to {}: {}", tmp.string(), path.string(), ec.message()));
  return Status::ok();
}

Result<Checkpoint> Checkpoint::open(const fs::path& dir) {
  Checkpoint ck;
  std::vector<fs::path> shard_paths;
  json weight_map;
  fs::path index_path = dir / kIndexName;
  if (!fs::is_directory(dir)) {
    shard_paths.push_back(dir);
  } else if (fs::exists(index_path)) {
    auto text = read_file(index_path);
    if (!text.ok()) return text.status();
    json index = json::parse(*text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return parse_error(index_path.string() + ": expected an object with a 'weight_map' object");
    weight_map = index["weight_map"];
    std::set<std::string> names;
    for (auto& [tensor, file] : weight_map.items()) {
      if (!file.is_string()) return parse_error(index_path.string() + ": weight_map['" + tensor + "'] is not a file name");
      if (names.insert(file.get<std::string>()).second) shard_paths.push_back(dir / file.get<std::string>());
    }
  } else if (fs::exists(dir / kSingleName)) {
    shard_paths.push_back(dir / kSingleName);
  } else {
    return not_found(fmt::format("{}: no {} or {}", dir.string(), kSingleName, kIndexName));
  }
  for (const auto& p : shard_paths) {
    auto f = SafetensorsFile::open(p);
    if (!f.ok()) return f.status();
    ck.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f).value()));
  }
  for (const auto& file : ck.files_) {
    for (const auto& info : file->tensors()) {
      // The index is the authority on which shard holds a name; a duplicate elsewhere is ignored.
      if (!weight_map.is_null() && weight_map.contains(info.name) &&
          fs::path(weight_map[info.name].get<std::string>()).filename() != file->path().filename())
        continue;
      if (ck.entries_.count(info.name))
        return invalid_argument(fmt::format("{}: tensor '{}' appears in more than one file", dir.string(), info.name));
      ck.entries_[info.name] = Entry{file.get(), &info};
    }
  }
  for (auto& [tensor, file] : weight_map.items())
    if (!ck.entries_.count(tensor))
      return invalid_argument(fmt::format("{}: index maps '{}' to {} but that file does not hold it",
                                          index_path.string(), tensor, file.get<std::string>()));
  return ck;
}

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

namespace {

// Groups tensors, in order, into shards of at most max_bytes (a larger tensor stands alone).
std::vector<std::vector<size_t>> plan_shards(const std::vector<StTensorView>& tensors, size_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  size_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t n = tensors[i].nbytes;
    if (max_bytes > 0 && !shards.back().empty() && current + n > max_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += n;
  }
  return shards;
}

// Removes model.safetensors, the index and model-*-of-*.safetensors left by an earlier save.
void remove_old_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    bool shard = n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos && n.ends_with(".safetensors");
    if (shard || n == kSingleName || n == kIndexName) fs::remove(e.path(), ec);
  }
}

}  // namespace

Status write_checkpoint(const fs::path& dir, const std::vector<StTensorView>& tensors, size_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("creating {}: {}", dir.string(), ec.message()));
  remove_old_weights(dir);
  auto shards = plan_shards(tensors, max_shard_bytes);
  if (shards.size() == 1) return write_safetensors(dir / kSingleName, tensors);
  json weight_map = json::object();
  size_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<StTensorView> part;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].name] = file;
      total += tensors[i].nbytes;
    }
    KZ_RETURN_IF_ERROR(write_safetensors(dir / file, part));
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return write_file_atomic(dir / kIndexName, index.dump(2) + "\n");
}

}  // namespace kz::model
