// Static anti-cheating checks on a candidate's source (see static_checks.h).
#include "kz/eval/static_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <cstring>
#include <regex>
#include <set>
#include <tuple>
#include <utility>

namespace kz {
namespace {

enum class Where { code, strings };

struct Rule {
  Check check;
  Where where;
  const char* pattern;
  const char* what;
};

// Python rules search the code (comments and string literals removed); kernel-source rules search
// string literals (CUDA / C++ sources of cuda and cuda-rtc candidates).
const Rule kRules[] = {
    // ---- background_thread
    {Check::background_thread, Where::code, R"(\b(threading|_thread|multiprocessing|asyncio)\b)",
     "threads or processes of its own (threading, _thread, multiprocessing, asyncio)"},
    {Check::background_thread, Where::code, R"(\bconcurrent\s*\.\s*futures\b|\b(Thread|Process)PoolExecutor\b)",
     "a thread/process pool (concurrent.futures)"},
    {Check::background_thread, Where::code, R"(\bos\s*\.\s*(fork|forkpty|register_at_fork)\b)", "os.fork"},
    {Check::background_thread, Where::strings, R"(\bstd\s*::\s*(thread|jthread|async)\b|\bpthread_create\b)",
     "a C++ thread (std::thread, std::async, pthread_create)"},
    // ---- side_stream
    {Check::side_stream, Where::code,
     R"(\bcuda\s*\.\s*(Stream|ExternalStream|stream|set_stream|StreamContext)\b)",
     "a CUDA stream of its own (torch.cuda.Stream / stream / ExternalStream / set_stream)"},
    {Check::side_stream, Where::strings,
     R"(\b(cudaStreamCreate\w*|cuStreamCreate\w*|getStreamFromPool|getStreamFromExternal|setCurrentCUDAStream|cudaStreamPerThread)\b)",
     "a CUDA stream of its own in the kernel source"},
    // ---- tensor_subclass
    {Check::tensor_subclass, Where::code, R"(\bclass\s+\w+\s*\([^)]*\bTensor\b[^)]*\))",
     "a torch.Tensor subclass"},
    {Check::tensor_subclass, Where::code,
     R"(\b(__torch_function__|__torch_dispatch__|as_subclass|_make_subclass|_make_wrapper_subclass|TorchFunctionMode|TorchDispatchMode|_python_dispatch)\b)",
     "__torch_function__ / __torch_dispatch__, a tensor subclass or a torch mode"},
    {Check::tensor_subclass, Where::code, R"(\btorch\s*\.\s*overrides\b)", "torch.overrides"},
    // ---- harness_access: the harness, its process and its frames
    {Check::harness_access, Where::code, R"(\b(kz_worker|kz_reference)\b)", "the evaluation harness's modules"},
    {Check::harness_access, Where::code, R"(\bsys\s*\.\s*(modules|_getframe|settrace|setprofile|addaudithook|_current_frames)\b)",
     "sys.modules / frames / trace hooks"},
    {Check::harness_access, Where::code, R"(\bgc\s*\.\s*(get_objects|get_referrers|get_referents|callbacks)\b)",
     "the garbage collector's object graph (gc.get_objects / referrers / callbacks)"},
    {Check::harness_access, Where::code,
     R"(\binspect\s*\.\s*(currentframe|stack|getouterframes|getinnerframes|trace|getframeinfo)\b|\b(f_back|f_locals|f_globals|tb_frame|gi_frame|cr_frame)\b)",
     "stack frames (inspect, f_back, f_locals)"},
    {Check::harness_access, Where::code, R"(\bos\s*\.\s*(write|writev|pwrite|fdopen|dup|dup2|_exit|closerange)\b)",
     "raw file descriptors or the process (os.write, os.dup2, os._exit)"},
    {Check::harness_access, Where::code, R"(/proc/)", "/proc"},
    {Check::harness_access, Where::strings, R"(/proc/)", "/proc"},
    {Check::harness_access, Where::code, R"(\b(builtins|__builtins__)\b)", "builtins"},
    {Check::harness_access, Where::code,
     R"((^|;)[ \t]*(torch|time|os|sys|gc|math|json|kz_rtc|numpy|np|triton|tl)((\s*\.\s*\w+)+)[ \t]*(=(?!=)|\+=|-=|\*=))",
     "rebinding an attribute of torch, time, os, sys, triton, numpy..."},
    {Check::harness_access, Where::code, R"(\b(setattr|delattr)\s*\(\s*(torch|time|os|sys|gc|math|json|kz_rtc|numpy|np|triton)\b)",
     "setattr/delattr on torch, time, os, sys..."},
    {Check::harness_access, Where::code,
     R"((^|;)[ \t]*[\w.]*\.\s*(elapsed_time|perf_counter|perf_counter_ns|synchronize|compare_outputs|launch_count|__code__)[ \t]*=(?!=))",
     "rebinding a timer, synchronize or the harness's comparison"},
    {Check::harness_access, Where::code, R"(\b(__closure__|cell_contents|__kwdefaults__)\b)",
     "a function's closure cells or keyword defaults (changed in place, no audit event sees it)"},
    {Check::harness_access, Where::code, R"(\bregister_module_\w+_hook\b)", "a global nn.Module hook"},
    {Check::harness_access, Where::code,
     R"(\bLibrary\s*\(|\b_dispatch_library\b|\btorch\s*\.\s*library\s*\.\s*(impl|Library)\b)",
     "registering kernels for existing (aten) ops with torch.library"},
    {Check::harness_access, Where::code, R"(\b__import__\b|(^|[^\w.])(exec|eval)\s*\(|\bimportlib\s*\.\s*(import_module|reload)\b)",
     "dynamic imports or code (__import__, exec, eval, importlib.import_module)"},
    {Check::harness_access, Where::code, R"(\bsignal\s*\.\s*(signal|setitimer|alarm|pthread_kill)\b)",
     "signal handlers or timers"},
    {Check::harness_access, Where::code, R"(\bdef\s+__del__\b|\bweakref\s*\.\s*finalize\b|\batexit\b)",
     "code that runs at collection or exit (__del__, weakref.finalize, atexit)"},
    {Check::harness_access, Where::code, R"(\bctypes\s*\.\s*(pythonapi|PyDLL|py_object)\b)", "the CPython API through ctypes"},
    {Check::harness_access, Where::code, R"(\b_launches\b|\bkz_rtc\s*\.\s*_)", "kz_rtc's internals (its launch counter)"},
    {Check::harness_access, Where::code, R"(\b(launch_enter_hook|launch_exit_hook|JITFunction|InterpretedFunction)\b)",
     "Triton's launcher (the harness counts launches there)"},
    {Check::harness_access, Where::strings, R"(\b(PyRun_\w+|PyImport_\w+|PyObject_SetAttr\w*|PyEval_\w+|Py_Initialize)\b)",
     "the CPython API in a kernel source"},
    {Check::harness_access, Where::strings, R"(\b(write|dup2|dup3)\s*\(\s*3\s*,)", "writing to file descriptor 3 in a kernel source"},
};

int line_of(std::string_view text, size_t offset, int first_line = 1) {
  return first_line + static_cast<int>(std::count(text.begin(), text.begin() + offset, '\n'));
}

std::string excerpt_of(std::string match) {
  std::replace(match.begin(), match.end(), '\n', ' ');
  auto first = match.find_first_not_of(" \t");
  match = first == std::string::npos ? std::string() : match.substr(first);
  return match.size() <= 60 ? match : match.substr(0, 57) + "...";
}

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Class names the reference defines (Model and its helpers).
std::set<std::string> reference_classes(std::string_view reference_source) {
  std::set<std::string> names;
  std::string code = split_python(reference_source).code;
  static const std::regex klass(R"((^|\n)[ \t]*class\s+(\w+))");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), klass); it != std::sregex_iterator(); ++it)
    names.insert((*it)[2].str());
  return names;
}

