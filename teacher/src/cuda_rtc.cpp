// cuda-rtc candidates of a teacher module (render_candidate in kz/teacher/render.h, format cuda-rtc).
//
// Kernels follow suite/examples/cuda-rtc: `extern "C" __global__` functions in one SOURCE string,
// compiled once by kz_rtc in __init__ and launched from forward with explicit grid and block.
// Flat kernels take one thread per element; row kernels one block per row, reducing with warp
// shuffles and shared memory; the gemm is a shared-memory tiled fp32 SGEMM, TILE x TILE threads
// per output tile.
#include <fmt/format.h>

#include "kz/teacher/render.h"
#include "ops_text.h"
#include "writers.h"

namespace kz::teacher {
namespace {

// Where a kernel reads its operands: flat element i (rows of `cols`), element (r, c) of a row
// kernel (rows of `cols`) or of a gemm's output (M x N).
enum class Context { flat, row, tile };

std::string operand_element(Context context, const Step& step) {
  const std::string& name = step.value;
  if (step.operand == Operand::scalar) return text::takes_scalar_argument(step) ? name : name + "f";
  switch (context) {
    case Context::flat:
      if (step.operand == Operand::row) return name + "[i % cols]";
      if (step.operand == Operand::col) return name + "[i / cols]";
      return name + "[i]";
    case Context::row:
      if (step.operand == Operand::row) return name + "[c]";
      if (step.operand == Operand::col) return name + "[r]";
      return name + "[(size_t)r * cols + c]";
    case Context::tile:
      if (step.operand == Operand::row) return name + "[c]";
      if (step.operand == Operand::col) return name + "[r]";
      return name + "[(size_t)r * N + c]";
  }
  return name;
}

std::vector<std::string> chain_statements(const std::vector<Step>& chain, Context context) {
  std::vector<std::string> lines;
  for (const Step& step : chain) {
    std::string operand = step.operand == Operand::none ? "" : operand_element(context, step);
    lines.push_back("h = " + text::apply(text::spelling(step.op).cuda, "h", operand) + ";");
  }
  return lines;
}

std::vector<std::string> pointer_parameters(const std::vector<Step>& chain) {
  std::vector<std::string> parameters;
  for (const Step& step : chain)
    if (text::is_tensor_operand(step.operand))
      parameters.push_back("const float* __restrict__ " + step.value);
  return parameters;
}

std::vector<std::string> pointer_names(const std::vector<Step>& chain) {
  std::vector<std::string> names;
  for (const Step& step : chain)
    if (text::is_tensor_operand(step.operand)) names.push_back(step.value);
  return names;
}

std::string cuda_function(const std::string& head, const std::vector<std::string>& parameters,
                          const std::vector<std::string>& body) {
  return fmt::format("{}({}) {{\n{}}}\n", head, text::joined(parameters), text::indented(body, 4));
}

std::string flat_kernel(const std::string& name, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"const float* __restrict__ x"};
  for (const std::string& p : pointer_parameters(chain)) parameters.push_back(p);
  parameters.push_back("float* __restrict__ out");
  for (const Step& step : chain)
    if (text::takes_scalar_argument(step)) parameters.push_back("float " + step.value);
  parameters.push_back("long long n");
  if (text::needs_cols(chain)) parameters.push_back("long long cols");
  std::vector<std::string> body = {"const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
                                   "if (i >= n) return;", "float h = x[i];"};
  for (const std::string& line : chain_statements(chain, Context::flat)) body.push_back(line);
  body.push_back("out[i] = h;");
  return cuda_function("extern \"C\" __global__ void " + name, parameters, body);
}

std::string flat_launch(const Step& step, const std::string& in, const std::string& out) {
  return fmt::format("self.kernels.{}_kernel({}, grid=grid, block=(THREADS,))", text::step_kernel_name(step),
                     text::joined(text::flat_arguments(step, in, out)));
}

std::string step_kernels(const std::vector<Step>& chain) {
  std::string out;
  for (const Step& step : text::distinct_step_kernels(chain))
    out += "\n" + flat_kernel(text::step_kernel_name(step) + "_kernel", {step});
  return out;
}

// `cols`: the row length's expression, empty where forward already has it as `cols`.
std::vector<std::string> flat_setup_lines(const std::vector<Step>& chain, const std::string& numel, const std::string& cols) {
  std::vector<std::string> lines = {"n = " + numel};
  if (text::needs_cols(chain) && !cols.empty()) lines.push_back("cols = " + cols);
  lines.push_back("grid = ((n + THREADS - 1) // THREADS,)");
  return lines;
}

// --- Row kernels ---

constexpr const char* kBlockReduce = R"(#define NEG_INF __int_as_float(0xff800000)  // -inf (NVRTC has no <math.h> INFINITY)

// Block-wide reductions: warp shuffles, then one value per warp through shared memory.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Every thread of the block gets the result; safe to call several times in a row.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float partial[33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // the previous call's readers of partial[32] are done
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? partial[lane] : (is_max ? NEG_INF : 0.f);
        v = is_max ? warp_max(v) : warp_sum(v);
        if (lane == 0) partial[32] = v;
    }
    __syncthreads();
    return partial[32];
}
)";

