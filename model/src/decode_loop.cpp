// The greedy decode loop (see decode_loop.h). CUDA-graph code is compiled only with
// KZ_MODEL_CUDA_GRAPHS (libtorch built with CUDA and the toolkit's headers present); every other
// line runs on the CPU too, which is how the tests cover the loop's bookkeeping.
#include "kz/model/decode_loop.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <chrono>

#ifdef KZ_MODEL_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace kz::model {

#ifdef KZ_MODEL_CUDA_GRAPHS
struct GreedyLoop::Graph {
  at::cuda::CUDAGraph graph;
};

namespace {
// A throw between capture_begin and capture_end leaves the stream capturing, which would fail
// every later launch on it; end that capture and drop its partial graph and error.
void end_broken_capture(const c10::cuda::CUDAStream& stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream.stream(), &partial);
    if (partial) cudaGraphDestroy(partial);
  }
  (void)cudaGetLastError();
}
}  // namespace
#else
struct GreedyLoop::Graph {};
#endif

GreedyLoop::GreedyLoop(CausalLM& model, KVCache& cache) : model_(model), cache_(cache) {
  const int64_t b = cache.key_mask.size(0);
  auto opts = at::TensorOptions().device(model.device());
  token_ = at::zeros({b}, opts.dtype(at::kLong));
  logprob_ = at::zeros({b}, opts.dtype(at::kFloat));
}

GreedyLoop::~GreedyLoop() = default;

bool GreedyLoop::uses_graph() const { return graph_ != nullptr; }

Result<std::unique_ptr<GreedyLoop>> GreedyLoop::create(CausalLM& model, KVCache& cache, const GreedyLoopOptions& options) {
  if (cache.length == 0 || cache.length >= cache.capacity())
    return invalid_argument(fmt::format("greedy loop on a cache holding {} of {} slots (prefill first; raise capacity)",
                                        cache.length, cache.capacity()));
  std::unique_ptr<GreedyLoop> loop(new GreedyLoop(model, cache));
  if (options.cuda_graph && model.device().is_cuda()) {
    try {
      loop->capture();
    } catch (const std::exception& e) {  // capture() handles its own failures; this is a last resort
      loop->graph_.reset();
      loop->graph_error_ = e.what();
    }
  }
  return loop;
}

void GreedyLoop::step() {
  c10::NoGradGuard no_grad;
  at::Tensor logits = model_.decode_step(token_, cache_).to(at::kFloat);
  at::Tensor next = logits.argmax(-1);
  logprob_.copy_(logits.gather(-1, next.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1));
  token_.copy_(next);
}

void GreedyLoop::capture() {
#ifdef KZ_MODEL_CUDA_GRAPHS
  constexpr int64_t kWarmupSteps = 2;
  if (cache_.length + kWarmupSteps > cache_.capacity()) {
    graph_error_ = "no free cache slots for the warm-up steps";
    return;
  }
  auto start = std::chrono::steady_clock::now();
  // The warm-up steps really run: snapshot what they change and put it back afterwards (the
  // keys/values they wrote sit in slots that stay masked until real steps overwrite them).
  at::Tensor slot = cache_.slot.clone(), position = cache_.next_position.clone(), mask = cache_.key_mask.clone();
  c10::cuda::device_synchronize();
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, model_.device().index());
  auto graph = std::make_unique<Graph>();
  try {
    c10::cuda::CUDAStreamGuard guard(stream);
    for (int64_t i = 0; i < kWarmupSteps; ++i) step();
    stream.synchronize();
    graph->graph.capture_begin();
    step();
    graph->graph.capture_end();
    stream.synchronize();
    graph_ = std::move(graph);
  } catch (const std::exception& e) {
    end_broken_capture(stream);
    graph_error_ = e.what();
  }
  cache_.slot.copy_(slot);
  cache_.next_position.copy_(position);
  cache_.key_mask.copy_(mask);
  c10::cuda::device_synchronize();
  capture_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#else
  graph_error_ = "built without CUDA graph support (KZ_MODEL_CUDA_GRAPHS)";
#endif
}

Result<GreedyTokens> GreedyLoop::run(const at::Tensor& first, int64_t steps) {
  const int64_t b = token_.size(0);
  if (steps < 1 || cache_.length + steps > cache_.capacity())
    return invalid_argument(fmt::format("greedy loop: {} steps from slot {} of a cache of {} slots", steps,
                                        cache_.length, cache_.capacity()));
  if (first.dim() != 1 || first.size(0) != b)
    return invalid_argument(fmt::format("greedy loop: first tokens must be [{}]", b));
  try {
    auto opts = token_.options();
    GreedyTokens out{at::empty({b, steps}, opts), at::empty({b, steps}, opts.dtype(at::kFloat))};
    token_.copy_(first);
    for (int64_t i = 0; i < steps; ++i) {
#ifdef KZ_MODEL_CUDA_GRAPHS
      if (graph_) graph_->graph.replay();
      else step();
#else
      step();
#endif
      out.tokens.select(1, i).copy_(token_);
      out.logprobs.select(1, i).copy_(logprob_);
    }
    cache_.length += steps;
    return out;
  } catch (const std::exception& e) {
    return internal_error(std::string("greedy loop: ") + e.what());
  }
}

}  // namespace kz::model
