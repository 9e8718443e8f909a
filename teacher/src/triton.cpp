// Triton candidates of a teacher module (render_candidate in kz/teacher/render.h, format triton).
//
// Kernels follow suite/examples/triton: outputs allocated on the input's device, masked loads and
// stores, one program per BLOCK elements (flat kernels) or per row (row kernels, looping over the
// row in BLOCK chunks: a max pass, a sum pass, a write pass as the reducer needs), fp32-exact
// tl.dot (input_precision="ieee") for the gemm.
#include <fmt/format.h>

#include "kz/teacher/render.h"
#include "ops_text.h"
#include "writers.h"

namespace kz::teacher {
namespace {

constexpr int kGemmBlockK = 32;

// Where a kernel reads its operands: flat elements (offs over numel, row length `cols`), one row
// of a row kernel (program r, chunk offs, row length N) or a gemm's output tile (rm x rn of M x N).
enum class Context { flat, row, tile };

std::string load_operand(Context context, Operand kind, const std::string& name) {
  const std::string p = name + "_ptr";
  switch (context) {
    case Context::flat:
      if (kind == Operand::row) return fmt::format("tl.load({} + offs % cols, mask=mask, other=0.0)", p);
      if (kind == Operand::col) return fmt::format("tl.load({} + offs // cols, mask=mask, other=0.0)", p);
      return fmt::format("tl.load({} + offs, mask=mask, other=0.0)", p);
    case Context::row:
      if (kind == Operand::row) return fmt::format("tl.load({} + offs, mask=mask, other=0.0)", p);
      if (kind == Operand::col) return fmt::format("tl.load({} + r)", p);
      return fmt::format("tl.load({} + r * N + offs, mask=mask, other=0.0)", p);
    case Context::tile:
      if (kind == Operand::row) return fmt::format("tl.load({} + rn, mask=rn < N, other=0.0)[None, :]", p);
      if (kind == Operand::col) return fmt::format("tl.load({} + rm, mask=rm < M, other=0.0)[:, None]", p);
      return fmt::format("tl.load({} + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)", p);
  }
  return "";
}

// The chain applied to `h`, each tensor operand loaded just before its step.
std::vector<std::string> chain_lines(const std::vector<Step>& chain, Context context) {
  std::vector<std::string> lines;
  for (const Step& step : chain) {
    const char* pattern = text::spelling(step.op).triton;
    if (text::is_tensor_operand(step.operand)) {
      lines.push_back(fmt::format("{} = {}", step.value, load_operand(context, step.operand, step.value)));
    }
    lines.push_back("h = " + text::apply(pattern, "h", step.value));
  }
  return lines;
}

// The pointer parameters of the chain's tensor operands.
std::vector<std::string> operand_parameters(const std::vector<Step>& chain) {
  std::vector<std::string> parameters;
  for (const Step& step : chain)
    if (text::is_tensor_operand(step.operand)) parameters.push_back(step.value + "_ptr");
  return parameters;
}

std::string jit_function(const std::string& name, const std::vector<std::string>& parameters,
                         const std::vector<std::string>& body) {
  return fmt::format("@triton.jit\ndef {}({}):\n{}", name, text::joined(parameters), text::indented(body, 4));
}

// A flat kernel: `chain` on every element of x (n of them, rows of `cols`), into out.
std::string flat_kernel(const std::string& name, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"x_ptr"};
  for (const std::string& p : operand_parameters(chain)) parameters.push_back(p);
  parameters.push_back("out_ptr");
  for (const Step& step : chain)
    if (text::takes_scalar_argument(step)) parameters.push_back(step.value);
  parameters.push_back("n");
  if (text::needs_cols(chain)) parameters.push_back("cols");
  parameters.push_back("BLOCK: tl.constexpr");
  std::vector<std::string> body = {"offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "mask = offs < n",
                                   "h = tl.load(x_ptr + offs, mask=mask, other=0.0)"};
  for (const std::string& line : chain_lines(chain, Context::flat)) body.push_back(line);
  body.push_back("tl.store(out_ptr + offs, h, mask=mask)");
  return jit_function(name, parameters, body);
}

// The launch of a flat kernel from forward: `in` through `step` into `out`.
std::string flat_launch(const Step& step, const std::string& in, const std::string& out) {
  std::vector<std::string> args = text::flat_arguments(step, in, out);
  args.push_back("BLOCK=BLOCK");
  return fmt::format("_{}_kernel[grid]({})", text::step_kernel_name(step), text::joined(args));
}

// The unfused chain's one-op kernels.
std::string step_kernels(const std::vector<Step>& chain) {
  std::string out;
  for (const Step& step : text::distinct_step_kernels(chain))
    out += "\n\n" + flat_kernel(fmt::format("_{}_kernel", text::step_kernel_name(step)), {step});
  return out;
}

// --- Row kernels (reductions, softmax, norms) ---

std::string load_chunk_function(const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"x_ptr"};
  for (const std::string& p : operand_parameters(chain)) parameters.push_back(p);
  for (const char* p : {"r", "offs", "mask", "N"}) parameters.push_back(p);
  std::vector<std::string> body = {"h = tl.load(x_ptr + r * N + offs, mask=mask, other=0.0)"};
  for (const std::string& line : chain_lines(chain, Context::row)) body.push_back(line);
  body.push_back("return h");
  return jit_function("_load_chunk", parameters, body);
}

