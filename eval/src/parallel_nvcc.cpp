// kz-nvcc: nvcc's own plan with its host and device chains at once (kz/eval/parallel_nvcc.h).
#include "kz/eval/parallel_nvcc.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/core/parallel.h"
#include "kz/sandbox/process.h"

namespace kz::nvcc {
namespace {
namespace fs = std::filesystem;

constexpr std::string_view kCommandPrefix = "#$ ";

bool is_name_char(char c, bool first) {
  return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (!first && c >= '0' && c <= '9');
}

// Expands the $NAME or ${NAME} at line[i] (line[i] == '$') into `word`; false for anything else.
bool expand_variable(std::string_view line, size_t& i, const std::map<std::string, std::string>& variables,
                     std::string& word) {
  size_t start = i + 1;
  bool braced = start < line.size() && line[start] == '{';
  if (braced) ++start;
  size_t end = start;
  while (end < line.size() && is_name_char(line[end], end == start)) ++end;
  if (end == start) return false;
  auto found = variables.find(std::string(line.substr(start, end - start)));
  if (found == variables.end()) return false;
  if (braced) {
    if (end >= line.size() || line[end] != '}') return false;
    ++end;
  }
  word += found->second;
  i = end;
  return true;
}

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

bool has_word(const Command& command, std::string_view word) {
  return std::find(command.begin(), command.end(), word) != command.end();
}

// The value after `option` in `command` (nullopt where absent or last).
std::optional<std::string> value_after(const Command& command, std::string_view option) {
  auto it = std::find(command.begin(), command.end(), option);
  if (it == command.end() || it + 1 == command.end()) return std::nullopt;
  return *(it + 1);
}

enum class Step { host, device, final, unknown };

// What a command of nvcc's plan is, by its tool and, for the host compiler, its mode.
Step step_of(const Command& command) {
  std::string tool = base_name(command.front());
  if (tool == "cudafe++") return Step::host;
  if (tool == "cicc" || tool == "ptxas" || tool == "fatbinary") return Step::device;
  if (tool == "nvlink" || tool == "rm" || tool == "--") return Step::unknown;
  bool device = std::any_of(command.begin(), command.end(),
                            [](const std::string& word) { return word.starts_with("-D__CUDA_ARCH__="); });
  if (has_word(command, "-E")) return device ? Step::device : Step::host;
  if (has_word(command, "-c")) return Step::final;
  return Step::unknown;
}

// Options whose presence means a compile kz-nvcc does not run (their name, before any '=').
const std::set<std::string_view>& options_left_to_nvcc() {
  static const std::set<std::string_view> options = {
      "-E", "--preprocess", "-M", "--generate-dependencies", "-MM", "--generate-nonsystem-dependencies",
      "-MMD", "--generate-nonsystem-dependencies-with-compile", "-MT", "--dependency-target-name", "-MP",
      "--generate-dependency-targets", "--generate-dependencies-with-compile", "--dependency-output",
      "-dryrun", "--dryrun", "-keep", "--keep", "-keep-dir", "--keep-dir", "-save-temps", "--save-temps",
      "-time", "--time", "-v", "--verbose", "-rdc", "--relocatable-device-code", "-dc", "--device-c", "-dw",
      "--device-w", "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin", "-cuda", "--cuda", "-lib",
      "--lib", "-link", "--link", "-dlink", "--device-link", "-run", "--run", "-odir", "--output-directory",
      "-t", "--threads", "-optf", "--options-file", "-V", "--version", "-h", "--help", "-lto", "-dlto",
      "-Xnvlink", "--nvlink-options", "-split-compile", "--split-compile", "--output-file"};
  return options;
}

std::string option_name(const std::string& arg) { return arg.substr(0, arg.find('=')); }

struct Outcome {
  std::string stdout_text, stderr_text;
  int status = 0;  // nvcc's: the tool's exit code, 128 + signal where a signal ended it
};

// Whether to stop a chain now (its running step is then killed: its output will not be shown).
using Stop = std::function<bool()>;

// SIGINT, SIGTERM or SIGHUP while the steps run: kz-nvcc blocks them then, and a thread waits for
// them, so that the steps are killed and the keep dir removed before kz-nvcc ends by that signal.
std::atomic<int> stop_signal{0};

void wait_for_stop_signals() {
  static sigset_t signals;  // static: the waiting thread outlives run()
  sigemptyset(&signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, sig);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([] {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0) stop_signal = sig;
  }).detach();
}

[[noreturn]] void end_by_signal(int sig, const fs::path& keep_dir) {
  std::error_code ignored;
  fs::remove_all(keep_dir, ignored);
  std::signal(sig, SIG_DFL);
  sigset_t own;
  sigemptyset(&own);
  sigaddset(&own, sig);
  pthread_sigmask(SIG_UNBLOCK, &own, nullptr);
  ::raise(sig);
  std::_Exit(128 + sig);
}

// Runs a chain's commands one after another until one fails or `stop` says so. One Outcome per
// command run to its end.
std::vector<Outcome> run_chain(const std::vector<Command>& chain, const std::map<std::string, std::string>& env,
                               const Stop& stop) {
  std::vector<Outcome> outcomes;
  for (const Command& command : chain) {
    ProcessSpec spec;
    spec.argv = command;
    spec.env = env;
    // A group of its own, so that stopping a step stops its children too (gcc's cc1plus and as). A
    // compile stopped by a signal stops its steps itself (above); in a kz worker, whatever outlives
    // a killed kz-nvcc is killed with the worker's other descendants.
    spec.new_process_group = true;
    spec.output_tail_bytes = 64u << 20;
    Outcome outcome;
    Result<Process> process = Process::spawn(spec);
    if (!process.ok()) {
      outcome.stderr_text = fmt::format("kz-nvcc: cannot run {}: {}\n", command.front(), process.status().message());
      outcome.status = 1;
      outcomes.push_back(std::move(outcome));
      return outcomes;
    }
    std::optional<ExitInfo> exit;
    while (!(exit = process->wait_for(std::chrono::milliseconds(50)))) {
      if (stop && stop()) {
        process->kill_and_reap();
        return outcomes;
      }
    }
    outcome.stdout_text = process->stdout_tail();
    outcome.stderr_text = process->stderr_tail();
    outcome.status = exit->exited ? exit->exit_code : 128 + exit->term_signal;
    bool failed = outcome.status != 0;
    outcomes.push_back(std::move(outcome));
    if (failed) return outcomes;
  }
  return outcomes;
}

// Writes each outcome's output as nvcc would have let its tool write it; the first failure's status.
int emit(const std::vector<Outcome>& outcomes) {
  for (const Outcome& outcome : outcomes) {
    std::fwrite(outcome.stdout_text.data(), 1, outcome.stdout_text.size(), stdout);
    std::fwrite(outcome.stderr_text.data(), 1, outcome.stderr_text.size(), stderr);
    if (outcome.status != 0) return outcome.status;
  }
  return 0;
}

bool chain_failed(const std::vector<Outcome>& outcomes, size_t length) {
  return outcomes.size() < length || (!outcomes.empty() && outcomes.back().status != 0);
}

// $KZ_NVCC_REPORT, where set: one JSON line per compile, what kz-nvcc did (tests, diagnosis).
void report(const nlohmann::json& line) {
  const char* path = std::getenv("KZ_NVCC_REPORT");
  if (!path || !*path) return;
  if (FILE* file = std::fopen(path, "a")) {
    std::fprintf(file, "%s\n", line.dump().c_str());
    std::fclose(file);
  }
}

[[noreturn]] void exec_nvcc(const std::string& real_nvcc, const std::vector<std::string>& args,
                            const fs::path& keep_dir, const std::string& why) {
  report({{"parallel", false}, {"why", why}});
  std::error_code ignored;
  if (!keep_dir.empty()) fs::remove_all(keep_dir, ignored);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(real_nvcc.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(real_nvcc.c_str(), argv.data());
  std::fprintf(stderr, "kz-nvcc: cannot run %s: %s\n", real_nvcc.c_str(), std::strerror(errno));
  std::_Exit(127);
}

// Runnable tasks on the host, this one included (/proc/stat's procs_running; 0 where unknown): the
// most of three looks 5 ms apart, since one look may fall between two bursts of other work.
int runnable_tasks() {
  int most = 0;
  for (int look = 0; look < 3; ++look) {
    if (look > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Result<std::string> stat = read_file("/proc/stat");
    size_t at = stat.ok() ? stat->find("procs_running ") : std::string::npos;
    if (at != std::string::npos) most = std::max(most, std::atoi(stat->c_str() + at + std::strlen("procs_running ")));
  }
  return most;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string process_name(pid_t pid) {
  Result<std::string> name = read_file(fmt::format("/proc/{}/comm", pid));
  return name.ok() && !name->empty() ? name->substr(0, name->size() - 1) : std::string();
}

// A failed compile fails ninja's build: ninja starts no other step but waits for those already
// running, in load_inline's build the host compile of main.cpp (~2 CPU-seconds with the lighter
// headers, ~20 with the full ones on a slow host), whose object nothing will link. So kz-nvcc ends
// them: the other jobs of the ninja that started it (each `/bin/sh -c` in a process group of its
// own) that name this build's directory (its working directory, where ninja runs). Nothing where no
// ninja started it.
void stop_the_builds_other_steps() {
  pid_t own_job = ::getpid();
  std::optional<pid_t> ninja = ::getppid();
  for (int up = 0; up < 2 && ninja && process_name(*ninja) != "ninja"; ++up) {  // through the job's shell
    own_job = *ninja;
    ninja = parent_process(*ninja);
  }
  std::error_code error;
  fs::path build_dir = fs::current_path(error);
  if (!ninja || process_name(*ninja) != "ninja" || error) return;
  Result<std::string> children = read_file(fmt::format("/proc/{}/task/{}/children", *ninja, *ninja));
  if (!children.ok()) return;
  std::vector<pid_t> others;
  std::istringstream pids(*children);
  for (pid_t pid; pids >> pid;) {
    Result<std::string> arguments = read_file(fmt::format("/proc/{}/cmdline", pid));
    if (pid != own_job && arguments.ok() && arguments->find(build_dir.string() + "/") != std::string::npos)
      others.push_back(pid);
  }
  if (others.empty()) return;
  std::fprintf(stderr, "kz-nvcc: this compile failed, so the build's other steps are ended: nothing would link "
               "their output\n");
  std::fflush(nullptr);
  // This step's output first: ninja prints each step's output as it reaps it, so the other steps
  // end only once ninja has reaped this one (its job: this process, or the shell that ran it), by a
  // helper process that waits for that (the job gone from /proc: a zombie until reaped). The helper
  // holds none of ninja's pipes.
  if (::fork() != 0) return;  // this process exits next; a failed fork ends nothing
  int nothing = ::open("/dev/null", O_RDWR);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(nothing, fd);
  for (int waited_ms = 0; ::kill(own_job, 0) == 0; waited_ms += 5) {
    if (waited_ms >= 30000) ::_exit(0);  // never reaped: ninja is gone or stuck, and the pids may be others' by then
    ::usleep(5000);
  }
  // SIGKILL to each step's process group: ninja reads a step ended by SIGTERM or SIGINT as the
  // user's interrupt, and would print "interrupted by user" in place of this compile's messages.
  for (pid_t pid : others) {
    if (::kill(-pid, SIGKILL) != 0) ::kill(pid, SIGKILL);
  }
  ::_exit(0);
}

// Removes the keep dir however run() ends.
struct TemporaryDir {
  fs::path path;
  ~TemporaryDir() {
    std::error_code ignored;
    if (!path.empty()) fs::remove_all(path, ignored);
  }
};

}  // namespace

std::optional<Command> split_command(std::string_view line, const std::map<std::string, std::string>& variables) {
  Command words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size();) {
    char c = line[i];
    if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      ++i;
    } else if (c == '\'') {
      size_t close = line.find('\'', i + 1);
      if (close == std::string_view::npos) return std::nullopt;
      word += line.substr(i + 1, close - i - 1);
      in_word = true;
      i = close + 1;
    } else if (c == '"') {
      in_word = true;
      for (++i; i < line.size() && line[i] != '"';) {
        if (line[i] == '\\' && i + 1 < line.size() && std::string_view("\"\\$`").find(line[i + 1]) != std::string_view::npos) {
          word += line[i + 1];
          i += 2;
        } else if (line[i] == '$') {
          if (!expand_variable(line, i, variables, word)) return std::nullopt;
        } else if (line[i] == '`') {
          return std::nullopt;
        } else {
          word += line[i++];
        }
      }
      if (i >= line.size()) return std::nullopt;  // unterminated
      ++i;
    } else if (c == '$') {
      if (!expand_variable(line, i, variables, word)) return std::nullopt;
      in_word = true;
    } else if (std::string_view("\\`;|&<>()*?[]{}~#!\n").find(c) != std::string_view::npos) {
      return std::nullopt;  // sh would read these otherwise
    } else {
      word += c;
      in_word = true;
      ++i;
    }
  }
  if (in_word) words.push_back(std::move(word));
  if (words.empty()) return std::nullopt;
  return words;
}

Result<Plan> plan_from_dryrun(std::string_view dryrun_output, const std::string& own_module_id_file) {
  Plan plan;
  std::vector<Command> commands;
  for (size_t start = 0, end; start < dryrun_output.size(); start = end + 1) {
    end = std::min(dryrun_output.find('\n', start), dryrun_output.size());
    std::string_view line = dryrun_output.substr(start, end - start);
    if (line.empty()) continue;
    if (!line.starts_with(kCommandPrefix)) {
      return invalid_argument(fmt::format("nvcc printed more than its plan: '{}'", line));
    }
    line.remove_prefix(kCommandPrefix.size());
    size_t equals = line.find('=');
    size_t name_end = 0;
    while (name_end < line.size() && is_name_char(line[name_end], name_end == 0)) ++name_end;
    if (name_end > 0 && name_end == equals) {  // NAME=value: one of nvcc.profile's variables
      // Only ahead of the steps, where nvcc prints them; the value as printed (_SPACE_ is " ").
      if (!commands.empty()) return invalid_argument(fmt::format("a variable among nvcc's steps: '{}'", line));
      plan.variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
      continue;
    }
    std::optional<Command> command = split_command(line, plan.variables);
    if (!command) return invalid_argument(fmt::format("a command kz-nvcc does not read: '{}'", line));
    commands.push_back(std::move(*command));
  }

  bool device_seen = false;
  for (const Command& command : commands) {
    Step step = step_of(command);
    if (!plan.final_commands.empty() || step == Step::unknown) {
      return invalid_argument(fmt::format("an unexpected step in nvcc's plan: {}", command.front()));
    }
    if (step == Step::host) {
      if (device_seen) return invalid_argument("a host step after a device step in nvcc's plan");
      plan.host_chain.push_back(command);
    } else if (step == Step::device) {
      device_seen = true;
      plan.device_chain.push_back(command);
    } else {
      plan.final_commands.push_back(command);
    }
  }
  size_t front_ends = std::count_if(plan.host_chain.begin(), plan.host_chain.end(),
                                    [](const Command& c) { return base_name(c.front()) == "cudafe++"; });
  if (front_ends != 1 || base_name(plan.host_chain.back().front()) != "cudafe++" ||
      !has_word(plan.host_chain.back(), "--gen_module_id_file") || plan.final_commands.size() != 1) {
    return invalid_argument("nvcc's plan is not one host front end and one host compile");
  }
  plan.module_id_file = value_after(plan.host_chain.back(), "--module_id_file_name").value_or("");
  size_t device_front_ends = 0;
  for (const Command& command : plan.device_chain) {
    if (base_name(command.front()) != "cicc") continue;
    ++device_front_ends;
    if (has_word(command, "--gen_module_id_file") || plan.module_id_file.empty() ||
        value_after(command, "--module_id_file_name") != plan.module_id_file) {
      return invalid_argument("cicc does not read cudafe++'s module id in nvcc's plan");
    }
  }
  if (device_front_ends == 0) return invalid_argument("no device front end in nvcc's plan");
  plan.own_module_id_file = own_module_id_file;
  return plan;
}

std::vector<Command> device_chain_with_own_id(const Plan& plan) {
  std::vector<Command> chain = plan.device_chain;
  for (Command& command : chain) {
    if (base_name(command.front()) != "cicc") continue;
    auto it = std::find(command.begin(), command.end(), "--module_id_file_name");
    *(it + 1) = plan.own_module_id_file;
    command.insert(it, "--gen_module_id_file");
  }
  return chain;
}

std::optional<Invocation> plan_invocation(const std::vector<std::string>& args, const std::string& keep_dir) {
  Invocation invocation;
  std::optional<std::string> depfile, object;
  bool compile_only = false, dependencies = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_left_to_nvcc().contains(option_name(arg))) return std::nullopt;
    // nvcc hands some values to sh unquoted (-Xcompiler's): there $ expands, words split and a
    // newline starts a line of its own, which kz-nvcc, reading nvcc's printed plan, would not do.
    if (arg.find_first_of("$`\\\n") != std::string::npos) return std::nullopt;
    if (arg == "-MD") {
      if (dependencies) return std::nullopt;  // nvcc warns of a repeated option: let it
      dependencies = true;
      continue;
    }
    if (arg == "-MF") {
      if (i + 1 == args.size() || depfile) return std::nullopt;
      depfile = args[++i];
      continue;
    }
    if (arg.starts_with("-MF") || arg.starts_with("-MD")) return std::nullopt;
    if (arg == "-c" || arg == "--compile") compile_only = true;
    if (arg == "-o" && i + 1 < args.size()) object = args[i + 1];
    invocation.dryrun_arguments.push_back(arg);
  }
  if (!compile_only || !object || dependencies != depfile.has_value()) return std::nullopt;
  // The dependency file's "target : ..." would not parse back with a ':' or blank in the target.
  if (dependencies && object->find_first_of(": \t") != std::string::npos) return std::nullopt;
  if (dependencies) invocation.dependencies = DependencyFile{*depfile, *object};
  for (const char* arg : {"--dryrun", "--keep", "--keep-dir"}) invocation.dryrun_arguments.push_back(arg);
  invocation.dryrun_arguments.push_back(keep_dir);
  return invocation;
}

