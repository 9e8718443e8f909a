// Data-parallel training over a ProcessGroup (process_group.h), as PyTorch's DDP does it: every
// rank holds the whole model, trains on its shard of each global batch, and the gradients are
// averaged over the ranks in buckets launched from autograd's post-accumulate-grad hooks, so
// communication overlaps the rest of the backward pass; the optimiser step waits for them.
//
//   auto group = ProcessGroup::connect(world, device);
//   KZ_RETURN_IF_ERROR(make_data_parallel(*trainer, group, {}));  // rank 0's weights everywhere
//   trainer->step(my_shard, loss, global_denominator / world.size);  // mean of the ranks' grads
//
// Buckets: the trained parameters in reverse order (backward reaches the last layers first), cut
// where a bucket reaches bucket_bytes or the gradient dtype changes. A bucket is launched once all
// its gradients are in and every bucket before it was launched, so every rank issues the same
// collectives in the same order. Each launch copies its gradients into one flat tensor and sums
// it over the ranks; finish() waits for each, divides by the world size and copies back.
//
// Equivalence: with the loss normalised by the global batch's denominator divided by the world
// size (token_mean: every rank's trained tokens summed), the averaged gradient is the gradient of
// the whole global batch, so W ranks x B sequences give the weights of 1 rank x W*B up to float
// summation order (dist/tests/data_parallel_test.cpp).
#pragma once

#include <cstddef>
#include <memory>

#include "kz/core/status.h"
#include "kz/dist/process_group.h"
#include "kz/model/train.h"

namespace kz::dist {

struct DataParallelOptions {
  size_t bucket_bytes = size_t(25) << 20;  // PyTorch DDP's default bucket_cap_mb
};

// The buckets a trainer's parameters fall into (indices into Trainer::parameter_names), in
// launch order; for tests and logs.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<at::Tensor>& gradients_like, size_t bucket_bytes);

// Copies rank 0's weights (every parameter of the model, and the trainer's float32 masters) into
// every rank, then attaches a bucketed GradientSync to the trainer. A world of one: nothing.
Status make_data_parallel(model::Trainer& trainer, std::shared_ptr<ProcessGroup> group,
                          const DataParallelOptions& options);

}  // namespace kz::dist