// Element (r, c) of x with the chain applied: every pass over a row reads through it.
std::string load_h_function(const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"const float* __restrict__ x"};
  for (const std::string& p : pointer_parameters(chain)) parameters.push_back(p);
  for (const char* p : {"int r", "int c", "int cols"}) parameters.push_back(p);
  std::vector<std::string> body = {"float h = x[(size_t)r * cols + c];"};
  for (const std::string& line : chain_statements(chain, Context::row)) body.push_back(line);
  body.push_back("return h;");
  return cuda_function("__device__ __forceinline__ float load_h", parameters, body);
}

std::vector<std::string> reducer_body(Reducer reducer, const std::string& h) {
  const std::string each = "for (int c = threadIdx.x; c < cols; c += blockDim.x)";
  std::vector<std::string> body = {"const int r = blockIdx.x;"};
  auto add = [&](std::vector<std::string> lines) { body.insert(body.end(), lines.begin(), lines.end()); };
  switch (reducer) {
    case Reducer::sum:
    case Reducer::mean:
      add({"float acc = 0.f;", fmt::format("{} acc += {};", each, h), "acc = block_reduce(acc, false);",
           reducer == Reducer::sum ? "if (threadIdx.x == 0) out[r] = acc;" : "if (threadIdx.x == 0) out[r] = acc / cols;"});
      break;
    case Reducer::max:
      add({"float acc = NEG_INF;", fmt::format("{} acc = max_nan(acc, {});", each, h), "acc = block_reduce(acc, true);",
           "if (threadIdx.x == 0) out[r] = acc;"});
      break;
    case Reducer::softmax:
      add({"float m = NEG_INF;", fmt::format("{} m = max_nan(m, {});", each, h), "m = block_reduce(m, true);",
           "float s = 0.f;", fmt::format("{} s += expf({} - m);", each, h), "s = block_reduce(s, false);",
           fmt::format("{} out[(size_t)r * cols + c] = expf({} - m) / s;", each, h)});
      break;
    case Reducer::layer_norm:
      add({"float s = 0.f;", fmt::format("{} s += {};", each, h), "const float mean = block_reduce(s, false) / cols;",
           "float q = 0.f;", each + " {", fmt::format("    const float d = {} - mean;", h), "    q += d * d;", "}",
           "const float rstd = 1.f / sqrtf(block_reduce(q, false) / cols + eps);",
           fmt::format("{} out[(size_t)r * cols + c] = ({} - mean) * rstd * w[c] + b[c];", each, h)});
      break;
    case Reducer::rms_norm:
      add({"float q = 0.f;", each + " {", fmt::format("    const float h = {};", h), "    q += h * h;", "}",
           "const float rstd = 1.f / sqrtf(block_reduce(q, false) / cols + eps);",
           fmt::format("{} out[(size_t)r * cols + c] = {} * rstd * w[c];", each, h)});
      break;
    case Reducer::none: break;
  }
  return body;
}