// One pass over the row: h is the chunk, with the chain applied.
std::vector<std::string> row_pass(const std::string& load_call, const std::vector<std::string>& body) {
  std::vector<std::string> lines = {"for start in range(0, N, BLOCK):", "    offs = start + tl.arange(0, BLOCK)",
                                    "    mask = offs < N", "    h = " + load_call};
  for (const std::string& line : body) lines.push_back("    " + line);
  return lines;
}

std::vector<std::string> reducer_body(Reducer reducer, const std::string& load) {
  std::vector<std::string> body = {"r = tl.program_id(0)"};
  auto add = [&](std::vector<std::string> lines) { body.insert(body.end(), lines.begin(), lines.end()); };
  switch (reducer) {
    case Reducer::sum:
    case Reducer::mean:
      add({"acc = tl.zeros([BLOCK], dtype=tl.float32)"});
      add(row_pass(load, {"acc += tl.where(mask, h, 0.0)"}));
      add({reducer == Reducer::sum ? "tl.store(out_ptr + r, tl.sum(acc, axis=0))"
                                   : "tl.store(out_ptr + r, tl.sum(acc, axis=0) / N)"});
      break;
    case Reducer::max:
      add({"acc = tl.full([BLOCK], float(\"-inf\"), dtype=tl.float32)"});
      add(row_pass(load, {"acc = tl.maximum(acc, tl.where(mask, h, float(\"-inf\")))"}));
      add({"tl.store(out_ptr + r, tl.max(acc, axis=0))"});
      break;
    case Reducer::softmax:
      add({"mx = tl.full([BLOCK], float(\"-inf\"), dtype=tl.float32)"});
      add(row_pass(load, {"mx = tl.maximum(mx, tl.where(mask, h, float(\"-inf\")))"}));
      add({"m = tl.max(mx, axis=0)", "acc = tl.zeros([BLOCK], dtype=tl.float32)"});
      add(row_pass(load, {"acc += tl.where(mask, tl.exp(h - m), 0.0)"}));
      add({"s = tl.sum(acc, axis=0)"});
      add(row_pass(load, {"tl.store(out_ptr + r * N + offs, tl.exp(h - m) / s, mask=mask)"}));
      break;
    case Reducer::layer_norm:
      add({"acc = tl.zeros([BLOCK], dtype=tl.float32)"});
      add(row_pass(load, {"acc += tl.where(mask, h, 0.0)"}));
      add({"mean = tl.sum(acc, axis=0) / N", "acc = tl.zeros([BLOCK], dtype=tl.float32)"});
      add(row_pass(load, {"d = tl.where(mask, h - mean, 0.0)", "acc += d * d"}));
      add({"rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)"});
      add(row_pass(load, {"w = tl.load(w_ptr + offs, mask=mask, other=0.0)",
                          "b = tl.load(b_ptr + offs, mask=mask, other=0.0)",
                          "tl.store(out_ptr + r * N + offs, (h - mean) * rstd * w + b, mask=mask)"}));
      break;
    case Reducer::rms_norm:
      add({"acc = tl.zeros([BLOCK], dtype=tl.float32)"});
      add(row_pass(load, {"acc += tl.where(mask, h * h, 0.0)"}));
      add({"rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)"});
      add(row_pass(load, {"w = tl.load(w_ptr + offs, mask=mask, other=0.0)",
                          "tl.store(out_ptr + r * N + offs, h * rstd * w, mask=mask)"}));
      break;
    case Reducer::none: break;
  }
  return body;
}

