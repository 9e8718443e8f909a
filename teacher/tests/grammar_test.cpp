// The teacher's grammar, sampler and split rule: determinism by seed, the held-out set never drawn
// for training, the API spellings of the catalogue, and coverage of every op, operand and reducer.
#include <gtest/gtest.h>

#include <set>

#include "kz/task/catalogue.h"
#include "kz/teacher/grammar.h"

namespace kz::teacher {
namespace {

std::vector<ModuleSpec> draw(uint64_t seed, Split split, int count) {
  ModuleSampler sampler(seed, split);
  std::vector<ModuleSpec> modules;
  for (int i = 0; i < count; ++i) modules.push_back(sampler.next());
  return modules;
}

std::string describe(const ModuleSpec& m) {
  return expression(m) + " " + std::to_string(m.rows) + "x" + std::to_string(m.cols) + "x" + std::to_string(m.inner);
}

ModuleSpec elementwise(std::vector<Step> chain) {
  ModuleSpec spec;
  spec.kind = Kind::elementwise;
  spec.rows = 32;
  spec.cols = 64;
  spec.chain = std::move(chain);
  return spec;
}

TEST(TeacherGrammar, ExpressionApisAndLevel) {
  ModuleSpec m = elementwise({{Op::add, Operand::row, "row"}, {Op::relu, Operand::none, ""}});
  EXPECT_EQ(expression(m), "relu(add(x, row))");
  EXPECT_EQ(apis(m), (std::vector<std::string>{"torch.add", "torch.relu"}));
  EXPECT_EQ(operand_inputs(m), (std::vector<std::string>{"row"}));
  EXPECT_EQ(level(m), 2);
  EXPECT_EQ(level(elementwise({{Op::exp, Operand::none, ""}})), 1);

  ModuleSpec gemm;
  gemm.kind = Kind::gemm;
  gemm.chain = {{Op::mul, Operand::scalar, "0.5"}, {Op::gelu_tanh, Operand::none, ""}};
  EXPECT_EQ(expression(gemm), "gelu_tanh(mul(linear(x), 0.5))");
  EXPECT_EQ(apis(gemm), (std::vector<std::string>{"torch.nn.Linear", "torch.mul", "torch.nn.functional.gelu"}));

  ModuleSpec reduction;
  reduction.kind = Kind::reduction;
  reduction.reducer = Reducer::max;
  EXPECT_EQ(expression(reduction), "amax(x)");
  EXPECT_EQ(apis(reduction), (std::vector<std::string>{"torch.amax"}));
  EXPECT_EQ(level(reduction), 1);
}

TEST(TeacherGrammar, EveryApiIsSpelledAsTheCatalogueSpellsIt) {
  auto catalogue = load_api_catalogue(default_api_catalogue_path());
  ASSERT_TRUE(catalogue.ok()) << catalogue.status().to_string();
  std::set<std::string> used;
  for (Split split : {Split::train, Split::heldout})
    for (const ModuleSpec& m : draw(3, split, 300))
      for (const std::string& api : apis(m)) used.insert(api);
  auto found = find_apis(*catalogue, std::vector<std::string>(used.begin(), used.end()));
  EXPECT_TRUE(found.ok()) << found.status().to_string();
}

TEST(TeacherGrammar, TheHeldOutRuleNamesItsReason) {
  std::vector<Step> five(5, Step{Op::neg, Operand::none, ""});
  EXPECT_EQ(held_out_reason(elementwise(five)), "chain of 5 steps");
  EXPECT_EQ(held_out_reason(elementwise({{Op::abs, Operand::none, ""}, {Op::tanh, Operand::none, ""}})),
            "reserved pair abs->tanh");
  ModuleSpec gemm;
  gemm.kind = Kind::gemm;
  gemm.chain = {{Op::silu, Operand::none, ""}};
  EXPECT_EQ(held_out_reason(gemm), "reserved pair linear->silu");
  ModuleSpec softmax;
  softmax.kind = Kind::reduction;
  softmax.reducer = Reducer::softmax;
  softmax.chain = {{Op::exp, Operand::none, ""}};
  EXPECT_EQ(held_out_reason(softmax), "reserved pair exp->softmax");
  EXPECT_FALSE(is_held_out(elementwise({{Op::tanh, Operand::none, ""}, {Op::abs, Operand::none, ""}})));
}

TEST(TeacherSampler, TheSameSeedDrawsTheSameModules) {
  auto a = draw(11, Split::train, 60), b = draw(11, Split::train, 60), c = draw(12, Split::train, 60);
  int differences = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(describe(a[i]), describe(b[i])) << "draw " << i;
    differences += describe(a[i]) != describe(c[i]);
  }
  EXPECT_GT(differences, 50) << "another seed should draw other modules";
  auto shorter = draw(11, Split::train, 20);
  for (size_t i = 0; i < shorter.size(); ++i) EXPECT_EQ(describe(shorter[i]), describe(a[i])) << "a prefix";
}

TEST(TeacherSampler, HeldOutModulesAreNeverDrawnForTraining) {
  std::set<std::string> train_expressions;
  for (const ModuleSpec& m : draw(5, Split::train, 600)) {
    EXPECT_FALSE(is_held_out(m)) << expression(m) << ": " << held_out_reason(m);
    EXPECT_LE(m.chain.size(), kMaxTrainChain) << expression(m);
    auto ops = op_sequence(m);
    for (size_t i = 1; i < ops.size(); ++i)
      EXPECT_EQ(reserved_pairs().count(ops[i - 1] + "->" + ops[i]), 0u) << expression(m);
    EXPECT_TRUE(train_expressions.insert(expression(m)).second) << "drawn twice: " << expression(m);
  }
  int long_chains = 0, reserved = 0;
  for (const ModuleSpec& m : draw(5, Split::heldout, 200)) {
    std::string reason = held_out_reason(m);
    ASSERT_FALSE(reason.empty()) << expression(m);
    EXPECT_EQ(train_expressions.count(expression(m)), 0u) << expression(m);
    long_chains += reason.rfind("chain", 0) == 0;
    reserved += reason.rfind("reserved", 0) == 0;
  }
  EXPECT_GT(long_chains, 0);
  EXPECT_GT(reserved, 0);
}

TEST(TeacherSampler, CoversEveryOpOperandReducerAndKind) {
  std::set<std::string> ops;
  std::set<Operand> operands;
  std::set<Reducer> reducers;
  std::set<Kind> kinds;
  for (const ModuleSpec& m : draw(9, Split::train, 400)) {
    kinds.insert(m.kind);
    if (m.kind == Kind::reduction) reducers.insert(m.reducer);
    for (const Step& step : m.chain) {
      ops.insert(op_name(step.op));
      operands.insert(step.operand);
    }
    EXPECT_GT(m.rows, 0);
    EXPECT_GT(m.cols, 0);
    EXPECT_EQ(m.inner > 0, m.kind == Kind::gemm) << expression(m);
  }
  EXPECT_EQ(ops.size(), 14u);
  EXPECT_EQ(operands.size(), 5u);  // none, full, row, col, scalar
  EXPECT_EQ(reducers.size(), 6u);
  EXPECT_EQ(kinds.size(), 3u);
}

TEST(TeacherSampler, OperandsAreNamedByTheirBroadcasting) {
  for (const ModuleSpec& m : draw(4, Split::heldout, 100)) {
    std::set<std::string> names;
    for (const Step& step : m.chain) {
      if (step.operand == Operand::none) {
        EXPECT_TRUE(step.value.empty());
        continue;
      }
      if (step.operand == Operand::scalar) {
        EXPECT_NE(step.value.find('.'), std::string::npos) << "a float literal: " << step.value;
        EXPECT_TRUE(step.op == Op::add || step.op == Op::sub || step.op == Op::mul) << expression(m);
        continue;
      }
      const char* prefix = step.operand == Operand::full ? "y" : step.operand == Operand::row ? "row" : "col";
      EXPECT_EQ(step.value.rfind(prefix, 0), 0u) << expression(m);
      EXPECT_TRUE(names.insert(step.value).second) << "each operand is its own input: " << expression(m);
    }
  }
}

}  // namespace
}  // namespace kz::teacher