std::string row_kernel(Reducer reducer, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"const float* __restrict__ x"};
  for (const std::string& p : pointer_parameters(chain)) parameters.push_back(p);
  if (text::is_norm(reducer)) parameters.push_back("const float* __restrict__ w");
  if (reducer == Reducer::layer_norm) parameters.push_back("const float* __restrict__ b");
  parameters.push_back("float* __restrict__ out");
  parameters.push_back("int cols");
  if (text::is_norm(reducer)) parameters.push_back("float eps");
  std::vector<std::string> load_args = {"x"};
  for (const std::string& name : pointer_names(chain)) load_args.push_back(name);
  std::string h = fmt::format("load_h({}, r, c, cols)", text::joined(load_args));
  return cuda_function(fmt::format("extern \"C\" __global__ void {}_kernel", reducer_name(reducer)), parameters,
                       reducer_body(reducer, h));
}

std::string row_launch(Reducer reducer, const std::string& in, const std::vector<std::string>& operands) {
  std::vector<std::string> args = {in};
  for (const std::string& o : operands) args.push_back(o);
  if (text::is_norm(reducer)) args.push_back("self.norm.weight");
  if (reducer == Reducer::layer_norm) args.push_back("self.norm.bias");
  args.push_back("out");
  args.push_back("cols");
  if (text::is_norm(reducer)) args.push_back("float(self.norm.eps)");
  return fmt::format("self.kernels.{}_kernel({}, grid=(rows,), block=(THREADS,))", reducer_name(reducer),
                     text::joined(args));
}

// --- The gemm ---

std::string gemm_kernel(const std::string& name, bool with_epilogue, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"const float* __restrict__ x", "const float* __restrict__ w"};
  if (with_epilogue) {
    parameters.push_back("const float* __restrict__ bias");
    for (const std::string& p : pointer_parameters(chain)) parameters.push_back(p);
  }
  for (const char* p : {"float* __restrict__ out", "int M", "int N", "int K"}) parameters.push_back(p);
  std::vector<std::string> body = {
      "__shared__ float xs[TILE][TILE + 1];",
      "__shared__ float ws[TILE][TILE + 1];",
      "const int tx = threadIdx.x, ty = threadIdx.y;",
      "const int r = blockIdx.y * TILE + ty, c = blockIdx.x * TILE + tx;",
      "const int wn = blockIdx.x * TILE + ty;  // the weight row (an output column) this thread loads",
      "float acc = 0.f;",
      "for (int k0 = 0; k0 < K; k0 += TILE) {",
      "    xs[ty][tx] = (r < M && k0 + tx < K) ? x[(size_t)r * K + k0 + tx] : 0.f;",
      "    ws[ty][tx] = (wn < N && k0 + tx < K) ? w[(size_t)wn * K + k0 + tx] : 0.f;",
      "    __syncthreads();",
      "    for (int k = 0; k < TILE; ++k) acc += xs[ty][k] * ws[tx][k];",
      "    __syncthreads();",
      "}",
      "if (r >= M || c >= N) return;",
  };
  if (with_epilogue) {
    body.push_back("float h = acc + bias[c];");
    for (const std::string& line : chain_statements(chain, Context::tile)) body.push_back(line);
  } else {
    body.push_back("float h = acc;");
  }
  body.push_back("out[(size_t)r * N + c] = h;");
  return cuda_function("extern \"C\" __global__ void " + name, parameters, body);
}

// --- Whole candidates ---

struct Source {
  std::string kernels;  // CUDA C
  std::vector<std::string> forward;
};

