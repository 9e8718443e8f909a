// `kz serve-model --model DIR --port P`: the in-process engine as an OpenAI-compatible endpoint
// (kz/llm/openai_server.h) until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <signal.h>

#include <iostream>

#include "commands.h"
#include "kz/llm/engine_generator.h"
#include "kz/llm/openai_server.h"

namespace kz::cli {
namespace {

struct ServeModelArgs {
  model::EngineOptions engine;
  OpenAIServerOptions server;
};

int run(ServeModelArgs args) {
  // SIGINT/SIGTERM blocked here, before any thread starts, and taken by sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (args.server.model_name.empty()) args.server.model_name = args.engine.model_dir.filename().string();
  if (args.server.model_name.empty()) args.server.model_name = args.engine.model_dir.parent_path().filename().string();
  if (auto status = args.server.validate(); !status.is_ok()) return report_error(status);
  auto engine = model::Engine::load(args.engine);
  if (!engine.ok()) return report_error(engine.status());
  EngineGeneratorOptions generator_options;
  generator_options.max_batch = args.server.max_batch;
  auto generator = make_engine_generator(*engine, generator_options);
  if (!generator.ok()) return report_error(generator.status());
  auto server = OpenAIServer::start(**generator, args.server);
  if (!server.ok()) return report_error(server.status());
  std::cerr << fmt::format("kz: serving {} as \"{}\" on http://{}:{}/v1 (max batch {}); Ctrl-C stops\n",
                           (*engine)->describe(), args.server.model_name, args.server.host, (*server)->port(),
                           args.server.max_batch);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  auto counts = (*server)->counts();
  std::cerr << fmt::format("kz: stopping after {} requests in {} batches\n", counts.requests, counts.batches);
  (*server)->stop();
  return kExitOk;
}

}  // namespace

Action add_serve_model_command(CLI::App& app) {
  auto args = std::make_shared<ServeModelArgs>();
  args->server.model_name.clear();  // default: the checkpoint directory's name
  auto* command = app.add_subcommand("serve-model", "Serve a local checkpoint as an OpenAI-compatible endpoint");
  command->add_option("--model", args->engine.model_dir, "checkpoint directory (Hugging Face layout)")->required();
  command->add_option("--port", args->server.port, "TCP port (0: any free port, printed)")
      ->required()
      ->check(CLI::Range(0, 65535));
  command->add_option("--host", args->server.host, "address to listen on (default 127.0.0.1: this machine only)");
  command->add_option("--device", args->engine.device, "cpu, cuda or cuda:N (default cpu)");
  command->add_option("--dtype", args->engine.dtype, "fp32, bf16 or fp16 (default: the checkpoint's)");
  command->add_option("--served-model-name", args->server.model_name,
                      "the model id /v1/models lists (default: the directory's name)");
  command->add_option("--max-batch", args->server.max_batch, "completions generated together at most (default 32)")
      ->check(CLI::PositiveNumber);
  command->add_option("--batch-wait-ms", args->server.batch_wait_ms,
                      "how long a request waits for others to batch with (default 5)")
      ->check(CLI::NonNegativeNumber);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
