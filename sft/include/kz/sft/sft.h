// `kz sft`: supervised training of a Coder or a Proposer on the teacher's corpus, loss on the
// completion tokens only (docs/sft.md). A torch-free header: only src/sft.cpp includes libtorch.
//
// One run, top to bottom:
//   model     [model] init: a preset written fresh with the trained tokenizer (OUT/init), or a
//             Hugging Face checkpoint dir
//   data      the corpus -> modules split into train / eval -> prompt/completion pairs
//             (examples.h) -> the plan of steps (batches.h)
//   train     per step: forward/backward of each micro-batch (nll, token_mean over the step),
//             clip, AdamW at the warm-up + cosine learning rate; every log_every steps a
//             metrics row, every eval_every the evaluation loss, every checkpoint_every a
//             checkpoint
//   final     OUT/final: a Hugging Face checkpoint (config.json, generation_config.json,
//             model.safetensors, tokenizer.json, tokenizer_config.json) that transformers loads
//
// The output dir:
//   config.toml               the resolved config (every key); --resume reads it
//   init/                     the fresh model (a preset init only)
//   metrics.jsonl             {"kind": "train", step, epoch, loss, lr, grad_norm, tokens (every
//                             real token), trained_tokens (the completions'), tokens_per_s,
//                             elapsed_s} per log_every steps and {"kind": "eval", step, eval_loss,
//                             eval_tokens, examples}
//   checkpoints/iter-N/       model/ (Hugging Face checkpoint), trainer/ (optimiser state),
//                             state.json; N is the optimiser step. checkpoints/LATEST names the
//                             newest (loop/run_dir.h: durable against a kill at any moment)
//   final/                    the trained model
//   summary.json              SftReport as JSON
//
// Data parallel: started as a rank of WORLD_SIZE > 1 (kz launch, torchrun, Slurm; docs/scale.md),
// every rank trains on its share of each step's rows, gradients averaged over the ranks, so a
// step gives the weights one process would; rank 0 alone logs, evaluates and writes the run dir
// (its checkpoints resume at any world size). A CUDA [model] device becomes cuda:<LOCAL_RANK>.
//
// Resuming: --resume OUT loads the newest checkpoint, cuts metrics.jsonl back to what it had
// logged, rebuilds the same plan (refusing a changed corpus or tokenizer: the examples' digest
// is in state.json) and goes on from the next step; on the CPU the result equals a run never
// stopped.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "kz/core/files.h"
#include "kz/core/status.h"
#include "kz/sft/sft_config.h"

namespace kz::sft {

struct SftOptions {
  fs::path config_path;          // a new run: its TOML (output.dir names the run dir unless out_dir is set)
  fs::path out_dir;              // a new run: overrides [output] dir; with resume: the run dir
  bool resume = false;
  fs::path default_prompts_dir;  // used when [data] prompts_dir is empty
  int64_t stop_at_step = 0;      // > 0: stop after this optimiser step (a checkpoint is written
                                 // there); --resume goes on. Splits a run across time-boxed calls.
};

struct SftReport {
  fs::path out_dir, final_dir;  // final_dir empty when the run stopped early
  int64_t steps_done = 0, total_steps = 0;
  int64_t train_examples = 0, eval_examples = 0, too_long = 0;
  double unfused_share = 0;     // coder: share of training pairs from unfused candidates
  double first_loss = 0, last_loss = 0;  // mean training loss of the first and last logged windows
  std::optional<double> first_eval_loss, last_eval_loss;
  double tokens = 0;            // real tokens trained in this process
  double train_seconds = 0;     // forward/backward/update time in this process
  double tokens_per_s = 0;
  int rank = 0, world_size = 1;  // data parallel: this process's rank (only rank 0's report has the losses)
};

Result<SftReport> run_sft(const SftOptions& options, std::ostream& log);

}  // namespace kz::sft
