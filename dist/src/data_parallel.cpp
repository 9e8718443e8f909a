// Bucketed gradient averaging (data_parallel.h).
#include "kz/dist/data_parallel.h"

#include <fmt/format.h>

#include <mutex>

namespace kz::dist {
namespace {

struct Bucket {
  std::vector<size_t> params;        // indices, in the order their gradients are packed
  std::vector<at::Tensor> gradients; // handed over this step, same order
  size_t waiting = 0;                // gradients not yet handed over this step
  at::Tensor flat;                   // the packed gradients, while being reduced
  std::unique_ptr<PendingCollective> pending;
};

class BucketedGradientSync : public model::GradientSync {
 public:
  BucketedGradientSync(std::shared_ptr<ProcessGroup> group, std::vector<std::vector<size_t>> plan, size_t params)
      : group_(std::move(group)), bucket_of_(params), slot_of_(params) {
    for (size_t b = 0; b < plan.size(); ++b) {
      buckets_.emplace_back();
      buckets_.back().params = plan[b];
      for (size_t s = 0; s < plan[b].size(); ++s) bucket_of_[plan[b][s]] = b, slot_of_[plan[b][s]] = s;
    }
    reset();
  }

  void ready(size_t index, const at::Tensor& grad) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Bucket& bucket = buckets_[bucket_of_[index]];
    bucket.gradients[slot_of_[index]] = grad;
    --bucket.waiting;
    // In bucket order only, so that every rank issues the same collectives in the same order.
    while (next_ < buckets_.size() && buckets_[next_].waiting == 0) launch(buckets_[next_++]);
  }

  Status finish() override {
    std::lock_guard<std::mutex> lock(mutex_);
    Status status = Status::ok();
    if (next_ < buckets_.size())
      status = internal_error(fmt::format("gradient sync: bucket {} of {} still waits for {} gradients", next_,
                                          buckets_.size(), buckets_[next_].waiting));
    const double scale = 1.0 / static_cast<double>(group_->size());
    for (size_t b = 0; b < next_; ++b) {
      Bucket& bucket = buckets_[b];
      Status waited = bucket.pending->wait();
      if (!waited.is_ok()) {
        if (status.is_ok()) status = waited.with_context(fmt::format("gradient bucket {}", b));
        continue;
      }
      bucket.flat.mul_(scale);
      int64_t offset = 0;
      for (at::Tensor& g : bucket.gradients) {
        g.copy_(bucket.flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
    reset();
    return status;
  }

 private:
  void launch(Bucket& bucket) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& g : bucket.gradients) flat.push_back(g.reshape({-1}));
    bucket.flat = at::cat(flat);
    bucket.pending = group_->all_reduce_sum_async(bucket.flat);
  }

  void reset() {
    for (Bucket& bucket : buckets_) {
      bucket.gradients.assign(bucket.params.size(), at::Tensor());
      bucket.waiting = bucket.params.size();
      bucket.flat = at::Tensor();
      bucket.pending.reset();
    }
    next_ = 0;
  }

  std::shared_ptr<ProcessGroup> group_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, slot_of_;
  size_t next_ = 0;  // the next bucket to launch
  std::mutex mutex_;  // hooks may run on autograd's device threads
};

}  // namespace

std::vector<std::vector<size_t>> plan_buckets(const std::vector<at::Tensor>& gradients_like, size_t bucket_bytes) {
  std::vector<std::vector<size_t>> plan;
  size_t bytes = 0;
  at::ScalarType dtype = at::kFloat;
  for (size_t i = gradients_like.size(); i-- > 0;) {
    const at::Tensor& g = gradients_like[i];
    const size_t size = static_cast<size_t>(g.numel()) * g.element_size();
    if (plan.empty() || bytes >= bucket_bytes || g.scalar_type() != dtype) {
      plan.emplace_back();
      bytes = 0;
      dtype = g.scalar_type();
    }
    plan.back().push_back(i);
    bytes += size;
  }
  return plan;
}

Status make_data_parallel(model::Trainer& trainer, std::shared_ptr<ProcessGroup> group,
                          const DataParallelOptions& options) {
  if (!group || !group->world().distributed()) return Status::ok();
  if (options.bucket_bytes == 0) return invalid_argument("data parallel: bucket_bytes must be > 0");
  std::vector<at::Tensor> weights, gradients_like;
  for (const auto& item : trainer.model().named_parameters(/*recurse=*/true)) weights.push_back(item.value());
  for (const std::string& name : trainer.parameter_names()) {
    at::Tensor master = trainer.master(name);  // the gradient's shape and dtype (float32 for mixed)
    gradients_like.push_back(master);
    bool own_copy = true;
    for (const at::Tensor& w : weights) own_copy = own_copy && !w.is_same(master);
    if (own_copy) weights.push_back(master);
  }
  {
    c10::NoGradGuard no_grad;
    KZ_RETURN_IF_ERROR(group->broadcast(weights, 0).with_context("data parallel: rank 0's weights"));
  }
  trainer.set_gradient_sync(std::make_shared<BucketedGradientSync>(
      group, plan_buckets(gradients_like, options.bucket_bytes), gradients_like.size()));
  return Status::ok();
}

}  // namespace kz::dist
