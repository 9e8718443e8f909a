// The verdict cache: an SQLite table behind a small RAII class, and the cache key.
#include "kz/eval/cache.h"

#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "kz/core/files.h"
#include "kz/core/hash.h"
#include "kz/sandbox/process.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

// Bumped when the stored JSON or the key's meaning changes, so old entries are simply never found.
constexpr std::string_view kKeySchema = "kz-verdict-cache-v2";
// How long a writer waits for another process's write lock. Writes are one small row, so a wait
// this long means something is wrong; it is then reported (and the evaluation goes on uncached).
constexpr int kBusyTimeoutMs = 10000;

// WAL: readers never block the writer, and a crash mid-write cannot corrupt the file.
// synchronous=NORMAL is safe with WAL (at worst a power cut loses the last verdicts: a cache).
constexpr const char* kSetupSql =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS verdicts ("
    "  key TEXT PRIMARY KEY NOT NULL,"
    "  verdict TEXT NOT NULL,"          // to_json(verdict)
    "  created_unix INTEGER NOT NULL"   // seconds since the epoch
    ");";

// One prepared statement, finalised on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool prepared() const { return rc_ == SQLITE_OK; }
  void bind(int index, const std::string& text) { sqlite3_bind_text(stmt_, index, text.data(), int(text.size()), SQLITE_TRANSIENT); }
  void bind(int index, long long value) { sqlite3_bind_int64(stmt_, index, value); }
  int step() { return sqlite3_step(stmt_); }
  std::string text(int column) const {
    auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return data ? std::string(data, sqlite3_column_bytes(stmt_, column)) : std::string();
  }
  long long integer(int column) const { return sqlite3_column_int64(stmt_, column); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

bool is_busy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

// Runs kSetupSql, retrying while another connection holds the lock. The busy timeout alone is not
// enough here: when several processes create the file at once, switching it to WAL or creating
// the table can fail with SQLITE_BUSY at once, without calling the busy handler (SQLite refuses
// to wait where two lock upgrades could deadlock). Such a failure is retried until the timeout.
int run_setup(sqlite3* db) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  std::minstd_rand jitter(std::random_device{}());
  for (;;) {
    int rc = sqlite3_exec(db, kSetupSql, nullptr, nullptr, nullptr);
    if (!is_busy(rc) || std::chrono::steady_clock::now() >= deadline) return rc;
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + jitter() % 20));
  }
}

// A connection with the schema in place, or the SQLite result code and message of the failure.
struct Connection {
  sqlite3* db = nullptr;
  int rc = SQLITE_OK;
  std::string error;
};

Connection connect(const fs::path& path) {
  Connection c;
  c.rc = sqlite3_open_v2(path.c_str(), &c.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                         nullptr);
  if (c.rc == SQLITE_OK) {
    sqlite3_busy_timeout(c.db, kBusyTimeoutMs);  // before the setup: another process may be writing
    c.rc = run_setup(c.db);
  }
  if (c.rc != SQLITE_OK) {
    c.error = c.db ? sqlite3_errmsg(c.db) : sqlite3_errstr(c.rc);
    sqlite3_close_v2(c.db);
    c.db = nullptr;
  }
  return c;
}

bool is_corruption(int rc) { return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT; }

// Moves a corrupt cache (and its WAL files) aside, keeping the last one for inspection.
Status move_aside(const fs::path& path) {
  std::error_code ec;
  fs::rename(path, fs::path(path.string() + ".corrupt"), ec);
  if (ec) return io_error(fmt::format("moving the corrupt verdict cache {} aside: {}", path.string(), ec.message()));
  for (const char* suffix : {"-wal", "-shm"}) fs::remove(fs::path(path.string() + suffix), ec);
  return Status::ok();
}

std::string trim(const std::string& text) {
  auto begin = text.find_first_not_of(" \t\r\n");
  auto end = text.find_last_not_of(" \t\r\n");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

}  // namespace

struct VerdictCache::Impl {
  fs::path path;
  sqlite3* db = nullptr;
  bool rebuilt = false;
  std::mutex mutex;  // one statement at a time on the connection (and a coherent errmsg)

  ~Impl() { sqlite3_close_v2(db); }
  Status error(const std::string& doing) const {
    return io_error(fmt::format("verdict cache {}: {}: {}", path.string(), doing, sqlite3_errmsg(db)));
  }
};

VerdictCache::VerdictCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VerdictCache::VerdictCache(VerdictCache&&) noexcept = default;
VerdictCache& VerdictCache::operator=(VerdictCache&&) noexcept = default;
VerdictCache::~VerdictCache() = default;

Result<VerdictCache> VerdictCache::open(const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec) return io_error(fmt::format("creating the folder of the verdict cache {}: {}", path.string(), ec.message()));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  Connection c = connect(path);
  if (is_corruption(c.rc)) {
    KZ_RETURN_IF_ERROR(move_aside(path));
    impl->rebuilt = true;
    c = connect(path);
  }
  if (c.rc != SQLITE_OK) return io_error(fmt::format("opening the verdict cache {}: {}", path.string(), c.error));
  impl->db = c.db;
  return VerdictCache(std::move(impl));
}