void find_inheritance(const std::string& code, const std::set<std::string>& reference_names,
                      std::vector<StaticFinding>& out) {
  if (reference_names.empty()) return;
  static const std::regex klass(R"(\bclass\s+(\w+)\s*\(([^)]*)\))");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), klass); it != std::sregex_iterator(); ++it) {
    std::string bases = (*it)[2].str();
    size_t start = 0;
    while (start <= bases.size()) {
      size_t comma = bases.find(',', start);
      std::string base = bases.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? bases.size() + 1 : comma + 1;
      if (base.find('=') != std::string::npos) continue;  // metaclass=...
      base.erase(std::remove_if(base.begin(), base.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
                 base.end());
      auto dot = base.rfind('.');
      std::string name = dot == std::string::npos ? base : base.substr(dot + 1);
      if (reference_names.count(name)) {
        out.push_back({Check::inherits_reference, line_of(code, it->position(0)),
                       fmt::format("class {} inherits {}, a class of the reference", (*it)[1].str(), name),
                       excerpt_of(it->str())});
      }
    }
  }
}

}  // namespace

PythonText split_python(std::string_view s) {
  PythonText out;
  out.code.reserve(s.size());
  int line = 1;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    char c = s[i];
    if (c == '#') {
      while (i < n && s[i] != '\n') ++i;
      continue;
    }
    if (c != '\'' && c != '"') {
      out.code += c;
      if (c == '\n') ++line;
      ++i;
      continue;
    }
    // A string literal: its prefix letters (already copied) tell an f-string.
    size_t p = out.code.size();
    size_t prefix_start = p;
    while (prefix_start > 0 && p - prefix_start < 2 && std::strchr("rRbBuUfF", out.code[prefix_start - 1]))
      --prefix_start;
    bool prefixed = prefix_start < p && (prefix_start == 0 || !is_ident(out.code[prefix_start - 1]));
    bool fstring = prefixed && out.code.substr(prefix_start, p - prefix_start).find_first_of("fF") != std::string::npos;
    bool triple = i + 2 < n && s[i + 1] == c && s[i + 2] == c;
    size_t open = triple ? 3 : 1;
    size_t j = i + open;
    size_t content_end = n, end = n;
    while (j < n) {
      if (s[j] == '\\') {
        j += 2;
        continue;
      }
      if (!triple && s[j] == '\n') {  // unterminated: stop at the line's end
        content_end = end = j;
        break;
      }
      if (s[j] == c && (!triple || (j + 2 < n && s[j + 1] == c && s[j + 2] == c))) {
        content_end = j;
        end = j + open;
        break;
      }
      ++j;
    }
    content_end = std::min(content_end, n);
    end = std::min(end, n);
    std::string_view content = s.substr(i + open, content_end - std::min(content_end, i + open));
    out.strings.push_back({line, std::string(content)});
    out.code.append(open, c);
    for (char d : content) out.code += fstring ? d : (d == '\n' ? '\n' : ' ');
    out.code.append(end - content_end, c);
    line += static_cast<int>(std::count(s.begin() + i, s.begin() + end, '\n'));
    i = end;
  }
  return out;
}

