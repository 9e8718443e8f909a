// Terminal: table layout and the non-interactive progress bar output.
#include "kz/core/terminal.h"

#include <gtest/gtest.h>

#include <sstream>

namespace kz {
namespace {

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(Table, RightAlignsNumericColumnAndRulesHeader) {
  Table t({"task", "speedup"});
  t.add_row({"03_gelu", "1.02x"});
  t.add_row({"1_matmul", "12.5x"});
  t.add_row({"x", "-4"});
  auto lines = lines_of(t.render());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "task      speedup");
  EXPECT_EQ(lines[1], "--------  -------");
  EXPECT_EQ(lines[2], "03_gelu     1.02x");
  EXPECT_EQ(lines[3], "1_matmul    12.5x");
  EXPECT_EQ(lines[4], "x              -4");
}

TEST(Table, TextLeftAlignedAndMissingCellsEmpty) {
  Table t({"name", "status", "pct"});
  t.add_row({"a", "ok", "87.5%"});
  t.add_row({"bbb"});
  auto lines = lines_of(t.render());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[2], "a     ok      87.5%");
  EXPECT_EQ(lines[3], "bbb");
}

TEST(ProgressBar, PlainLinesOffTerminal) {
  std::ostringstream out;
  {
    ProgressBar bar("eval", 3, out);
    bar.advance("03_gelu ok");
    bar.advance();
    bar.finish();
    bar.finish();
  }
  std::string s = out.str();
  EXPECT_EQ(s.find('\r'), std::string::npos);
  auto lines = lines_of(s);
  ASSERT_EQ(lines.size(), 2u) << s;
  EXPECT_EQ(lines[0].rfind("[eval] 1/3 (33%)", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("03_gelu ok"), std::string::npos);
  EXPECT_NE(lines[0].find("eta"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("[eval] 2/3 (66%)", 0), 0u) << lines[1];
}

TEST(ProgressBar, ShowPrintsANoteWithoutCountingAUnit) {
  std::ostringstream out;
  ProgressBar bar("eval", 2, out);
  bar.show("pre-build 1/3: 05_conv ok");
  bar.advance("03_gelu ok");
  bar.finish();
  bar.show("after the end");
  auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  EXPECT_EQ(lines[0].rfind("[eval] 0/2 (0%)", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("pre-build 1/3: 05_conv ok"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("[eval] 1/2 (50%)", 0), 0u) << lines[1];
}

TEST(Terminal, StringStreamIsNotATerminal) {
  std::ostringstream out;
  EXPECT_FALSE(is_terminal(out));
}

}  // namespace
}  // namespace kz
