// kz-nvcc (kz/eval/parallel_nvcc.h): reading nvcc's plan, and, with the real nvcc, the same object,
// dependency file, messages and exit status as nvcc's for good and broken sources.
#include "kz/eval/parallel_nvcc.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <csignal>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "test_support.h"

namespace kz::nvcc {
namespace {
namespace fs = std::filesystem;

TEST(ParallelNvccSplit, QuotesAndVariablesAsShDoes) {
  std::map<std::string, std::string> vars = {{"CICC_PATH", "/cuda/nvvm/bin"}};
  auto words = split_command(R"("$CICC_PATH/cicc" -I"/a b/inc" --opt="-x -y " 'it''s' ${CICC_PATH}x plain)", vars);
  ASSERT_TRUE(words.has_value());
  EXPECT_EQ(*words, (Command{"/cuda/nvvm/bin/cicc", "-I/a b/inc", "--opt=-x -y ", "its", "/cuda/nvvm/binx", "plain"}));
  auto escaped = split_command(R"(gcc "-DQ=\"s\"" x)", vars);
  ASSERT_TRUE(escaped.has_value());
  EXPECT_EQ((*escaped)[1], R"(-DQ="s")");
}

TEST(ParallelNvccSplit, AnythingShWouldReadOtherwiseIsRefused) {
  std::map<std::string, std::string> vars = {{"A", "1"}};
  for (const char* line : {"gcc $UNKNOWN", "gcc $(rm -rf x)", "gcc `id`", "gcc a; rm b", "gcc a | b", "gcc > out",
                           "gcc a && b", "gcc *.cu", "gcc \"unterminated", "-- Filter Dependencies -- > x.d", ""}) {
    EXPECT_FALSE(split_command(line, vars).has_value()) << line;
  }
}

// What load_inline's ninja runs: torch's flags, a dependency file, -c, -o.
std::vector<std::string> torch_like_args() {
  return {"-MD", "-MF", "cuda.cuda.o.d", "-DTORCH_EXTENSION_NAME=ext", "-isystem", "/torch/include",
          "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC",
          "-O3", "-std=c++17", "-c", "/build/cuda.cu", "-o", "cuda.cuda.o"};
}

TEST(ParallelNvccInvocation, ACompileToAnObjectIsPlannedWithItsDependencyFileApart) {
  auto invocation = plan_invocation(torch_like_args(), "/tmp/keep");
  ASSERT_TRUE(invocation.has_value());
  ASSERT_TRUE(invocation->dependencies.has_value());
  EXPECT_EQ(invocation->dependencies->path, "cuda.cuda.o.d");
  EXPECT_EQ(invocation->dependencies->target, "cuda.cuda.o");
  const auto& args = invocation->dryrun_arguments;
  EXPECT_EQ(std::count(args.begin(), args.end(), "-MD") + std::count(args.begin(), args.end(), "-MF"), 0);
  EXPECT_EQ(std::vector<std::string>(args.end() - 4, args.end()),
            (std::vector<std::string>{"--dryrun", "--keep", "--keep-dir", "/tmp/keep"}));
  EXPECT_EQ(args.size(), torch_like_args().size() - 3 + 4);
}

TEST(ParallelNvccInvocation, OtherCompilesAreLeftToNvcc) {
  auto without = [](std::vector<std::string> args, const std::string& drop) {
    args.erase(std::find(args.begin(), args.end(), drop));
    return args;
  };
  auto with = [](std::vector<std::string> args, const std::string& extra) {
    args.push_back(extra);
    return args;
  };
  EXPECT_FALSE(plan_invocation(without(torch_like_args(), "-c"), "/k"));   // a link
  EXPECT_FALSE(plan_invocation(without(torch_like_args(), "-o"), "/k"));   // no object named
  EXPECT_FALSE(plan_invocation(without(torch_like_args(), "-MF"), "/k"));  // -MD without its file
  for (const char* option : {"-E", "-M", "-MMD", "-rdc=true", "-dc", "-ptx", "--dryrun", "--keep", "--time=t.csv",
                             "-v", "--threads=4", "-t", "--version", "-lto", "-odir"}) {
    EXPECT_FALSE(plan_invocation(with(torch_like_args(), option), "/k")) << option;
  }
  EXPECT_TRUE(plan_invocation(without(without(torch_like_args(), "-MD"), "-MF"), "/k"));  // cuda.cuda.o.d left alone
  // Values nvcc may give sh unquoted (found by a review: $ expanding, words splitting, a newline
  // forging a line of nvcc's plan), repeated options nvcc warns of, a target the depfile cannot hold.
  for (const char* value : {"-DNAME=a$_SPACE_b", "-DNAME=`id`", "-DNAME=a\\b", "/dev/null\n#$ PATH=/evil"}) {
    EXPECT_FALSE(plan_invocation(with(with(torch_like_args(), "-Xcompiler"), value), "/k")) << value;
  }
  EXPECT_FALSE(plan_invocation(with(with(torch_like_args(), "-MF"), "other.d"), "/k"));
  EXPECT_FALSE(plan_invocation(with(torch_like_args(), "-MD"), "/k"));
  std::vector<std::string> colon = torch_like_args();
  colon.back() = "c: d.o";
  EXPECT_FALSE(plan_invocation(colon, "/k"));
}

// `nvcc --dryrun --keep` for one .cu (CUDA 13's order), shortened.
constexpr const char* kDryrun =
    "#$ _NVVM_BRANCH_=nvvm\n"
    "#$ CICC_PATH=/cuda/bin/../nvvm/bin\n"
    "#$ PATH=/cuda/bin/../nvvm/bin:/usr/bin\n"
    "#$ INCLUDES=\"-I/cuda/include\"  \n"
    "#$ gcc -D__CUDA_ARCH_LIST__=900 -E -x c++ -D__CUDACC__ \"k.cu\" -o \"keep/k.cpp4.ii\" \n"
    "#$ cudafe++ --c++17 --gen_c_file_name \"keep/k.cudafe1.cpp\" --stub_file_name \"k.cudafe1.stub.c\" "
    "--gen_module_id_file --module_id_file_name \"keep/k.module_id\" \"keep/k.cpp4.ii\" \n"
    "#$ gcc -D__CUDA_ARCH__=900 -D__CUDA_ARCH_LIST__=900 -E -x c++ \"k.cu\" -o \"keep/k.cpp1.ii\" \n"
    "#$ \"$CICC_PATH/cicc\" --c++17 -arch compute_90 --module_id_file_name \"keep/k.module_id\" "
    "--stub_file_name \"keep/k.cudafe1.stub.c\" \"keep/k.cpp1.ii\" -o \"keep/k.ptx\"\n"
    "#$ ptxas -arch=sm_90 -m64 \"keep/k.ptx\" -o \"keep/k.cubin\" \n"
    "#$ fatbinary --create=\"keep/k.fatbin\" -64 \"--image3=kind=elf,sm=90,file=keep/k.cubin\" "
    "--embedded-fatbin=\"keep/k.fatbin.c\" \n"
    "#$ gcc -D__CUDA_ARCH__=900 -c -x c++ -fPIC \"keep/k.cudafe1.cpp\" -o \"k.o\" \n";

TEST(ParallelNvccPlan, TheTwoChainsAndTheHostCompile) {
  auto plan = plan_from_dryrun(kDryrun, "keep/own.module_id");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->variables.at("CICC_PATH"), "/cuda/bin/../nvvm/bin");
  ASSERT_EQ(plan->host_chain.size(), 2u);
  EXPECT_EQ(plan->host_chain[1][0], "cudafe++");
  ASSERT_EQ(plan->device_chain.size(), 4u);
  EXPECT_EQ(plan->device_chain[1][0], "/cuda/bin/../nvvm/bin/cicc");
  ASSERT_EQ(plan->final_commands.size(), 1u);
  EXPECT_EQ(plan->module_id_file, "keep/k.module_id");
  // The device chain that runs beside cudafe++ makes its own id; the other is nvcc's, word for word.
  const Command own = device_chain_with_own_id(*plan)[1];
  auto at = std::find(own.begin(), own.end(), "--module_id_file_name");
  ASSERT_NE(at, own.end());
  EXPECT_EQ(*(at - 1), "--gen_module_id_file");
  EXPECT_EQ(*(at + 1), "keep/own.module_id");
  EXPECT_EQ(std::find(plan->device_chain[1].begin(), plan->device_chain[1].end(), "--gen_module_id_file"),
            plan->device_chain[1].end());
}

TEST(ParallelNvccPlan, PlansItDoesNotKnowAreRefused) {
  auto replaced = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  std::string text = kDryrun;
  EXPECT_FALSE(plan_from_dryrun(text + "#$ nvlink k.o -o k_dlink.o\n", "own").ok());
  EXPECT_FALSE(plan_from_dryrun(text + "#$ gcc -c other.cpp -o other.o\n", "own").ok());  // two host compiles
  EXPECT_FALSE(plan_from_dryrun("nvcc warning : something\n" + text, "own").ok());  // nvcc then says it itself
  EXPECT_FALSE(plan_from_dryrun(replaced(text, "compute_90 --module_id_file_name \"keep/k.module_id\"",
                                         "compute_90 --module_id_file_name \"keep/other\""), "own").ok());
  EXPECT_FALSE(plan_from_dryrun(replaced(text, "--gen_module_id_file ", ""), "own").ok());
  EXPECT_FALSE(plan_from_dryrun(replaced(text, "\"keep/k.cudafe1.cpp\" -o", "\"keep/k.cudafe1.cpp\" > x -o"), "own").ok());
  EXPECT_FALSE(plan_from_dryrun(text + "#$ PATH=/elsewhere\n", "own").ok());  // variables come first, as nvcc prints them
}

TEST(ParallelNvccPlan, VariablesKeepTheirValueAsPrinted) {
  auto plan = plan_from_dryrun(std::string("#$ _SPACE_= \n") + kDryrun, "own");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->variables.at("_SPACE_"), " ");
  EXPECT_EQ(plan->variables.at("CICC_PATH"), "/cuda/bin/../nvvm/bin");
}