// The norms' weights as kernel parameters, and as forward's arguments.
std::vector<std::string> norm_parameters(Reducer reducer) {
  if (reducer == Reducer::layer_norm) return {"w_ptr", "b_ptr"};
  if (reducer == Reducer::rms_norm) return {"w_ptr"};
  return {};
}
std::vector<std::string> norm_arguments(Reducer reducer) {
  if (reducer == Reducer::layer_norm) return {"self.norm.weight", "self.norm.bias"};
  if (reducer == Reducer::rms_norm) return {"self.norm.weight"};
  return {};
}

// The row kernel of `reducer` over x with `chain` applied to every chunk it loads.
std::string row_kernel(Reducer reducer, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"x_ptr"};
  for (const std::string& p : operand_parameters(chain)) parameters.push_back(p);
  for (const std::string& p : norm_parameters(reducer)) parameters.push_back(p);
  parameters.push_back("out_ptr");
  parameters.push_back("N");
  if (text::is_norm(reducer)) parameters.push_back("eps");
  parameters.push_back("BLOCK: tl.constexpr");
  std::vector<std::string> load_args = {"x_ptr"};
  for (const std::string& p : operand_parameters(chain)) load_args.push_back(p);
  std::string load = fmt::format("_load_chunk({}, r, offs, mask, N)", text::joined(load_args));
  return jit_function(fmt::format("_{}_kernel", reducer_name(reducer)), parameters, reducer_body(reducer, load));
}

std::string row_launch(Reducer reducer, const std::string& in, const std::vector<std::string>& operands) {
  std::vector<std::string> args = {in};
  for (const std::string& o : operands) args.push_back(o);
  for (const std::string& w : norm_arguments(reducer)) args.push_back(w);
  args.push_back("out");
  args.push_back("N");
  if (text::is_norm(reducer)) args.push_back("self.norm.eps");
  args.push_back("BLOCK=BLOCK");
  return fmt::format("_{}_kernel[(rows,)]({})", reducer_name(reducer), text::joined(args));
}

// --- The gemm ---

