// `kz serve-model --model DIR [--port P]`: the in-process engine as an OpenAI-compatible endpoint
// (kz/llm/openai_server.h) until SIGINT or SIGTERM. Settings: configs/model.toml's [engine] and
// [serve], through --config and flags.
#include <fmt/format.h>
#include <signal.h>

#include <iostream>

#include "commands.h"
#include "kz/llm/engine_generator.h"
#include "kz/llm/openai_server.h"
#include "model_flags.h"

namespace kz::cli {
namespace {

struct ServeModelArgs {
  explicit ServeModelArgs(CLI::App& command) : settings(command) {}
  ModelFlags settings;
  fs::path model_dir;
};

int run(const ServeModelArgs& args) {
  // SIGINT/SIGTERM blocked here, before any thread starts, and taken by sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto options = args.settings.resolve();
  if (!options.ok()) return report_error(options.status());
  options->engine.model_dir = args.model_dir;
  OpenAIServerOptions& serve = options->serve;
  if (serve.model_name.empty()) serve.model_name = args.model_dir.filename().string();
  if (serve.model_name.empty()) serve.model_name = args.model_dir.parent_path().filename().string();
  if (auto status = serve.validate(); !status.is_ok()) return report_error(status);
  auto engine = model::Engine::load(options->engine);
  if (!engine.ok()) return report_error(engine.status());
  EngineGeneratorOptions generator_options;
  generator_options.max_batch = serve.max_batch;
  auto generator = make_engine_generator(*engine, generator_options);
  if (!generator.ok()) return report_error(generator.status());
  auto server = OpenAIServer::start(**generator, serve);
  if (!server.ok()) return report_error(server.status());
  std::cerr << fmt::format("kz: serving {} as \"{}\" on http://{}:{}/v1 (max batch {}); Ctrl-C stops\n",
                           (*engine)->describe(), serve.model_name, serve.host, (*server)->port(), serve.max_batch);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  auto counts = (*server)->counts();
  std::cerr << fmt::format("kz: stopping after {} requests in {} batches\n", counts.requests, counts.batches);
  (*server)->stop();
  return kExitOk;
}

}  // namespace

Action add_serve_model_command(CLI::App& app) {
  auto* command = app.add_subcommand("serve-model", "Serve a local checkpoint as an OpenAI-compatible endpoint");
  auto args = std::make_shared<ServeModelArgs>(*command);
  command->add_option("--model", args->model_dir, "checkpoint directory (Hugging Face layout)")->required();
  ModelFlags& settings = args->settings;
  settings.add("--port", "serve.port", "TCP port (default 0: any free port, printed)")->check(CLI::Range(0, 65535));
  settings.add("--host", "serve.host", "address to listen on (default 127.0.0.1: this machine only)");
  settings.add("--device", "engine.device", "cpu, cuda or cuda:N (default cpu)");
  settings.add("--dtype", "engine.dtype", "fp32, bf16 or fp16 (default: the checkpoint's)");
  settings.add("--cuda-graph,!--no-cuda-graph", "engine.cuda_graph", "decode through a CUDA graph on GPUs (default on)");
  settings.add("--max-batch-rows", "engine.max_batch_rows",
               "rows decoded at once across all requests; 0: no bound (default 64)");
  settings.add("--served-model-name", "serve.served_model_name",
               "the model id /v1/models lists (default: the directory's name)");
  settings.add("--max-batch", "serve.max_batch", "completions generated together at most (default 32)")
      ->check(CLI::PositiveNumber);
  settings.add("--batch-wait-ms", "serve.batch_wait_ms",
               "how long a request waits for others to batch with (default 5)")
      ->check(CLI::NonNegativeNumber);
  settings.add("--concurrent-batches", "serve.concurrent_batches",
               "batches generated at once; the engine merges them, so late requests join (default 16)")
      ->check(CLI::PositiveNumber);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