TEST(ParallelNvccDependencies, TheUnionInTheOrderFirstSeen) {
  fs::path dir = fs::path(::testing::TempDir()) / "kz-nvcc-deps";
  fs::create_directories(dir);
  std::ofstream(dir / "device.d") << "k.o: k.cu /inc/a.h \\\n /inc/with\\ space.h /inc/b.h\n";
  std::ofstream(dir / "host.d") << "k.o: k.cu /inc/b.h \\\n  /inc/c.h\n";
  auto merged = merge_dependency_files({(dir / "device.d").string(), (dir / "host.d").string()}, "out/k.o");
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_EQ(*merged, "out/k.o : k.cu \\\n    /inc/a.h \\\n    /inc/with\\ space.h \\\n    /inc/b.h \\\n    /inc/c.h\n");
  EXPECT_FALSE(merge_dependency_files({(dir / "missing.d").string()}, "k.o").ok());
}

TEST(ParallelNvccPolicy, SideBySideOnlyWhileACoreIsIdleUnlessTold) {
  EXPECT_TRUE(side_by_side("idle", [] { return 3; }, 16));
  EXPECT_TRUE(side_by_side("idle", [] { return 15; }, 16));
  EXPECT_FALSE(side_by_side("idle", [] { return 16; }, 16));  // the second chain would take a core from other work
  EXPECT_FALSE(side_by_side("idle", [] { return 40; }, 16));
  EXPECT_TRUE(side_by_side("always", [] { return 40; }, 16));
  EXPECT_FALSE(side_by_side("never", [] { return 1; }, 16));
  int looks = 0;  // /proc/stat's three looks cost a build ~10 ms: only "idle" takes them
  EXPECT_TRUE(side_by_side("always", [&] { return ++looks; }, 16));
  EXPECT_EQ(looks, 0);
}

