// `kz evolve`: the co-evolution loop. A Proposer writes reference modules from sampled PyTorch
// API sets, the Coder (acting as judge) tries each valid one m times, modules it solves sometimes
// but not always join the frontier buffer, and the Coder trains with CA-GRPO on frontier tasks.
// One iteration, as run_iteration in evolve.cpp reads top to bottom:
//
//   1. Proposer phase: API sets (weighted towards the Coder's weak APIs) -> modules -> validation
//      and dedup -> the judge's m attempts per kept module, evaluated -> p̂ -> Proposer rewards
//      (rl/proposer_reward.h), normalised per API set -> Proposer update (when trainable).
//   2. Frontier: kept modules with p̂ in the band (and no held-out look-alike) join the buffer.
//   3. Coder phase: frontier tasks (newest plus a replay share) -> G samples each -> evaluation ->
//      rewards and CA-GRPO advantages (rl/reward.h, rl/advantage.h) -> Coder update.
//   4. Every K iterations and at the last: the held-out suite (pass@1, fast_1), then a checkpoint.
//
// The Coder's samples are evaluated by the engine's worker pool in process, or by a kz serve-eval
// service ([eval] url).
//
// Data parallel, started as a rank of WORLD_SIZE > 1 (kz evolve --nproc N, kz launch, torchrun;
// docs/scale.md): each rank samples and evaluates tasks rank, rank + N, ... of every phase on its
// own device, the ranks all-gather the samples and so compute the same rewards and loop state,
// rank 0 alone runs the Proposer (its proposals shared) and writes the run dir, and every policy
// update deals each mini-batch's rows out among the ranks with the gradients averaged.
//
// Every evaluated Coder sample (judge and Coder phase) updates the per-API statistics that steer
// the next API sets. infra_error samples carry no reward and are counted, never trained on.
//
// Run dir (run_dir.h for the durability rules):
//   config.toml, eval.toml       the resolved configs (a resume reads these, not the original file)
//   run.json                     the run's description (for kz report)
//   metrics.jsonl                one row per phase per iteration (report.h lists the fields)
//   provenance.jsonl             one row per module and per kernel: iteration, phase, model and its
//                                optimiser steps, prompt, file, verdict, reward, advantage
//   iterations/iter-000001/      modules/<id>.py, kernels/<phase>/<task>/<i>.py, prompts/<hash>.json,
//                                the evaluations' results JSONL (phases judge, coder, heldout)
//   heldout/iter-000001/         the held-out measurement as kz bench writes it (summary.json, report.html)
//   checkpoints/                 the models and the loop's state
//
// Resume: the newest checkpoint is loaded, the logs are cut back to what it recorded, and the run
// goes on from the iteration after it. On the CPU with a fixed seed a killed and resumed run ends
// with the same metrics as one never killed (generation seeds derive from the run seed, the
// iteration and the task; the evaluations are deterministic without timing).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>

#include "kz/core/files.h"
#include "kz/core/status.h"

namespace kz::loop {

struct EvolveOptions {
  fs::path run_dir;
  fs::path config_path;               // a new run's config; empty with resume
  std::vector<std::string> overrides; // a new run's "section.key=VALUE" over its config (--set)
  bool resume = false;                // go on from run_dir's newest checkpoint
  std::optional<int64_t> iterations;  // the total the run reaches; nullopt: the config's run.iterations
  fs::path default_prompts_dir;       // used when the config's run.prompts_dir is empty
};

struct EvolveResult {
  int64_t iterations_done = 0;  // completed iterations of the run, earlier invocations included
  int64_t iterations_run = 0;   // of them, in this invocation
};

// Errors: a bad config (naming the key), a run dir that already holds a run (without resume) or
// none (with resume), a checkpoint that fails its manifest, a model or evaluator that cannot be
// loaded. A model that writes garbage is no error: it earns zero or negative rewards.
Result<EvolveResult> run_evolve(const EvolveOptions& options, std::ostream& progress);

}  // namespace kz::loop