Command with_dependency_output(Command command, const std::string& depfile, const std::string& target) {
  for (const std::string& word : {std::string("-MD"), std::string("-MF"), depfile, std::string("-MT"), target}) {
    command.push_back(word);
  }
  return command;
}

Result<std::string> merge_dependency_files(const std::vector<std::string>& gcc_depfiles, const std::string& target) {
  std::vector<std::string> dependencies;
  std::set<std::string> seen;
  for (const std::string& path : gcc_depfiles) {
    Result<std::string> text = read_file(path);
    if (!text.ok()) return text.status();
    size_t colon = text->find(": ");
    if (colon == std::string::npos) return invalid_argument(fmt::format("{}: no 'target:' in the dependency file", path));
    // Make syntax: backslash-newline continues the line, backslash-space is a space in a name.
    std::string name;
    auto flush = [&] {
      if (!name.empty() && seen.insert(name).second) dependencies.push_back(name);
      name.clear();
    };
    for (size_t i = colon + 1; i < text->size(); ++i) {
      char c = (*text)[i];
      if (c == '\\' && i + 1 < text->size() && ((*text)[i + 1] == '\n' || (*text)[i + 1] == ' ')) {
        if ((*text)[i + 1] == ' ') name += "\\ ";
        else flush();
        ++i;
      } else if (c == ' ' || c == '\n' || c == '\t') {
        flush();
      } else {
        name += c;
      }
    }
    flush();
  }
  std::string out = target + " :";
  for (size_t i = 0; i < dependencies.size(); ++i) {
    out += (i == 0 ? " " : " \\\n    ") + dependencies[i];
  }
  return out + "\n";
}

