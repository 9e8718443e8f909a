// The kernel teacher's writers: a module's KernelBench-format reference and its correct candidates.
//
// The reference is plain PyTorch (`class Model`, `get_inputs()`, `get_init_inputs()`, module-level
// size constants). Candidates define `ModelNew` in the `triton` or `cuda-rtc` format
// (docs/formats.md) and follow the strict policy: forward allocates outputs and intermediates
// (torch.empty / empty_like) and makes inputs contiguous; every op runs in a kernel of its own.
//   unfused  one kernel per op, intermediates in buffers (a gemm's bias add is an op of its own)
//   fused    one kernel for the whole module (chains recomputed in each pass over a row)
// The block size is the main kernel's tile: elements per program (Triton) or threads per block
// (cuda-rtc) for elementwise and row kernels, the square output tile of a gemm.
#pragma once

#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/teacher/grammar.h"

namespace kz::teacher {

enum class Format { triton, cuda_rtc };
enum class Fusion { unfused, fused };

const char* format_name(Format format);  // "triton", "cuda-rtc"
Result<Format> parse_format(const std::string& name);
const char* fusion_name(Fusion fusion);  // "unfused", "fused"

struct CandidateSpec {
  Format format = Format::triton;
  Fusion fusion = Fusion::fused;
  int block_size = 0;  // one of block_sizes(spec, format)
};

// The block-size variants of a module's kernels in a format: the usual one first, then a smaller
// and a larger one.
std::vector<int> block_sizes(const ModuleSpec& spec, Format format);

// The reference. Its size constants are the sampled sizes times `scale` (>= 1, for a GPU config);
// with scale > 1 it also carries `cpu_sizes` with the sampled ones, which the evaluator applies on
// the CPU.
std::string render_reference(const ModuleSpec& spec, int scale = 1);

// A candidate computing what the reference computes, at any sizes.
std::string render_candidate(const ModuleSpec& spec, const CandidateSpec& candidate);

}  // namespace kz::teacher
