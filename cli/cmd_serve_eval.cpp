// `kz serve-eval --port P`: the evaluation service (kz/eval/service.h) until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "commands.h"
#include "kz/eval/service.h"

namespace kz::cli {
namespace {

struct ServeArgs {
  ServiceOptions service;
  EvalFlags flags;
};

// Blocks SIGINT and SIGTERM in this thread, and so in every thread started after it: the main
// thread alone takes them, with sigwait, and stops the service in an orderly way.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Kills the process group of every descendant of this process. In `kz serve-eval` they are the
// evaluation workers and fork servers, each the leader of its own group (nvcc and the like die
// with it), and the zygotes whose children the fork servers are (kz/sandbox/process.h).
void kill_worker_groups() {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = std::atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    auto close = text.rfind(')');  // "pid (comm) state ppid ...": comm may hold spaces
    if (close == std::string::npos) continue;
    char state = 0;
    pid_t ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %d", &state, &ppid) == 2) children[ppid].push_back(pid);
  }
  std::vector<pid_t> frontier = children[getpid()];
  while (!frontier.empty()) {
    pid_t pid = frontier.back();
    frontier.pop_back();
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    for (pid_t child : children[pid]) frontier.push_back(child);
  }
}

// Stops the service without waiting out running evaluations: nobody could fetch their verdicts
// after the exit. Workers are killed until stop() returns (a thread may start one meanwhile).
void stop_now(EvalService& service) {
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    service.stop();
    stopped = true;
  });
  while (!stopped) {
    kill_worker_groups();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stopper.join();
}

int run(const ServeArgs& args) {
  EvalFlags flags = args.flags;
  ServiceOptions service_options = args.service;
  auto devices = take_device_list(flags);  // several GPUs: a pool of workers on each
  if (!devices.ok()) return report_error(devices.status());
  service_options.devices = *devices;
  auto options = resolve_eval_options(flags);
  if (!options.ok()) return report_error(options.status());
  sigset_t stop_signals = block_stop_signals();
  auto service = EvalService::start(*options, service_options);
  if (!service.ok()) return report_error(service.status());
  const VerdictCache* cache = (*service)->cache();
  std::string where = devices->size() > 1
                          ? fmt::format("devices {}, {} workers each", fmt::join(*devices, ","), (*service)->workers())
                          : fmt::format("device {}, {} workers", options->device, (*service)->workers());
  std::cerr << fmt::format("kz: serving evaluations on http://{}:{}/v1 ({}, {} cuda pre-builds at once, cache {}); "
                           "Ctrl-C stops\n",
                           service_options.host, (*service)->port(), where, (*service)->compile_jobs(),
                           cache ? cache->path().string() : "off");
  if (cache && cache->rebuilt())
    std::cerr << fmt::format("kz: the verdict cache was corrupt: moved to {}.corrupt, started afresh\n",
                             cache->path().string());
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  auto counts = (*service)->counts();
  std::cerr << fmt::format("kz: stopping: {} running evaluations cancelled, {} queued dropped\n", counts.running,
                           counts.queued);
  stop_now(**service);
  return kExitOk;
}

}  // namespace

Action add_serve_eval_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* command = app.add_subcommand("serve-eval", "Serve evaluations over HTTP/JSON (POST /v1/evaluations)");
  command->add_option("--port", args->service.port, "TCP port (0: any free port, printed)")
      ->required()
      ->check(CLI::Range(0, 65535));
  command->add_option("--host", args->service.host, "address to listen on (default 127.0.0.1: this machine only)");
  command->add_option("--workers", args->service.workers,
                      "evaluations at once, per device (default: cores on cpu, [tuning] gpu_jobs on a GPU)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--prebuild", args->service.prebuild,
                      "pre-build `cuda` candidates beside the evaluations: gpu (on a GPU only), always, never "
                      "(default gpu)")
      ->check(CLI::IsMember({"gpu", "always", "never"}));
  command->add_option("--compile-jobs", args->service.compile_jobs, "pre-builds at once (default: the CPU's cores)")
      ->check(CLI::NonNegativeNumber);
  add_eval_flags(*command, args->flags);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