TEST(ParallelNvccPolicy, TheDeviceChainStartsWhenACoreComesFreeOrAfterTheHostChain) {
  int pauses = 0;
  auto pause = [&] { ++pauses; };
  auto never_done = [] { return false; };
  // Busy, busy, idle, busy (a lull), then idle three times running: started at the 7th look.
  const std::vector<bool> looks = {false, false, true, false, true, true, true, true};
  size_t asked = 0;
  EXPECT_TRUE(wait_for_idle_core([&] { return looks.at(asked++); }, never_done, pause, 3));
  EXPECT_EQ(asked, 7u) << "one idle look in a lull is not enough";
  EXPECT_EQ(pauses, 6);
  int polls = 0;
  EXPECT_FALSE(wait_for_idle_core([] { return false; }, [&] { return ++polls == 4; }, pause, 3));
  pauses = 0;
  EXPECT_TRUE(wait_for_idle_core([] { return true; }, never_done, pause, 1)) << "\"always\": at once";
  EXPECT_EQ(pauses, 0);
  EXPECT_FALSE(wait_for_idle_core([] { return true; }, [] { return true; }, pause, 1))
      << "the host chain done: the device chain follows it, as in nvcc";
}

// ---- through the real nvcc ------------------------------------------------------------------------

class ParallelNvccReal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_nvcc()) GTEST_SKIP() << "nvcc not found";
    dir_ = fs::path(::testing::TempDir()) / ("kz-nvcc-real-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "nvcc-keep");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }

  // Runs `tool` (nvcc or kz-nvcc) in dir_ with `args`; $KZ_NVCC_REPORT is dir_/report.jsonl.
  RunResult compile(const std::string& tool, std::vector<std::string> args) {
    ProcessSpec spec;
    spec.argv = {tool};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = current_environment();
    spec.env["KZ_NVCC_REPORT"] = (dir_ / "report.jsonl").string();
    spec.env["KZ_NVCC_SIDE_BY_SIDE"] = side_by_side_;
    spec.env["TMPDIR"] = dir_.string();
    spec.cwd = dir_;
    auto result = run_process(spec, std::chrono::minutes(5));
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    return result.ok() ? *result : RunResult{};
  }

  std::string last_report() {
    auto text = read_file(dir_ / "report.jsonl");
    if (!text.ok() || text->empty()) return "";
    std::string trimmed = text->substr(0, text->size() - 1);
    return trimmed.substr(trimmed.rfind('\n') == std::string::npos ? 0 : trimmed.rfind('\n') + 1);
  }

  // Messages name the intermediates' paths, which differ between the two (nvcc's temporary names).
  static std::string without_paths(const std::string& text) {
    return std::regex_replace(text, std::regex(R"([^ ,]*(tmpxft|kz-nvcc-)[^ ,]*)"), "<tmp>");
  }

  fs::path dir_;
  std::string side_by_side_ = "always";  // these tests check the side-by-side path, whatever else runs
};

