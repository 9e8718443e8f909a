// kz-nvcc: nvcc for one `.cu` compiled to an object (what load_inline's ninja asks for), with the
// host and device halves of the compilation run side by side instead of one after the other.
//
// nvcc runs, one at a time: the host preprocessor, cudafe++ (the host front end, which names the
// module), the device preprocessor, cicc (the device front end and optimiser), ptxas, fatbinary,
// then the host compiler on cudafe++'s output (which includes the fatbinary). On a kernel with
// torch's headers the two front ends are ~2/3 of the time. cicc only waits for cudafe++ to read
// the module's id; cicc can compute the same id itself. So kz-nvcc takes nvcc's own plan
// (`nvcc --dryrun`) and runs the host chain; the device chain (computing its own module id) starts
// beside it at once, or with the "idle" policy as soon as a core is idle, checked while the host
// chain runs, and where none comes free it runs after the host chain, reading cudafe++'s id, in
// nvcc's order. Side by side, kz-nvcc
// checks that the two ids agree (otherwise it runs the device chain again with cudafe++'s id, as
// nvcc would). Then it runs the host compile. The commands and their arguments are
// nvcc's own, so the object is nvcc's, byte for byte (parallel_nvcc_test). Each command's output
// is passed on in nvcc's order, and a failure ends it with that command's status, as nvcc does;
// run by ninja (load_inline's build), a failure also ends ninja's other steps in the same build
// directory (main.cpp's compile), whose output nothing would link, once ninja has its messages.
// Anything else (other flags, several inputs, a plan it does not recognise) runs nvcc itself.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/status.h"

namespace kz::nvcc {

// One command of nvcc's plan, its words as nvcc would pass them (quotes removed, $VARs expanded).
using Command = std::vector<std::string>;

// nvcc's plan for one compile, split in the two chains that can run at once.
struct Plan {
  std::map<std::string, std::string> variables;  // nvcc.profile's (PATH, CICC_PATH, ...), for every command
  std::vector<Command> host_chain;         // host preprocessing, cudafe++ (which writes the module id)
  std::vector<Command> device_chain;       // device preprocessing, cicc, ptxas, fatbinary, as nvcc runs them
  std::vector<Command> final_commands;     // the host compile, after both chains
  std::string module_id_file;              // where cudafe++ writes the module id
  std::string own_module_id_file;          // where the device chain's cicc writes its own (device_chain_with_own_id)
};

// The words of one line of `nvcc --dryrun` output, split as /bin/sh would: whitespace separates
// words, double and single quotes group, $NAME and ${NAME} expand from `variables`. nullopt for
// anything sh would treat otherwise (unknown variables, $( ), backquotes, ;, |, &, <, >, globs):
// such a plan is left to nvcc.
std::optional<Command> split_command(std::string_view line, const std::map<std::string, std::string>& variables);

// The plan from `nvcc --dryrun`'s stderr, for a compile whose intermediates go to a keep dir (see
// dryrun_arguments). An error says why the plan is not one kz-nvcc runs (then nvcc runs itself).
Result<Plan> plan_from_dryrun(std::string_view dryrun_output, const std::string& own_module_id_file);

// The device chain to run beside cudafe++: every cicc writing its own module id to
// plan.own_module_id_file instead of reading cudafe++'s.
std::vector<Command> device_chain_with_own_id(const Plan& plan);

// A dependency file nvcc was asked for (-MD -MF FILE): kz-nvcc writes it from the preprocessors'.
struct DependencyFile {
  std::string path;    // -MF
  std::string target;  // the object (-o), as given
};

// What kz-nvcc does with nvcc's arguments: the arguments for `nvcc --dryrun` (without -MD -MF,
// with --keep --keep-dir keep_dir added), and the dependency file asked for. nullopt where the
// compile is not one kz-nvcc runs: not `-c` of exactly one .cu to an `-o` object, or any option
// that changes nvcc's steps (-E, -M alone, -rdc, -dc, -ptx, --dryrun, --keep, --time, -v, ...).
struct Invocation {
  std::vector<std::string> dryrun_arguments;
  std::optional<DependencyFile> dependencies;
};
std::optional<Invocation> plan_invocation(const std::vector<std::string>& args, const std::string& keep_dir);

// Adds `-MD -MF depfile -MT target` to a preprocessing command (gcc writes the header list while it
// preprocesses).
Command with_dependency_output(Command command, const std::string& depfile, const std::string& target);

// The dependency file nvcc would write: `target : file \` and one dependency per line, the union of
// the preprocessors' dependency files (gcc's make syntax) in the order first seen.
Result<std::string> merge_dependency_files(const std::vector<std::string>& gcc_depfiles, const std::string& target);

// Whether the device chain may start beside the host chain now: `policy` "always" (the workers'
// default, [tuning] nvcc_side_by_side), "never" (nvcc itself), or "idle" (kz-nvcc's own default):
// while a core is idle (`running()`, asked for "idle" only: the host's runnable tasks, this one
// included, /proc/stat's procs_running; `cores`: the host's online cores).
bool side_by_side(std::string_view policy, const std::function<int()>& running, int cores);

// Waits for the device chain's start: until `idle()` has said yes `in_a_row` times running (asked at
// once, then after each `pause()`), or `host_done()`. Whether a core came free while the host chain
// ran (then the chains run side by side); false where the host chain ended first (then the device
// chain follows it, as in nvcc). A cold batch's pre-builds start while its evaluations fill every
// core, and end eight at a time, each in one compiler with half the cores idle: a decision taken
// once at the start would leave their second halves waiting for their first.
// Several looks in a row, since one may fall in a short lull of a busy host.
bool wait_for_idle_core(const std::function<bool()>& idle, const std::function<bool()>& host_done,
                        const std::function<void()>& pause, int in_a_row);

// kz-nvcc's main: runs the compile as above with `real_nvcc` (side by side as $KZ_NVCC_SIDE_BY_SIDE
// says, see side_by_side), or execs real_nvcc with `args` where it does not apply. Returns the exit
// status nvcc would.
int run(const std::string& real_nvcc, const std::vector<std::string>& args);

}  // namespace kz::nvcc