std::vector<StaticFinding> static_checks(std::string_view candidate_source, Format format,
                                         std::string_view reference_source) {
  PythonText text = split_python(candidate_source);
  std::vector<StaticFinding> findings;
  const bool baseline = format == Format::torch;
  if (!baseline) find_inheritance(text.code, reference_classes(reference_source), findings);
  // Compiled once (thread-safe static initialisation): evaluate() may run on several threads.
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> compiled;
    for (const Rule& rule : kRules) compiled.emplace_back(rule.pattern, std::regex::ECMAScript | std::regex::multiline);
    return compiled;
  }();
  for (size_t r = 0; r < std::size(kRules); ++r) {
    const Rule& rule = kRules[r];
    const std::regex& pattern = patterns[r];
    if (baseline && rule.check != Check::harness_access) continue;
    if (rule.where == Where::code) {
      for (auto it = std::sregex_iterator(text.code.begin(), text.code.end(), pattern); it != std::sregex_iterator();
           ++it)
        findings.push_back({rule.check, line_of(text.code, it->position(0)), rule.what, excerpt_of(it->str())});
    } else {
      for (const auto& literal : text.strings) {
        for (auto it = std::sregex_iterator(literal.text.begin(), literal.text.end(), pattern);
             it != std::sregex_iterator(); ++it)
          findings.push_back(
              {rule.check, line_of(literal.text, it->position(0), literal.line), rule.what, excerpt_of(it->str())});
      }
    }
  }
  // Source order; one finding per (check, line, rule).
  std::stable_sort(findings.begin(), findings.end(),
                   [](const StaticFinding& a, const StaticFinding& b) { return a.line < b.line; });
  std::set<std::tuple<int, int, std::string>> seen;
  std::vector<StaticFinding> unique;
  for (auto& f : findings)
    if (seen.insert({static_cast<int>(f.check), f.line, f.what}).second) unique.push_back(std::move(f));
  return unique;
}

Verdict static_checks_verdict(const std::vector<StaticFinding>& findings) {
  std::vector<Check> checks;
  std::string message = fmt::format("static checks on the source found {} problem{}:", findings.size(),
                                    findings.size() == 1 ? "" : "s");
  size_t shown = 0;
  for (const auto& f : findings) {
    if (std::find(checks.begin(), checks.end(), f.check) == checks.end()) checks.push_back(f.check);
    if (shown++ < 12) message += fmt::format("\n  line {}: {}: {} (`{}`)", f.line, check_name(f.check), f.what, f.excerpt);
  }
  if (findings.size() > 12) message += fmt::format("\n  ... and {} more", findings.size() - 12);
  Verdict v = make_verdict(EvalStatus::cheat_detected, std::move(checks), std::move(message));
  v.stage = "static_checks";
  return v;
}

}  // namespace kz