constexpr const char* kKernel = R"(#include <cstdio>
namespace { __device__ float twice(float v) { return 2 * v; } }
__global__ void scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = twice(x[i]);
}
void launch(float* x, int n) { scale<<<(n + 255) / 256, 256>>>(x, n); }
)";

TEST_F(ParallelNvccReal, TheObjectAndDependencyFileAreNvccsByteForByte) {
  write("k.cu", kKernel);
  std::vector<std::string> flags = {"-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
                                    "--compiler-options", "-fPIC", "-O3", "-std=c++17", "-c", "k.cu"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  // nvcc keeps its intermediates under the same names kz-nvcc's keep dir gives them.
  RunResult expected = compile(test::nvcc_path(), with({"-MD", "-MF", "nvcc.d", "-o", "k.o", "--keep", "--keep-dir", "nvcc-keep"}));
  ASSERT_EQ(expected.exit.exit_code, 0) << expected.stderr_text;
  fs::rename(dir_ / "k.o", dir_ / "nvcc.o");
  RunResult got = compile(KZ_NVCC_TOOL, with({"-MD", "-MF", "kz.d", "-o", "k.o"}));
  ASSERT_EQ(got.exit.exit_code, 0) << got.stderr_text;
  EXPECT_NE(last_report().find(R"("module_ids_agree":true,"parallel":true)"), std::string::npos) << last_report();
  EXPECT_EQ(*read_file(dir_ / "k.o"), *read_file(dir_ / "nvcc.o"));
  EXPECT_EQ(*read_file(dir_ / "kz.d"), *read_file(dir_ / "nvcc.d"));
  EXPECT_EQ(got.stderr_text, expected.stderr_text);
  // Nothing of kz-nvcc's own is left in TMPDIR.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().rfind("kz-nvcc-", 0), std::string::npos) << entry.path();
  }
}

