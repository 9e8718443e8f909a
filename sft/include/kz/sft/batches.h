// Rows, optimiser steps and micro-batches over supervised examples: the training plan, as index
// lists (torch-free; sft.cpp turns a micro-batch into tensors).
//
//   row          the token sequence of one forward row: one example, or several packed end to
//                end (packing). Its loss mask is 1 on the targets that are completion tokens.
//   step         one optimiser update: rows in shuffled order until their real tokens reach
//                batch_tokens (the last step of an epoch may hold fewer).
//   micro-batch  the rows of one forward/backward: a step's rows sorted by length and grouped
//                while rows x longest row stays within micro_batch_tokens (at least one row).
//
// Packing: the engine's attention masks are padding masks, so packed examples are not masked
// from each other: a row's later examples attend to its earlier ones, and positions run on
// through the row. Their loss still covers only their own completion tokens. Without packing
// every example is its own row (right-padded in its micro-batch), exactly as RL scores it.
//
// The plan is a pure function of the examples, the options and the seed: a resumed run rebuilds
// it and goes on at the step it had reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kz/core/status.h"
#include "kz/sft/examples.h"

namespace kz::sft {

struct BatchOptions {
  size_t batch_tokens = 16384;       // real tokens per optimiser step (at least one row)
  size_t micro_batch_tokens = 8192;  // padded tokens (rows x longest row) per forward/backward
  bool packing = false;              // several examples per row, up to row_tokens each
  size_t row_tokens = 2048;          // packing: longest row (the data's max_seq_len)
  Status validate() const;
};

using Row = std::vector<uint32_t>;  // indices of the examples it holds, in order
using MicroBatchRows = std::vector<Row>;

struct Step {
  int64_t epoch = 0;
  std::vector<MicroBatchRows> micro_batches;
  size_t tokens = 0;  // real tokens of its rows
};

// A row's token ids and its loss mask over targets: loss_mask[t] is 1 when ids[t + 1] is a
// completion token (so loss_mask.size() == ids.size() - 1).
struct RowTokens {
  std::vector<TokenId> ids;
  std::vector<uint8_t> loss_mask;
};
RowTokens row_tokens(const Row& row, const std::vector<Example>& examples);
size_t row_length(const Row& row, const std::vector<Example>& examples);

// The steps of one epoch: the examples shuffled by (seed, epoch), cut into rows (packing: each
// example joins the current row when it fits in row_tokens, else starts the next), rows into
// steps and micro-batches as the header says.
std::vector<Step> plan_epoch(const std::vector<Example>& examples, const BatchOptions& options, uint64_t seed,
                             int64_t epoch);

// Epoch after epoch: the first `steps` steps, or (steps = 0) every step of `epochs` epochs.
// invalid_argument when there are no examples or neither count is positive.
Result<std::vector<Step>> plan_training(const std::vector<Example>& examples, const BatchOptions& options,
                                        uint64_t seed, int64_t epochs, int64_t steps);

// Data parallelism: rank `rank`'s share of `step` among `world_size` ranks. The step's rows (in
// its micro-batches' order, which is by length) are dealt out in turn, so every rank gets rows
// of every length, then grouped into micro-batches as the plan groups them. A rank may get none
// (a step of fewer rows than ranks). world_size 1: the step's own micro-batches.
std::vector<MicroBatchRows> shard_step(const Step& step, const std::vector<Example>& examples,
                                       size_t micro_batch_tokens, int rank, int world_size);

// Evaluation: every example once, one per row, grouped by length into micro-batches.
std::vector<MicroBatchRows> plan_evaluation(const std::vector<Example>& examples, const BatchOptions& options);

}  // namespace kz::sft