const text::Launches kLaunches = {
    flat_setup_lines, flat_launch,
    [](const std::vector<std::string>& args) {
      return fmt::format("self.kernels.fused_kernel({}, grid=grid, block=(THREADS,))", text::joined(args));
    },
    row_launch};

Source elementwise(const ModuleSpec& spec, Fusion fusion, int threads) {
  const bool fused = fusion == Fusion::fused;
  return {fused ? flat_kernel("fused_kernel", spec.chain) : step_kernels(spec.chain),
          text::elementwise_forward(spec, fused, fmt::format("THREADS = {}", threads), kLaunches)};
}

Source reduction(const ModuleSpec& spec, Fusion fusion, int threads) {
  const bool fused = fusion == Fusion::fused;
  const std::vector<Step> none;
  std::string kernels = fused ? std::string(kBlockReduce) + "\n" + load_h_function(spec.chain) + "\n" +
                                    row_kernel(spec.reducer, spec.chain)
                              : std::string(kBlockReduce) + step_kernels(spec.chain) + "\n" + load_h_function(none) +
                                    "\n" + row_kernel(spec.reducer, none);
  // forward names the row length `cols` itself: the chain's set-up need not.
  return {kernels, text::reduction_forward(spec, fused, "cols", "", fmt::format("THREADS = {}", threads), kLaunches)};
}

Source gemm(const ModuleSpec& spec, Fusion fusion, int tile) {
  Source source;
  std::vector<std::string> lines = text::contiguous_inputs(spec);
  for (const char* l : {"w = self.linear.weight.contiguous()", "M, K = x.shape", "N = w.shape[0]"}) lines.push_back(l);
  lines.push_back(fmt::format("TILE = {}  # as in SOURCE", tile));
  lines.push_back("tiles = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)");
  std::string define = fmt::format("#define TILE {}\n\n", tile);
  if (fusion == Fusion::fused) {
    source.kernels = define + gemm_kernel("linear_kernel", true, spec.chain);
    lines.push_back("out = torch.empty((M, N), device=x.device, dtype=x.dtype)");
    lines.push_back(fmt::format("self.kernels.linear_kernel({}, grid=tiles, block=(TILE, TILE))",
                                text::joined(text::gemm_fused_arguments(spec))));
    lines.push_back("return out");
  } else {
    // The bias add is an op of its own: a row vector added to every row of the product.
    std::vector<Step> chain = {Step{Op::add, Operand::row, "self.linear.bias"}};
    chain.insert(chain.end(), spec.chain.begin(), spec.chain.end());
    source.kernels = define + gemm_kernel("matmul_kernel", false, {}) + step_kernels(chain);
    lines.push_back("h0 = torch.empty((M, N), device=x.device, dtype=x.dtype)");
    lines.push_back("self.kernels.matmul_kernel(x, w, h0, M, N, K, grid=tiles, block=(TILE, TILE))");
    lines.push_back("THREADS = TILE * TILE");
    for (const std::string& l : text::unfused_chain_return(chain, "h0", "h0.numel()", "N", kLaunches)) lines.push_back(l);
  }
  source.forward = lines;
  return source;
}

}  // namespace

std::string render_cuda_rtc(const ModuleSpec& spec, Fusion fusion, int block_size) {
  Source source = spec.kind == Kind::gemm        ? gemm(spec, fusion, block_size)
                  : spec.kind == Kind::reduction ? reduction(spec, fusion, block_size)
                                                 : elementwise(spec, fusion, block_size);
  CandidateCode code;
  code.kernels = "\nSOURCE = r\"\"\"\n" + source.kernels + "\"\"\"\n";
  code.init = {"self.kernels = kz_rtc.compile(SOURCE, name=\"teacher\")"};
  code.forward = source.forward;
  return candidate_module(spec, CandidateSpec{Format::cuda_rtc, fusion, block_size},
                          "import torch\nimport torch.nn as nn\n\nimport kz_rtc\n", code);
}

}  // namespace kz::teacher