// More spinning processes than cores while it lives: no core is idle for kz-nvcc's device chain.
struct BusyCores {
  std::vector<Process> spinners;
  BusyCores() {
    for (unsigned i = 0; i <= std::thread::hardware_concurrency(); ++i) {
      ProcessSpec spec;
      spec.argv = {"sh", "-c", "while :; do :; done"};
      spec.env = {{"PATH", "/usr/bin:/bin"}};
      auto spinner = Process::spawn(spec);
      if (!spinner.ok()) ADD_FAILURE() << spinner.status().to_string();
      else spinners.push_back(std::move(*spinner));
    }
  }
};

// Every core busy for the whole host chain: the device chain follows the host chain with nvcc's own
// commands (cudafe++'s module id), and the object, the dependency file and the messages are nvcc's.
TEST_F(ParallelNvccReal, WithNoIdleCoreTheChainsRunInNvccsOrderWithTheSameObject) {
  auto busy = std::make_unique<BusyCores>();
  write("k.cu", kKernel);
  std::vector<std::string> flags = {"-arch=sm_90", "--compiler-options", "-fPIC", "-c", "k.cu", "-MD"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  RunResult expected = compile(test::nvcc_path(), with({"-MF", "nvcc.d", "-o", "k.o", "--keep", "--keep-dir", "nvcc-keep"}));
  ASSERT_EQ(expected.exit.exit_code, 0) << expected.stderr_text;
  fs::rename(dir_ / "k.o", dir_ / "nvcc.o");
  side_by_side_ = "idle";
  RunResult got = compile(KZ_NVCC_TOOL, with({"-MF", "kz.d", "-o", "k.o"}));
  busy.reset();  // the spinners killed
  ASSERT_EQ(got.exit.exit_code, 0) << got.stderr_text;
  std::string report = last_report();
  EXPECT_NE(report.find(R"("parallel":false)"), std::string::npos) << report;
  EXPECT_NE(report.find(R"("device_chain_started_s")"), std::string::npos) << "kz-nvcc ran the chains itself: " << report;
  EXPECT_EQ(report.find("module_ids_agree"), std::string::npos) << "no second id to check: " << report;
  EXPECT_EQ(*read_file(dir_ / "k.o"), *read_file(dir_ / "nvcc.o"));
  EXPECT_EQ(*read_file(dir_ / "kz.d"), *read_file(dir_ / "nvcc.d"));
  EXPECT_EQ(got.stderr_text, expected.stderr_text);
}

TEST_F(ParallelNvccReal, BrokenSourcesFailAsUnderNvccWithItsMessagesAndStatus) {
  struct Case {
    const char* name;
    const char* source;
  };
  // Side by side, and one after the other with every core busy (the device chain after the host's).
  for (bool side_by_side : {true, false}) {
    std::unique_ptr<BusyCores> busy;
    if (!side_by_side) busy = std::make_unique<BusyCores>();
    side_by_side_ = side_by_side ? "always" : "idle";
    for (const Case& broken : {
             Case{"host_front_end", "__global__ void k(float* x) { x[0] = undefined_name; }\n"},
             Case{"device_front_end", "__host__ int h() { return 1; }\n__global__ void k(int* x) { x[0] = h(); }\n"},
             Case{"ptxas", "__global__ void k(float* x) { asm(\"bogus.instr;\"); }\n"},
             Case{"preprocessor", "#include \"no_such_header.h\"\n"},
         }) {
      SCOPED_TRACE(std::string(broken.name) + (side_by_side ? " side by side" : " one after the other"));
      write(std::string(broken.name) + ".cu", broken.source);
      std::vector<std::string> args = {"-arch=sm_90", "-c", std::string(broken.name) + ".cu", "-o", "broken.o"};
      RunResult expected = compile(test::nvcc_path(), args);
      RunResult got = compile(KZ_NVCC_TOOL, args);
      EXPECT_NE(expected.exit.exit_code, 0);
      EXPECT_EQ(got.exit.exit_code, expected.exit.exit_code);
      EXPECT_EQ(without_paths(got.stderr_text), without_paths(expected.stderr_text));
      std::string parallel = side_by_side ? R"("parallel":true)" : R"("parallel":false)";
      EXPECT_NE(last_report().find(parallel), std::string::npos) << last_report();
    }
  }
}

// ninja as load_inline runs it: on PATH, else the one scripts/setup.sh put in the project's venv.
std::optional<std::string> ninja_path() {
  if (std::system("command -v ninja > /dev/null 2>&1") == 0) return "ninja";
  fs::path in_venv = test::source_dir() / ".venv" / "bin" / "ninja";
  return fs::exists(in_venv) ? std::optional<std::string>(in_venv.string()) : std::nullopt;
}

// In a ninja build (load_inline's: the .cu through kz-nvcc beside main.cpp's host compile), a failed
// compile ends the other step still running instead of letting ninja wait for it: here a step that
// would take two minutes.
TEST_F(ParallelNvccReal, AFailedCompileEndsTheBuildsOtherStep) {
  auto ninja = ninja_path();
  if (!ninja) GTEST_SKIP() << "no ninja (scripts/setup.sh installs it in .venv)";
  write("broken.cu", "__global__ void k(float* x) { x[0] = undefined_name; }\n");
  write("main.cpp", "int main() {}\n");
  write("build.ninja", fmt::format("rule cu\n  command = {} -arch=sm_90 -c $in -o $out\n"
                                   "rule slow\n  command = sh -c 'sleep 120 && cp $in $out'\n"
                                   "build broken.o: cu {}\nbuild main.o: slow {}\n",
                                   KZ_NVCC_TOOL, (dir_ / "broken.cu").string(), (dir_ / "main.cpp").string()));
  auto started = std::chrono::steady_clock::now();
  RunResult result = compile(*ninja, {"-j2"});  // ninja in dir_, with kz-nvcc's environment as above
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(90)) << "ninja waited for the other step";
  EXPECT_NE(result.exit.exit_code, 0);
  EXPECT_NE(result.stdout_text.find("undefined_name"), std::string::npos) << "nvcc's message: " << result.stdout_text;
  EXPECT_NE(result.stdout_text.find("kz-nvcc: this compile failed, so the build's other steps are ended"),
            std::string::npos) << result.stdout_text;
  // The failed compile's output first, then the step it ended (the Coder reads the first failure).
  size_t first_failed = result.stdout_text.find("FAILED: ");
  ASSERT_NE(first_failed, std::string::npos) << result.stdout_text;
  std::string first_line = result.stdout_text.substr(first_failed, result.stdout_text.find('\n', first_failed) - first_failed);
  EXPECT_NE(first_line.find("broken.o"), std::string::npos) << result.stdout_text;
  EXPECT_FALSE(fs::exists(dir_ / "main.o"));
  // The step is killed once ninja has reaped the failed job, which may be just after ninja exits:
  // on a loaded machine the kill lands a moment later, so wait for it (bounded).
  auto sleepers = [] {
    std::string left;
    for (const auto& process : test::live_processes())
      if (process.cmdline.find(std::string("sleep") + '\0' + "120") != std::string::npos) left += process.cmdline + "\n";
    return left;
  };
  std::string left = sleepers();
  for (int i = 0; i < 100 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = sleepers();
  }
  EXPECT_EQ(left, "") << "the step's processes were ended with it";
}

