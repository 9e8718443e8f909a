// `kz eval REF CAND`: one candidate against one reference; a verdict line or --json.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "kz/core/files.h"
#include "kz/eval/evaluator.h"
#include "kz/task/task.h"

namespace kz::cli {
namespace {

struct EvalArgs {
  std::string reference, candidate;
  bool json = false;
  EvalFlags flags;
};

// Which end the timed samples took, and for "device_sync" why: the candidate's GPU work ran on
// past its stream's end (docs/evaluation.md, Timing); and how the launch spins ended.
std::string timing_end_note(const VerdictProfile& p) {
  std::string spin = p.launch_spin.empty() ? "" : ", launch spin: " + p.launch_spin;
  if (p.timing_end.empty()) return spin;
  if (p.timing_end != "device_sync") return ", end: " + p.timing_end + spin;
  return fmt::format(", end: device_sync, the candidate's gap {:.4f} ms against the reference's {:.4f} ms{}",
                     p.candidate_gap_ms, p.reference_gap_ms, spin);
}

void print_human(const Verdict& v) {
  std::cout << fmt::format("{}  {}  [{} on {}, policy {}]\n", v.task_id, status_name(v.status), v.format, v.device,
                           v.policy);
  if (v.custom_kernel_share) std::cout << fmt::format("custom kernel share {:.1f}%\n", 100 * *v.custom_kernel_share);
  if (v.speedup)
    std::cout << fmt::format("speedup {:.3f}x  candidate {:.4f} ms  reference {:.4f} ms  (median of {} runs{})\n",
                             *v.speedup, v.candidate_timing->median_ms, v.reference_timing->median_ms,
                             v.candidate_timing->runs, timing_end_note(v.profile));
  if (v.compile_speedup && v.compiled_reference_timing)
    std::cout << fmt::format("over torch.compile {:.3f}x  compiled reference {:.4f} ms\n", *v.compile_speedup,
                             v.compiled_reference_timing->median_ms);
  std::string checks;
  for (Check c : v.checks) checks += std::string(checks.empty() ? "" : ", ") + check_name(c);
  if (!checks.empty()) std::cout << "checks: " << checks << "\n";
  for (const auto& [check, why] : v.unchecked) std::cout << "unchecked: " << check_name(check) << " (" << why << ")\n";
  if (!v.message.empty()) std::cout << v.message << "\n";
}

int run(const EvalArgs& args) {
  auto options = resolve_eval_options(args.flags);
  if (!options.ok()) return report_error(options.status());
  auto tasks = load_tasks(args.reference);
  if (!tasks.ok()) return report_error(tasks.status());
  if (tasks->size() != 1)
    return report_error(invalid_argument(fmt::format("{} holds {} tasks; kz eval takes one (use eval-suite)",
                                                     args.reference, tasks->size())));
  auto source = read_file(args.candidate);
  if (!source.ok()) return report_error(source.status());
  auto evaluator = Evaluator::create(*options);
  if (!evaluator.ok()) return report_error(evaluator.status());
  auto verdict = evaluator->evaluate(tasks->front(), Candidate{args.candidate, *source});
  if (!verdict.ok()) return report_error(verdict.status());
  if (args.json)
    std::cout << to_json(*verdict).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    print_human(*verdict);
  return kExitOk;
}

}  // namespace

Action add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* command = app.add_subcommand("eval", "Evaluate one candidate against one reference module");
  command->add_option("REF", args->reference, "reference module (.py, or a one-row .jsonl)")->required();
  command->add_option("CAND", args->candidate, "candidate module defining ModelNew")->required();
  command->add_flag("--json", args->json, "print the verdict as one JSON object");
  add_eval_flags(*command, args->flags);
  return [args] { return run(*args); };
}

}  // namespace kz::cli
