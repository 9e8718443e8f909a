// The configuration of `kz evolve`: one TOML file, every key with a written default
// (configs/evolve-tiny-cpu.toml, configs/evolve-gpu-small.toml). Unknown keys, wrong types and
// values out of range are errors naming the key. The resolved config is saved in the run dir
// (config.toml) and a resumed run reads it from there.
//
// Sections: [run] seeds and cadence, [heldout] the measurement suite, [proposer] and [coder]
// each role's model, sampling and training ([*.lora], [*.train], [*.update]), [api_sampler],
// [api_stats] and [frontier] the curriculum, [reward] the Coder's CA-GRPO reward and
// [proposer_reward] the Proposer's, [eval] the evaluation engine.
#pragma once

#include <cstdint>
#include <string>

#include "kz/core/config_fields.h"
#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/curriculum/api_sampler.h"
#include "kz/curriculum/api_stats.h"
#include "kz/curriculum/frontier.h"
#include "kz/loop/policy.h"
#include "kz/rl/proposer_reward.h"
#include "kz/rl/reward.h"

namespace kz::loop {

// A role's model and how it samples. A trainable role's update trains softmax(logits /
// temperature), the distribution its samples come from; it samples with top_p 1 and a temperature
// above 0 (validate() refuses top-p truncation and greedy decoding, which it cannot follow).
struct RoleConfig {
  PolicyOptions policy;
  std::string lr_schedule = "constant";  // constant | warmup_cosine (policy.train.schedule)
  double temperature = 1.0;
  double top_p = 1.0;
  int max_tokens = 1024;
};

struct EvolveConfig {
  // [run]
  uint64_t seed = 1;                 // every seed of the run derives from it
  int64_t iterations = 3;            // the total a run reaches when --iterations is not given
  // The run's training budget: it stops after the iteration in which its training evaluations
  // (the judge's and the Coder phase's, not the held-out suite's) reach this many; 0: no budget.
  // Runs compared at equal cost (the ablations) share it.
  int64_t max_evaluations = 0;
  int64_t heldout_every = 1;         // K: held-out evaluation and checkpoint every K iterations (and at the last)
  int checkpoint_keep = 2;           // checkpoints kept in the run dir
  std::string format = "triton";     // the Coder's kernel format: triton, cuda-rtc or cuda
  fs::path prompts_dir;              // "": the source tree's prompts/
  fs::path catalogue;                // "": the bundled API catalogue
  std::vector<std::string> apis;     // the catalogue's APIs the Proposer draws from; []: all of them
  bool shared_policy = false;        // one model plays both roles ([proposer]'s model and training)

  // [heldout]
  fs::path heldout_suite = "suite/kzbench";  // a suite dir (level folders) or a KernelBench level folder
  int heldout_tasks = 0;             // the first N tasks only; 0: all
  int heldout_samples = 1;           // samples per task (pass@1 and fast_1 are over them)
  double heldout_temperature = 0.0;  // 0: greedy
  bool heldout_at_start = true;      // also before the first iteration (iteration 0): the untrained start

  // [proposer]
  RoleConfig proposer;
  int api_sets = 2;                  // API sets drawn per iteration
  int modules_per_set = 4;           // the Proposer's replies per API set (its GRPO group)
  int level = 1;                     // KernelBench level named in the Proposer's prompt
  int judge_attempts = 4;            // m: Coder attempts per valid module, for p̂
  double dedup_threshold = 0.8;      // near-duplicate modules are rejected (curriculum/dedup.h)
  rl::ProposerRewardOptions proposer_reward;
  curriculum::ApiSamplerOptions api_sampler;
  curriculum::ApiStatsOptions api_stats;
  curriculum::FrontierOptions frontier;

  // [coder]
  RoleConfig coder;
  int tasks_per_iteration = 4;       // frontier tasks (replay included) per Coder phase
  // Where the Coder's tasks come from: "frontier" (the Proposer's modules in the band, the
  // co-evolution) or "static" (the ablation: a fixed suite, `static_suite`, tasks_per_iteration of
  // it per iteration in a seeded order that cycles; no Proposer phase runs).
  std::string curriculum = "frontier";
  fs::path static_suite;             // a suite dir (level folders or .py files); "static" only
  int group_size = 4;                // G: samples per task
  // Tasks per generate() call of the Coder (judge and Coder phase); each batch is evaluated while
  // the next is generated. 0: all in one call, no overlap. Overlap only where the engine's memory
  // and the evaluations' fit on the card together (the evaluations' admission counts only theirs).
  int generation_batch = 0;
  rl::RewardOptions reward;
  std::string reward_mode = "ca_grpo";  // ca_grpo | ungated | correctness_only

  // [eval]
  fs::path eval_config;              // an evaluation TOML (configs/eval.toml's keys); "": defaults
  std::string eval_device = "cpu";   // cpu or cuda:N
  int eval_jobs = 0;                 // evaluations at once; 0: the engine's default
  // A kz serve-eval service (http://host:port) for the Coder's samples (judge, Coder phase,
  // held-out); "": the engine's worker pool in this process. The Proposer's modules are validated
  // here either way, on eval_device.
  std::string eval_url;

  Status validate() const;
};

// The table of every key (for reading and for printing the resolved config).
ConfigTable evolve_config_table(EvolveConfig& config);
// Defaults <- the file <- `overrides` ("section.key=VALUE", kz evolve --set). Errors name the file
// or the override, and the key; the result is validated.
Result<EvolveConfig> load_evolve_config(const fs::path& path, const std::vector<std::string>& overrides = {});
// Every key with its value, as TOML (reads back to the same config).
std::string evolve_config_to_toml(const EvolveConfig& config);

}  // namespace kz::loop