// Stopped mid-compile (Ctrl-C, a deadline's SIGTERM): the steps are killed, the keep dir goes, and
// kz-nvcc ends by that signal.
TEST_F(ParallelNvccReal, ASignalMidCompileLeavesNothingBehind) {
  write("slow.cu", std::string("#include <iostream>\n#include <map>\n#include <regex>\n") + kKernel);
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig);
    ProcessSpec spec;
    spec.argv = {KZ_NVCC_TOOL, "-arch=sm_90", "-c", "slow.cu", "-o", "slow.o"};
    spec.env = current_environment();
    spec.env["KZ_NVCC_SIDE_BY_SIDE"] = "always";
    spec.env["TMPDIR"] = dir_.string();
    spec.cwd = dir_;
    auto compile = Process::spawn(spec);  // a process group of its own: the steps join it
    ASSERT_TRUE(compile.ok()) << compile.status().to_string();
    // Until the steps run: the keep dir holds cudafe++'s input.
    bool running = false;
    for (int i = 0; i < 3000 && !running; ++i) {  // up to 60 s: a loaded machine
      for (const auto& entry : fs::directory_iterator(dir_)) {
        if (entry.path().filename().string().rfind("kz-nvcc-", 0) == 0 && fs::exists(entry.path() / "slow.cpp4.ii")) running = true;
      }
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(running) << "kz-nvcc's steps never started";
    ::kill(compile->pid(), sig);
    auto exit = compile->wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->term_signal, sig) << "ended by the signal (exit code " << exit->exit_code << ")";
    // Every step names the keep dir in its arguments (gcc's cc1plus too): none may still run.
    std::string left;
    for (const auto& process : test::live_processes()) {
      if (process.cmdline.find((dir_ / "kz-nvcc-").string()) != std::string::npos)
        left += std::to_string(process.pid) + ": " + process.cmdline + "\n";
    }
    EXPECT_EQ(left, "") << "a step still runs";
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string().rfind("kz-nvcc-", 0), std::string::npos) << entry.path();
    }
    EXPECT_FALSE(fs::exists(dir_ / "slow.o"));
  }
}

