// Static anti-cheating checks on a candidate's source, run by the Evaluator before any worker
// starts (they cost no process). Each finding names a check of KZ_EVAL_CHECKS:
//
//   inherits_reference  a class (ModelNew) inheriting a class named like one of the reference's
//   background_thread   threading, _thread, concurrent.futures, multiprocessing, asyncio, os.fork;
//                       std::thread / pthread_create / std::async in C++ sources
//   side_stream         torch.cuda.Stream / stream( / ExternalStream / set_stream; cudaStreamCreate,
//                       cuStreamCreate, getStreamFromPool, setCurrentCUDAStream in kernel sources
//   tensor_subclass     a torch.Tensor subclass, __torch_function__ / __torch_dispatch__,
//                       as_subclass, _make_subclass, TorchFunctionMode / TorchDispatchMode
//   harness_access      the harness (kz_worker, kz_reference, sys.modules, gc.get_objects, frames,
//                       os.write / os._exit / fds, /proc/, builtins), rebinding attributes of torch,
//                       time, os, sys...; setattr on them; global module hooks; aten registrations
//                       (torch.library.Library); __import__, exec, eval; signal handlers and timers;
//                       destructors (__del__, weakref.finalize, atexit); the CPython C API in C++
//
// Python comments are ignored; string literals are ignored by the Python rules and searched by
// the kernel-source rules (CUDA/C++ code lives in strings). A static scan is a cheap first line:
// obfuscated code (getattr with built-up names) passes it, and the worker's dynamic checks
// (worker/kz_worker/cheats.py) are the second.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kz/eval/format.h"
#include "kz/eval/verdict.h"

namespace kz {

struct StaticFinding {
  Check check;
  int line = 0;          // 1-based line in the candidate source
  std::string what;      // the rule, in words
  std::string excerpt;   // the matched text
};

// Every finding, in source order. Format torch (baselines: a reference as its own candidate) is
// scanned only for harness_access.
std::vector<StaticFinding> static_checks(std::string_view candidate_source, Format format,
                                         std::string_view reference_source);

// A cheat_detected verdict naming every check that fired (stage "static_checks"), for findings
// that are not empty.
Verdict static_checks_verdict(const std::vector<StaticFinding>& findings);

// The candidate's Python code with comments removed and string literals blanked (newlines kept,
// so offsets give the same lines), and the string literals themselves. Exposed for the tests.
struct PythonText {
  std::string code;
  struct Literal {
    int line;
    std::string text;
  };
  std::vector<Literal> strings;
};
PythonText split_python(std::string_view source);

}  // namespace kz
