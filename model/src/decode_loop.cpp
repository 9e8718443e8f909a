// The device decode loop (see decode_loop.h). CUDA-graph code is compiled only with
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
struct DecodeLoop::Graph {
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
struct DecodeLoop::Graph {};
#endif

DecodeLoop::DecodeLoop(CausalLM& model, KVCache& cache, Sampler sampler)
    : model_(model), cache_(cache), sampler_(std::move(sampler)) {
  const int64_t b = cache.key_mask.size(0);
  auto opts = at::TensorOptions().device(model.device());
  token_ = at::zeros({b}, opts.dtype(at::kLong));
  logprob_ = at::zeros({b}, opts.dtype(at::kFloat));
}

DecodeLoop::~DecodeLoop() = default;

bool DecodeLoop::uses_graph() const { return graph_ != nullptr; }

Result<std::unique_ptr<DecodeLoop>> DecodeLoop::create(CausalLM& model, KVCache& cache, Sampler sampler,
                                                      const DecodeLoopOptions& options) {
  if (cache.length == 0 || cache.length >= cache.capacity())
    return invalid_argument(fmt::format("decode loop on a cache holding {} of {} slots (prefill first; raise capacity)",
                                        cache.length, cache.capacity()));
  if (sampler.rows() != cache.key_mask.size(0))
    return invalid_argument(fmt::format("decode loop: a sampler of {} rows for a batch of {}", sampler.rows(),
                                        cache.key_mask.size(0)));
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(model, cache, std::move(sampler)));
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

void DecodeLoop::step() {
  c10::NoGradGuard no_grad;
  auto [next, logprob] = sampler_.choose(model_.decode_step(token_, cache_));
  logprob_.copy_(logprob);
  token_.copy_(next);
}

void DecodeLoop::capture() {
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
  at::Tensor draws = sampler_.step().clone();
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
  sampler_.step().copy_(draws);
  c10::cuda::device_synchronize();
  capture_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#else
  graph_error_ = "built without CUDA graph support (KZ_MODEL_CUDA_GRAPHS)";
#endif
}

Result<DecodedTokens> DecodeLoop::run(const at::Tensor& first, int64_t steps) {
  const int64_t b = token_.size(0);
  if (steps < 1 || cache_.length + steps > cache_.capacity())
    return invalid_argument(fmt::format("decode loop: {} steps from slot {} of a cache of {} slots", steps,
                                        cache_.length, cache_.capacity()));
  if (first.dim() != 1 || first.size(0) != b)
    return invalid_argument(fmt::format("decode loop: first tokens must be [{}]", b));
  try {
    auto opts = token_.options();
    DecodedTokens out{at::empty({b, steps}, opts), at::empty({b, steps}, opts.dtype(at::kFloat))};
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
    return internal_error(std::string("decode loop: ") + e.what());
  }
}

}  // namespace kz::model