TEST_F(ParallelNvccReal, WhatItDoesNotRunIsNvccsOwn) {
  write("k.cu", kKernel);
  RunResult expected = compile(test::nvcc_path(), {"-E", "k.cu", "-o", "nvcc.ii"});
  RunResult got = compile(KZ_NVCC_TOOL, {"-E", "k.cu", "-o", "kz.ii"});
  ASSERT_EQ(got.exit.exit_code, 0) << got.stderr_text;
  EXPECT_EQ(expected.exit.exit_code, 0);
  EXPECT_EQ(*read_file(dir_ / "kz.ii"), *read_file(dir_ / "nvcc.ii"));
  EXPECT_NE(last_report().find(R"("parallel":false)"), std::string::npos) << last_report();
  RunResult bad = compile(KZ_NVCC_TOOL, {"--no-such-option", "-c", "k.cu", "-o", "k.o"});
  EXPECT_NE(bad.exit.exit_code, 0);
  EXPECT_NE(bad.stderr_text.find("no-such-option"), std::string::npos) << bad.stderr_text;  // nvcc's own message
  side_by_side_ = "never";  // as on a host with no idle core: nvcc itself, the same object
  RunResult serial = compile(KZ_NVCC_TOOL, {"-arch=sm_90", "-c", "k.cu", "-o", "serial.o"});
  EXPECT_EQ(serial.exit.exit_code, 0) << serial.stderr_text;
  EXPECT_TRUE(fs::exists(dir_ / "serial.o"));
  EXPECT_NE(last_report().find(R"("parallel":false)"), std::string::npos) << last_report();
}

}  // namespace
}  // namespace kz::nvcc
