// The training plan (batches.h): shuffled examples -> rows -> steps -> micro-batches.
#include "kz/sft/batches.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kz/core/hash.h"

namespace kz::sft {
namespace {

// Fisher-Yates over mt19937_64's raw outputs (whose sequence the standard fixes, unlike
// std::shuffle's use of them): the same order with any standard library.
std::vector<uint32_t> shuffled_indices(size_t n, uint64_t seed, int64_t epoch) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 engine(hash64(fmt::format("sft/{}/{}", seed, epoch)));
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[engine() % i]);
  return order;
}

std::vector<Row> make_rows(const std::vector<uint32_t>& order, const std::vector<Example>& examples,
                           const BatchOptions& options) {
  std::vector<Row> rows;
  size_t current = 0;  // tokens in rows.back()
  for (uint32_t index : order) {
    size_t tokens = examples[index].tokens();
    if (options.packing && !rows.empty() && current + tokens <= options.row_tokens) {
      rows.back().push_back(index);
      current += tokens;
    } else {
      rows.push_back({index});
      current = tokens;
    }
  }
  return rows;
}

// Rows sorted by length (less padding), grouped while rows x longest row fits the budget.
std::vector<MicroBatchRows> group_micro_batches(std::vector<Row> rows, const std::vector<Example>& examples,
                                                size_t micro_batch_tokens) {
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    return row_length(a, examples) < row_length(b, examples);
  });
  std::vector<MicroBatchRows> batches;
  size_t longest = 0;
  for (Row& row : rows) {
    size_t length = row_length(row, examples);  // the longest so far: rows are sorted
    if (batches.empty() || (batches.back().size() + 1) * std::max(longest, length) > micro_batch_tokens) {
      batches.emplace_back();
      longest = 0;
    }
    batches.back().push_back(std::move(row));
    longest = std::max(longest, length);
  }
  return batches;
}

}  // namespace

Status BatchOptions::validate() const {
  if (batch_tokens < 1) return invalid_argument("batch_tokens must be >= 1");
  if (micro_batch_tokens < 1) return invalid_argument("micro_batch_tokens must be >= 1");
  if (packing && row_tokens < 2) return invalid_argument("row_tokens must be >= 2 when packing");
  return Status::ok();
}

size_t row_length(const Row& row, const std::vector<Example>& examples) {
  size_t n = 0;
  for (uint32_t index : row) n += examples[index].tokens();
  return n;
}

RowTokens row_tokens(const Row& row, const std::vector<Example>& examples) {
  RowTokens out;
  std::vector<uint8_t> is_completion;
  for (uint32_t index : row) {
    const Example& e = examples[index];
    out.ids.insert(out.ids.end(), e.prompt_ids.begin(), e.prompt_ids.end());
    out.ids.insert(out.ids.end(), e.completion_ids.begin(), e.completion_ids.end());
    is_completion.insert(is_completion.end(), e.prompt_ids.size(), 0);
    is_completion.insert(is_completion.end(), e.completion_ids.size(), 1);
  }
  // Target t is token t + 1.
  out.loss_mask.assign(is_completion.begin() + (is_completion.empty() ? 0 : 1), is_completion.end());
  return out;
}

std::vector<Step> plan_epoch(const std::vector<Example>& examples, const BatchOptions& options, uint64_t seed,
                             int64_t epoch) {
  std::vector<Row> rows = make_rows(shuffled_indices(examples.size(), seed, epoch), examples, options);
  std::vector<Step> steps;
  std::vector<Row> pending;
  size_t tokens = 0;
  auto close_step = [&] {
    steps.push_back({epoch, group_micro_batches(std::move(pending), examples, options.micro_batch_tokens), tokens});
    pending.clear();
    tokens = 0;
  };
  for (Row& row : rows) {
    tokens += row_length(row, examples);
    pending.push_back(std::move(row));
    if (tokens >= options.batch_tokens) close_step();
  }
  if (!pending.empty()) close_step();
  return steps;
}

Result<std::vector<Step>> plan_training(const std::vector<Example>& examples, const BatchOptions& options,
                                        uint64_t seed, int64_t epochs, int64_t steps) {
  KZ_RETURN_IF_ERROR(options.validate());
  if (examples.empty()) return invalid_argument("no training examples");
  if (steps <= 0 && epochs <= 0) return invalid_argument("give steps > 0 or epochs > 0");
  std::vector<Step> plan;
  for (int64_t epoch = 0; steps > 0 ? static_cast<int64_t>(plan.size()) < steps : epoch < epochs; ++epoch) {
    std::vector<Step> more = plan_epoch(examples, options, seed, epoch);
    plan.insert(plan.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  if (steps > 0) plan.resize(static_cast<size_t>(steps));
  return plan;
}

std::vector<MicroBatchRows> shard_step(const Step& step, const std::vector<Example>& examples,
                                       size_t micro_batch_tokens, int rank, int world_size) {
  if (world_size <= 1) return step.micro_batches;
  std::vector<Row> mine;
  size_t index = 0;
  for (const MicroBatchRows& batch : step.micro_batches)
    for (const Row& row : batch)
      if (index++ % static_cast<size_t>(world_size) == static_cast<size_t>(rank)) mine.push_back(row);
  if (mine.empty()) return {};
  return group_micro_batches(std::move(mine), examples, micro_batch_tokens);
}

std::vector<MicroBatchRows> plan_evaluation(const std::vector<Example>& examples, const BatchOptions& options) {
  std::vector<Row> rows;
  for (uint32_t i = 0; i < examples.size(); ++i) rows.push_back({i});
  return group_micro_batches(std::move(rows), examples, options.micro_batch_tokens);
}

}  // namespace kz::sft