// x @ W^T over BLOCK_M x BLOCK_N output tiles, plus (fused) the bias and the epilogue chain.
std::string gemm_kernel(const std::string& name, bool with_epilogue, const std::vector<Step>& chain) {
  std::vector<std::string> parameters = {"x_ptr", "w_ptr"};
  if (with_epilogue) {
    parameters.push_back("b_ptr");
    for (const std::string& p : operand_parameters(chain)) parameters.push_back(p);
  }
  for (const char* p : {"out_ptr", "M", "N", "K", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr"})
    parameters.push_back(p);
  std::vector<std::string> body = {
      "rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
      "rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
      "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)",
      "for k0 in range(0, K, BLOCK_K):",
      "    rk = k0 + tl.arange(0, BLOCK_K)",
      "    a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)",
      "    # the weight is (N, K): a (BLOCK_N, BLOCK_K) tile, used transposed",
      "    w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)",
      "    acc += tl.dot(a, tl.trans(w), input_precision=\"ieee\")",
      "mask = (rm[:, None] < M) & (rn[None, :] < N)",
  };
  if (with_epilogue) {
    body.push_back("h = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]");
    for (const std::string& line : chain_lines(chain, Context::tile)) body.push_back(line);
  } else {
    body.push_back("h = acc");
  }
  body.push_back("tl.store(out_ptr + rm[:, None] * N + rn[None, :], h, mask=mask)");
  return jit_function(name, parameters, body);
}

// --- Whole candidates ---

std::vector<std::string> flat_setup_lines(const std::vector<Step>& chain, const std::string& numel, const std::string& cols) {
  std::vector<std::string> lines = {"n = " + numel};
  if (text::needs_cols(chain)) lines.push_back("cols = " + cols);
  lines.push_back("grid = (triton.cdiv(n, BLOCK),)");
  return lines;
}

const text::Launches kLaunches = {
    flat_setup_lines, flat_launch,
    [](const std::vector<std::string>& args) {
      return fmt::format("_fused_kernel[grid]({}, BLOCK=BLOCK)", text::joined(args));
    },
    row_launch};

CandidateCode elementwise(const ModuleSpec& spec, Fusion fusion, int block) {
  const bool fused = fusion == Fusion::fused;
  CandidateCode code;
  code.kernels = fused ? "\n\n" + flat_kernel("_fused_kernel", spec.chain) : step_kernels(spec.chain);
  code.forward = text::elementwise_forward(spec, fused, fmt::format("BLOCK = {}", block), kLaunches);
  return code;
}

CandidateCode reduction(const ModuleSpec& spec, Fusion fusion, int block) {
  const bool fused = fusion == Fusion::fused;
  const std::vector<Step> none;
  CandidateCode code;
  code.kernels = fused ? "\n\n" + load_chunk_function(spec.chain) + "\n\n" + row_kernel(spec.reducer, spec.chain)
                       : step_kernels(spec.chain) + "\n\n" + load_chunk_function(none) + "\n\n" +
                             row_kernel(spec.reducer, none);
  code.forward = text::reduction_forward(spec, fused, "N", "N", fmt::format("BLOCK = {}", block), kLaunches);
  return code;
}

CandidateCode gemm(const ModuleSpec& spec, Fusion fusion, int tile) {
  CandidateCode code;
  std::vector<std::string> lines = text::contiguous_inputs(spec);
  for (const char* l : {"w = self.linear.weight.contiguous()", "M, K = x.shape", "N = w.shape[0]"}) lines.push_back(l);
  lines.push_back(fmt::format("TILE = {}", tile));
  lines.push_back("tiles = (triton.cdiv(M, TILE), triton.cdiv(N, TILE))");
  std::string blocks = fmt::format("BLOCK_M=TILE, BLOCK_N=TILE, BLOCK_K={}", kGemmBlockK);
  if (fusion == Fusion::fused) {
    code.kernels = "\n\n" + gemm_kernel("_linear_kernel", true, spec.chain);
    lines.push_back("out = torch.empty((M, N), device=x.device, dtype=x.dtype)");
    lines.push_back(fmt::format("_linear_kernel[tiles]({}, {})", text::joined(text::gemm_fused_arguments(spec)), blocks));
    lines.push_back("return out");
  } else {
    // The bias add is an op of its own: a row vector added to every row of the product.
    std::vector<Step> chain = {Step{Op::add, Operand::row, "self.linear.bias"}};
    chain.insert(chain.end(), spec.chain.begin(), spec.chain.end());
    code.kernels = "\n\n" + gemm_kernel("_matmul_kernel", false, {}) + step_kernels(chain);
    lines.push_back("h0 = torch.empty((M, N), device=x.device, dtype=x.dtype)");
    lines.push_back(fmt::format("_matmul_kernel[tiles](x, w, h0, M, N, K, {})", blocks));
    lines.push_back("BLOCK = TILE * TILE");
    for (const std::string& l : text::unfused_chain_return(chain, "h0", "h0.numel()", "N", kLaunches)) lines.push_back(l);
  }
  code.forward = lines;
  return code;
}

}  // namespace

std::string render_triton(const ModuleSpec& spec, Fusion fusion, int block_size) {
  CandidateCode code = spec.kind == Kind::gemm        ? gemm(spec, fusion, block_size)
                       : spec.kind == Kind::reduction ? reduction(spec, fusion, block_size)
                                                      : elementwise(spec, fusion, block_size);
  return candidate_module(spec, CandidateSpec{Format::triton, fusion, block_size},
                          "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n", code);
}

}  // namespace kz::teacher