bool side_by_side(std::string_view policy, const std::function<int()>& running, int cores) {
  if (policy == "always") return true;
  if (policy == "never") return false;
  return running() < cores;
}

bool wait_for_idle_core(const std::function<bool()>& idle, const std::function<bool()>& host_done,
                        const std::function<void()>& pause, int in_a_row) {
  for (int idle_looks = 0;;) {
    if (host_done()) return false;
    idle_looks = idle() ? idle_looks + 1 : 0;
    if (idle_looks >= in_a_row) return true;
    pause();
  }
}

int run(const std::string& real_nvcc, const std::vector<std::string>& args) {
  auto entered = std::chrono::steady_clock::now();
  const char* policy_text = std::getenv("KZ_NVCC_SIDE_BY_SIDE");
  const std::string policy = policy_text ? policy_text : "idle";
  if (policy == "never") exec_nvcc(real_nvcc, args, {}, "KZ_NVCC_SIDE_BY_SIDE=never");
  const int cores = cpu_cores();  // the host's
  std::string keep_template = (fs::path(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") / "kz-nvcc-XXXXXX").string();
  if (!::mkdtemp(keep_template.data())) exec_nvcc(real_nvcc, args, {}, "no temporary directory");
  TemporaryDir keep{keep_template};
  std::optional<Invocation> invocation = plan_invocation(args, keep.path.string());
  if (!invocation) exec_nvcc(real_nvcc, args, keep.path, "not a one-file compile kz-nvcc runs");

  std::map<std::string, std::string> environment = current_environment();
  Command dryrun{real_nvcc};
  dryrun.insert(dryrun.end(), invocation->dryrun_arguments.begin(), invocation->dryrun_arguments.end());
  std::vector<Outcome> planned = run_chain({dryrun}, environment, {});
  if (planned.size() != 1 || planned[0].status != 0) exec_nvcc(real_nvcc, args, keep.path, "nvcc --dryrun failed");
  Result<Plan> plan = plan_from_dryrun(planned[0].stderr_text, (keep.path / "kz-device.module_id").string());
  if (!plan.ok()) exec_nvcc(real_nvcc, args, keep.path, plan.status().message());
  for (const auto& [name, value] : plan->variables) environment[name] = value;
  // What the steps leave in TMPDIR (cicc's bitcode, when it is killed because cudafe++ failed) goes
  // with the keep dir.
  environment["TMPDIR"] = keep.path.string();

  std::vector<std::string> depfiles;
  if (invocation->dependencies) {
    // Each preprocessing writes its header list.
    auto preprocessed = [&](std::vector<Command>& chain, const std::string& side) {
      for (size_t i = 0; i < chain.size(); ++i) {
        if (!has_word(chain[i], "-E")) continue;
        depfiles.push_back((keep.path / fmt::format("kz-{}-{}.d", side, i)).string());
        chain[i] = with_dependency_output(std::move(chain[i]), depfiles.back(), invocation->dependencies->target);
      }
    };
    preprocessed(plan->device_chain, "device");  // nvcc's file lists the device side's headers first
    preprocessed(plan->host_chain, "host");
  }

  auto started = std::chrono::steady_clock::now();
  wait_for_stop_signals();  // not before: nvcc exec'd in its place would inherit them blocked
  Stop signalled = [] { return stop_signal.load() != 0; };
  std::atomic<bool> host_failed = false, host_done = false;
  std::mutex host_mutex;
  std::condition_variable host_ended;  // wakes the wait below at once when the host chain ends
  auto pause = [&] {
    std::unique_lock lock(host_mutex);
    host_ended.wait_for(lock, std::chrono::milliseconds(50), [&] { return host_done.load(); });
  };
  std::vector<Outcome> device;
  double device_s = 0, device_started_s = 0;
  bool parallel = false;
  std::thread device_thread([&] {
    // A core idle for three looks 50 ms apart (each the most of three: runnable_tasks).
    parallel = wait_for_idle_core([&] { return side_by_side(policy, runnable_tasks, cores); },
                                  [&] { return host_done || signalled(); }, pause, policy == "always" ? 1 : 3);
    if (host_failed || signalled()) return;  // nvcc would have stopped before any device step
    device_started_s = seconds_since(started);
    // After the host chain, nvcc's own device chain: it reads the module id cudafe++ wrote.
    device = parallel ? run_chain(device_chain_with_own_id(*plan), environment, [&] { return host_failed || signalled(); })
                      : run_chain(plan->device_chain, environment, signalled);
    device_s = seconds_since(started);
  });
  std::vector<Outcome> host = run_chain(plan->host_chain, environment, signalled);
  double host_s = seconds_since(started);
  if (chain_failed(host, plan->host_chain.size())) host_failed = true;
  {
    std::lock_guard lock(host_mutex);
    host_done = true;  // after host_failed: the device thread reads both
  }
  host_ended.notify_all();
  device_thread.join();
  if (signalled()) end_by_signal(stop_signal, keep.path);
  // Seconds: planning (`nvcc --dryrun`) before the chains' start, then each from that start.
  nlohmann::json line = {{"parallel", parallel},
                         {"plan_s", std::chrono::duration<double>(started - entered).count()},
                         {"host_chain_s", host_s},
                         {"device_chain_started_s", device_started_s},
                         {"device_chain_s", device_s}};
  if (host_failed) {  // nvcc would have stopped there, before any device step
    line["status"] = emit(host);
    report(line);
    stop_the_builds_other_steps();
    return line["status"];
  }
  if (parallel && !chain_failed(device, plan->device_chain.size())) {
    Result<std::string> host_id = read_file(plan->module_id_file), device_id = read_file(plan->own_module_id_file);
    line["module_ids_agree"] = host_id.ok() && device_id.ok() && *host_id == *device_id;
    if (!line["module_ids_agree"]) {  // again, with cudafe++'s id
      double rerun_started_s = seconds_since(started);
      device = run_chain(plan->device_chain, environment, signalled);
      line["device_rerun_s"] = seconds_since(started) - rerun_started_s;
    }
  }
  if (signalled()) end_by_signal(stop_signal, keep.path);
  int status = emit(host);
  if (status == 0) status = emit(device);
  if (status == 0) {
    line["final_started_s"] = seconds_since(started);  // the host compile's start
    std::vector<Outcome> final_outcomes = run_chain(plan->final_commands, environment, signalled);
    if (signalled()) end_by_signal(stop_signal, keep.path);
    status = emit(final_outcomes);
  }
  if (status == 0 && invocation->dependencies) {
    Result<std::string> merged = merge_dependency_files(depfiles, invocation->dependencies->target);
    Status written = merged.ok() ? write_file_atomic(invocation->dependencies->path, *merged) : merged.status();
    if (!written.is_ok()) {
      std::fprintf(stderr, "kz-nvcc: the dependency file %s: %s\n", invocation->dependencies->path.c_str(),
                   written.message().c_str());
      status = 1;
    }
  }
  line["status"] = status;
  line["total_s"] = seconds_since(started);
  report(line);
  if (status != 0) stop_the_builds_other_steps();
  return status;
}

}  // namespace kz::nvcc