Result<std::optional<Verdict>> VerdictCache::lookup(const std::string& key) const {
  std::lock_guard lock(impl_->mutex);
  Statement select(impl_->db, "SELECT verdict FROM verdicts WHERE key = ?1");
  if (!select.prepared()) return impl_->error("preparing a lookup");
  select.bind(1, key);
  int rc = select.step();
  if (rc == SQLITE_DONE) return std::optional<Verdict>();
  if (rc != SQLITE_ROW) return impl_->error("looking up a verdict");
  auto json = nlohmann::json::parse(select.text(0), nullptr, false);
  auto verdict = verdict_from_json(json);
  if (!verdict.ok()) return verdict.status().with_context(fmt::format("verdict cache {}: entry {}", impl_->path.string(), key));
  verdict->cached = true;
  verdict->profile.cpu_s.clear();  // a replay costs a lookup: the stored run's CPU is not this one's
  verdict->profile.prebuild_cpu_s.reset();
  verdict->retried_alone = false;  // nor did it run twice
  return std::optional<Verdict>(std::move(*verdict));
}

Status VerdictCache::store(const std::string& key, const Verdict& verdict) {
  Verdict stored = verdict;
  stored.cached = false;  // set again on every lookup
  std::lock_guard lock(impl_->mutex);
  Statement insert(impl_->db, "INSERT OR REPLACE INTO verdicts (key, verdict, created_unix) VALUES (?1, ?2, ?3)");
  if (!insert.prepared()) return impl_->error("preparing a store");
  insert.bind(1, key);
  // Bytes that are not UTF-8 (a crash's stderr tail) become U+FFFD rather than failing the store.
  insert.bind(2, to_json(stored).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  insert.bind(3, static_cast<long long>(std::time(nullptr)));
  if (insert.step() != SQLITE_DONE) return impl_->error("storing a verdict");
  return Status::ok();
}

Result<long long> VerdictCache::size() const {
  std::lock_guard lock(impl_->mutex);
  Statement count(impl_->db, "SELECT COUNT(*) FROM verdicts");
  if (!count.prepared() || count.step() != SQLITE_ROW) return impl_->error("counting verdicts");
  return count.integer(0);
}

const fs::path& VerdictCache::path() const { return impl_->path; }
bool VerdictCache::rebuilt() const { return impl_->rebuilt; }

nlohmann::json protocol_options_json(const EvalOptions& o) {
  const auto& t = o.tolerance;
  return {
      {"device", o.device},
      {"trials", o.trials},
      {"use_cpu_sizes", o.use_cpu_sizes},
      {"size_overrides", o.size_overrides},
      {"kernel_share", o.kernel_share},
      {"policy", {{"mode", o.policy.mode}, {"min_custom_kernel_share", o.policy.min_custom_kernel_share}}},
      {"tolerance",
       {{"rule", t.rule}, {"atol_fp32", t.atol_fp32}, {"rtol_fp32", t.rtol_fp32}, {"norm_tol_fp32", t.norm_tol_fp32},
        {"atol_half", t.atol_half}, {"rtol_half", t.rtol_half}, {"norm_tol_half", t.norm_tol_half}}},
      {"timing",
       {{"enabled", o.timing.enabled}, {"warmup_runs", o.timing.warmup_runs}, {"runs", o.timing.runs},
        {"input_sets", o.timing.input_sets}, {"l2_flush_mb", o.timing.l2_flush_mb},
        {"launch_spin_us", o.timing.launch_spin_us}, {"baseline", o.timing.baseline}}},
  };
}

std::string protocol_fingerprint(const EvalOptions& options) {
  const SandboxOptions& s = options.sandbox;
  nlohmann::json j = protocol_options_json(options);
  j["seed"] = options.seed;  // the configured seed (0: random), not the one an evaluation drew
  j["cuda_connections"] = options.worker.cuda_connections;  // multi-stream candidates time by it
  j["sandbox"] = {{"enabled", s.enabled},
                  {"cpu_time_s", s.cpu_time_s},
                  {"file_size_mb", s.file_size_mb},
                  {"scratch_mb", s.scratch_mb},
                  {"scratch_files", s.scratch_files},
                  {"max_processes", s.max_processes},
                  {"memory_mb", s.memory_mb},
                  {"open_files", s.open_files},
                  {"network", s.network},
                  {"read_only_filesystem", s.read_only_filesystem},
                  {"pid_namespace", s.pid_namespace},
                  {"syscall_filter", s.syscall_filter},
                  {"shm_mb", s.shm_mb},
                  {"gpu_memory_fraction", s.gpu_memory_fraction}};
  return j.dump();  // nlohmann::json objects keep their keys sorted: canonical
}

std::string verdict_cache_key(const EvalOptions& options, const CacheKeyParts& parts) {
  return content_hash({kKeySchema, parts.reference_source, parts.candidate_source, format_name(parts.format),
                       parts.gpu_name, parts.code_version, protocol_fingerprint(options)});
}

Result<std::string> worker_code_version(const fs::path& worker_dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const char* package : {"kz_worker", "kz_rtc"}) {
    if (!fs::is_directory(worker_dir / package, ec)) continue;
    // Recursive: kz_worker has subpackages (compile/).
    for (const auto& entry : fs::recursive_directory_iterator(worker_dir / package, ec))
      if (entry.is_regular_file() && entry.path().extension() == ".py") files.push_back(entry.path());
  }
  if (ec) return io_error(fmt::format("listing the worker code in {}: {}", worker_dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  std::string digests;
  for (const auto& file : files) {
    auto text = read_file(file);
    if (!text.ok()) return text.status();
    digests += content_hash({fs::relative(file, worker_dir).string(), *text});
  }
  return content_hash({"kz-worker-code", digests});
}

const std::string& supervisor_version() {
  static const std::string version = [] {
    auto exe = read_file("/proc/self/exe");
    if (exe.ok()) return content_hash({"kz-supervisor", *exe});
    std::random_device device;
    return fmt::format("unreadable-{:08x}{:08x}", device(), device());
  }();
  return version;
}

namespace {

const fs::path kDriverGpusDir = "/proc/driver/nvidia/gpus";

std::vector<std::string> nvidia_smi_lines(const std::vector<std::string>& args) {
  ProcessSpec spec;
  spec.argv = {"nvidia-smi"};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = current_environment();
  auto run = run_process(spec, std::chrono::seconds(20));
  if (!run.ok() || run->timed_out || !run->exit.exited || run->exit.exit_code != 0) return {};
  std::vector<std::string> lines;
  std::istringstream text(run->stdout_text);
  for (std::string line; std::getline(text, line);)
    if (!trim(line).empty()) lines.push_back(trim(line));
  return lines;
}

}  // namespace

int gpu_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible && *visible) {
    int count = 1;
    for (const char* c = visible; *c; ++c) count += *c == ',';
    return count;
  }
  return static_cast<int>(nvidia_smi_lines({"-L"}).size());
}

