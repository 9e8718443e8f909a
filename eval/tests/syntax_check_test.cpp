// SyntaxChecker: the real interpreter's answers (worker/kz_worker/syntax_check.py), and what happens
// when the checker fails (a stand-in interpreter that exits, hangs or cannot start): no finding,
// so the worker decides, a fresh checker after a failure, and none after kMaxFailures in a row.
#include "kz/eval/syntax_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "kz/core/files.h"
#include "kz/eval/worker_client.h"

namespace kz {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

SyntaxChecker real_checker() {
  auto setup = resolve_worker_setup(WorkerOptions{}, TuningOptions{}, "cpu");
  if (!setup.ok()) throw std::runtime_error(setup.status().to_string());
  return SyntaxChecker(setup->python, setup->worker_dir, setup->bytecode_prefix);
}

TEST(SyntaxChecker, RefusesWhatPythonRefusesWithTheWorkersMessage) {
  SyntaxChecker checker = real_checker();
  EXPECT_EQ(checker.error("import torch\nclass ModelNew:\n    pass\n"), std::nullopt);
  EXPECT_TRUE(checker.running());
  auto error = checker.error("import torch\n\ndef forward(x:\n    return x\n");
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("(candidate.py, line 3)"), std::string::npos) << *error;
  auto module = checker.error("def f(:\n", "module.py");
  ASSERT_TRUE(module.has_value());
  EXPECT_NE(module->find("(module.py, line 1)"), std::string::npos) << *module;
  auto indentation = checker.error("def f():\nreturn 1\n");
  ASSERT_TRUE(indentation.has_value());
  EXPECT_NE(indentation->find("expected an indented block"), std::string::npos) << *indentation;
  // Non-ASCII text and invalid UTF-8 (replaced, as in the worker's request) inside a string.
  EXPECT_EQ(checker.error("s = 'd\xc3\xa9j\xc3\xa0 \xff vu'\n"), std::nullopt);
  // Nothing of the source runs: a valid module whose top level would end the checker.
  EXPECT_EQ(checker.error("import os\nos._exit(3)\n"), std::nullopt);
  EXPECT_TRUE(checker.error("x = (\n").has_value()) << "the same checker, still serving";
}

TEST(SyntaxChecker, NoVerdictWhereCompilingRaisesSomethingElse) {
  SyntaxChecker checker = real_checker();
  // A NUL byte: a ValueError in Python 3.11 (a SyntaxError from 3.12), which the worker classifies.
  auto nul = checker.error(std::string("x = 1\n\0\n", 8));
  if (nul.has_value()) {
    EXPECT_NE(nul->find("null bytes"), std::string::npos) << *nul;
  }
  EXPECT_TRUE(checker.running()) << "an exception other than SyntaxError is an answer, not a failure";
  EXPECT_TRUE(checker.error("def (:\n").has_value());
}

class StandInInterpreter : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-syntax-check-");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  // A "python" that runs `body` (bash) whatever its arguments.
  std::string interpreter(const std::string& body) {
    fs::path path = dir_ / "python";
    EXPECT_TRUE(write_file_atomic(path, "#!/bin/bash\n" + body + "\n").is_ok());
    fs::permissions(path, fs::perms::owner_all);
    return path.string();
  }
  fs::path dir_;
};

// Answers one check, then exits: the next check finds it gone (no finding), the one after starts a
// fresh interpreter and gets its answer.
TEST_F(StandInInterpreter, AFreshCheckerAfterOneDied) {
  SyntaxChecker checker(interpreter(R"(read -r line; echo '{"error": "stand-in"}' >&3)"),
                        dir_, {}, 10s);  // answered at once; room for a loaded machine
  EXPECT_EQ(checker.error("x = ("), "stand-in");
  EXPECT_EQ(checker.error("x = ("), std::nullopt);
  EXPECT_FALSE(checker.running());
  EXPECT_EQ(checker.error("x = ("), "stand-in") << "one failure is not enough to stop";
}

TEST_F(StandInInterpreter, AHangingCheckerIsKilledAndStaysOffAfterRepeatedFailures) {
  SyntaxChecker checker(interpreter("sleep 30"), dir_, {}, 200ms);
  constexpr int kCalls = SyntaxChecker::kMaxFailures + 50;
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(checker.error("x = ("), std::nullopt);
  EXPECT_FALSE(checker.running());
  // kMaxFailures waits of 200 ms (~0.7 s with the starts), then none: the checker is off. Without
  // the cut-off every call would wait, 10.6 s in all: the bound is that, not a guess at a machine.
  EXPECT_LT(std::chrono::steady_clock::now() - started, kCalls * 200ms);
}

TEST_F(StandInInterpreter, AnUnreadableAnswerIsAFailureNotAVerdict) {
  SyntaxChecker checker(interpreter(R"(while read -r line; do echo 'not json' >&3; done)"), dir_, {}, 2s);
  EXPECT_EQ(checker.error("x = ("), std::nullopt);
  EXPECT_FALSE(checker.running());
}

TEST(SyntaxChecker, OneSharedCheckerPerInterpreterAndWorkerCode) {
  auto setup = [](const char* python, const char* worker_dir) {
    WorkerSetup s;
    s.python = python;
    s.worker_dir = worker_dir;
    return s;
  };
  auto first = SyntaxChecker::shared(setup("/a/python3", "/a/worker"));
  EXPECT_EQ(SyntaxChecker::shared(setup("/a/python3", "/a/worker")), first);
  EXPECT_NE(SyntaxChecker::shared(setup("/b/python3", "/a/worker")), first);
  EXPECT_NE(SyntaxChecker::shared(setup("/a/python3", "/b/worker")), first);
}

TEST(SyntaxChecker, AMissingInterpreterIsNoFinding) {
  SyntaxChecker checker("/nonexistent/python3", "/nonexistent", {}, 2s);
  for (int i = 0; i < SyntaxChecker::kMaxFailures + 1; ++i) EXPECT_EQ(checker.error("x = ("), std::nullopt);
  EXPECT_FALSE(checker.running());
}

TEST(SyntaxChecker, VerdictSaysWhereItWasCaught) {
  Verdict v = syntax_error_verdict("invalid syntax (candidate.py, line 1)");
  EXPECT_EQ(v.message, "candidate is not valid Python: invalid syntax (candidate.py, line 1)");
  EXPECT_EQ(v.status, EvalStatus::compile_error);
  EXPECT_EQ(v.checks, std::vector<Check>{Check::python_syntax});
  EXPECT_EQ(v.stage, "syntax_check");
  EXPECT_FALSE(v.correct);
}

}  // namespace
}  // namespace kz
