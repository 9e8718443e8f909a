// The candidate's Python syntax, before any worker (see syntax_check.h).
#include "kz/eval/syntax_check.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <map>

#include "kz/sandbox/process.h"

namespace kz {
namespace fs = std::filesystem;
namespace {

ProcessSpec checker_spec(const std::string& python, const fs::path& worker_dir, const fs::path& bytecode_prefix) {
  ProcessSpec spec;
  // -S: no site-packages (the module needs the standard library only), so no torch and a fast start.
  spec.argv = {python, "-S", "-m", "kz_worker.syntax_check"};
  const char* path = std::getenv("PATH");
  spec.env = {{"PATH", path ? path : "/usr/local/bin:/usr/bin:/bin"},
              {"PYTHONPATH", worker_dir.string()},
              {"PYTHONSAFEPATH", "1"},
              {"PYTHONDONTWRITEBYTECODE", "1"},
              {"PYTHONNOUSERSITE", "1"}};
  if (!bytecode_prefix.empty()) spec.env["PYTHONPYCACHEPREFIX"] = bytecode_prefix.string();
  spec.cwd = "/";
  spec.defer_stdin = true;  // one request after another
  spec.message_pipe = true;
  // Compiling runs none of the source, but a source built to exhaust the compiler meets these limits
  // (then no answer: the worker decides) rather than the supervisor's memory; and should a source
  // ever reach code through a flaw of the compiler's, it finds no network, a read-only filesystem, no
  // capabilities and no other process in sight (each where the machine allows it, as for workers).
  spec.limits.address_space_bytes = uint64_t{2} << 30;
  spec.limits.no_core_dumps = true;
  spec.limits.max_processes = 16;
  spec.new_network_namespace = true;
  spec.read_only_filesystem = true;
  spec.new_pid_namespace = true;
  spec.drop_capabilities = true;
  return spec;
}

}  // namespace

SyntaxChecker::SyntaxChecker(std::string python, fs::path worker_dir, fs::path bytecode_prefix,
                             std::chrono::milliseconds answer_timeout)
    : python_(std::move(python)),
      worker_dir_(std::move(worker_dir)),
      bytecode_prefix_(std::move(bytecode_prefix)),
      answer_timeout_(answer_timeout) {}

SyntaxChecker::~SyntaxChecker() = default;

bool SyntaxChecker::running() const {
  std::lock_guard lock(mutex_);
  return process_ != nullptr;
}

std::shared_ptr<SyntaxChecker> SyntaxChecker::shared(const WorkerSetup& setup) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<SyntaxChecker>> checkers;
  std::lock_guard lock(mutex);
  auto& checker = checkers[setup.python + '\n' + setup.worker_dir.string() + '\n' + setup.bytecode_prefix.string()];
  if (!checker) checker = std::make_shared<SyntaxChecker>(setup.python, setup.worker_dir, setup.bytecode_prefix);
  return checker;
}

std::optional<std::string> SyntaxChecker::error(std::string_view source, std::string_view filename) {
  // The source as the worker's request carries it: invalid UTF-8 replaced the same way (ASCII here,
  // so the checker's stdin encoding cannot matter).
  nlohmann::json request = {{"source", std::string(source)}, {"filename", std::string(filename)}};
  std::string line = request.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(mutex_);
  if (failures_ >= kMaxFailures) return std::nullopt;
  return ask(line);
}

std::optional<std::string> SyntaxChecker::ask(const std::string& request_line) {
  auto fail = [this]() -> std::optional<std::string> {
    process_.reset();  // kills and reaps it: the next check starts a fresh one
    ++failures_;
    return std::nullopt;
  };
  if (!process_) {
    auto started = Process::spawn(checker_spec(python_, worker_dir_, bytecode_prefix_));
    if (!started.ok()) return fail();
    process_ = std::make_unique<Process>(std::move(*started));
  }
  process_->write_stdin(request_line);
  std::string answer_line;
  if (process_->read_message(answer_line, answer_timeout_) != Process::ReadEvent::line) return fail();
  auto answer = nlohmann::json::parse(answer_line, nullptr, false);
  if (answer.is_discarded() || !answer.is_object()) return fail();
  failures_ = 0;
  if (auto it = answer.find("error"); it != answer.end() && it->is_string()) return it->get<std::string>();
  return std::nullopt;  // compiles, or {"unknown": ...}: the worker decides
}

Verdict syntax_error_verdict(const std::string& error) {
  // worker/kz_worker/loading.py's message for the same error.
  Verdict v = make_verdict(EvalStatus::compile_error, {Check::python_syntax}, "candidate is not valid Python: " + error);
  v.stage = "syntax_check";
  return v;
}

}  // namespace kz