std::vector<std::string> uuids_in_device_list(const std::vector<std::string>& lines) {
  static const std::regex uuid(R"(\(UUID: ((GPU|MIG)-[^)\s]+)\))");
  std::vector<std::string> uuids;
  std::smatch found;
  for (const std::string& line : lines)
    if (std::regex_search(line, found, uuid)) uuids.push_back(found[1].str());
  return uuids;
}

std::vector<std::string> fields_in_driver_info(const fs::path& gpus_dir, const std::string& field) {
  const std::regex line_of_field("^" + field + R"(:\s*(\S.*?)\s*$)");
  std::vector<std::string> values;
  std::error_code error;
  for (const auto& gpu : fs::directory_iterator(gpus_dir, error)) {
    auto info = read_file(gpu.path() / "information");
    if (!info.ok()) continue;
    std::istringstream text(*info);
    std::smatch found;
    for (std::string line; std::getline(text, line);)
      if (std::regex_search(line, found, line_of_field)) values.push_back(found[1].str());
  }
  std::sort(values.begin(), values.end());
  return values;
}

std::vector<std::string> uuids_in_driver_info(const fs::path& gpus_dir) {
  return fields_in_driver_info(gpus_dir, "GPU UUID");
}

std::vector<std::string> gpu_uuids() {
  auto listed = uuids_in_device_list(nvidia_smi_lines({"-L"}));
  return !listed.empty() ? listed : uuids_in_driver_info(kDriverGpusDir);
}

std::string gpu_model_names() {
  // The driver's files first: nvidia-smi costs a process on the way to a batch's first request.
  auto lines = fields_in_driver_info(kDriverGpusDir, "Model");
  if (lines.empty()) lines = nvidia_smi_lines({"--query-gpu=name", "--format=csv,noheader"});
  std::set<std::string> names(lines.begin(), lines.end());
  std::string joined;
  for (const auto& name : names) joined += (joined.empty() ? "" : "|") + name;
  return joined;
}

bool is_cacheable(const Verdict& v) {
  // out_of_memory_shared is an infra_error already; named too, as what other evaluations held on the
  // GPU says nothing of the candidate, whatever status it comes with.
  return v.status != EvalStatus::infra_error && v.status != EvalStatus::timeout &&
         !v.has_check(Check::worker_crashed) && !v.has_check(Check::stage_timeout) &&
         !v.has_check(Check::out_of_memory_shared);
}

fs::path verdict_cache_path(const EvalOptions& options, const fs::path& cache_dir) {
  return options.cache.path.empty() ? cache_dir / "verdicts.sqlite" : options.cache.path;
}

}  // namespace kz
