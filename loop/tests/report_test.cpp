// The `kz report` page: curves, stacked seconds and the row table from metrics.jsonl rows; escaping;
// gaps where a field is null; the file written into the run dir and its errors.
#include "kz/loop/report.h"

#include <gtest/gtest.h>

#include "kz/core/files.h"

namespace kz::loop {
namespace {

using nlohmann::json;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

json coder_row(int iteration, json kl) {
  return {{"iteration", iteration}, {"phase", "coder"},  {"reward_mean", 0.1 * iteration},
          {"correct_rate", 0.5},    {"kl", kl},          {"entropy", 1.2},
          {"clip_fraction", 0.02},  {"gate_on_share", 0.3}, {"frontier_size", 10 + iteration},
          {"seconds", {{"generate", 5.0}, {"evaluate", 3.0}, {"train", 2.0}}}};
}

json proposer_row(int iteration) {
  return {{"iteration", iteration}, {"phase", "proposer"}, {"reward_mean", 0.2}, {"kl", 0.01},
          {"seconds", {{"generate", 1.0}, {"evaluate", 1.0}, {"train", nullptr}}}};
}

json heldout_row(int iteration) {
  return {{"iteration", iteration}, {"phase", "heldout"}, {"pass_at_1", 0.4}, {"fast_1", nullptr},
          {"geomean_speedup", nullptr}, {"seconds", {{"generate", 4.0}, {"evaluate", 6.0}}}};
}

std::vector<json> three_iterations() {
  std::vector<json> rows;
  for (int i = 1; i <= 3; ++i) {
    rows.push_back(proposer_row(i));
    rows.push_back(coder_row(i, 0.05));
    rows.push_back(heldout_row(i));
  }
  return rows;
}

std::string rows_table(const std::string& page) {
  auto at = page.find(R"(<table class="rows">)");
  return at == std::string::npos ? "" : page.substr(at);
}

TEST(EvolveReport, RowsGiveCurvesBarsAndTheTable) {
  // run.json's count of iterations done wins over the rows' (a phase may not have logged yet).
  json info = {{"proposer", "prop-7b"}, {"coder", "coder-7b"}, {"iterations", 4}, {"config", {{"lr", 1e-6}}}};
  std::string page = render_evolve_report(info, three_iterations());
  // reward_mean x2, correct_rate, pass_at_1, gate_on_share, frontier_size, kl x2, entropy, clip_fraction
  // (fast_1 is null throughout: no curve).
  EXPECT_EQ(count(page, "<polyline"), 10u);
  for (const char* label : {"coder reward_mean", "proposer reward_mean", "coder correct_rate", "heldout pass_at_1",
                            "coder gate_on_share", "coder frontier_size", "coder kl", "proposer kl"})
    EXPECT_NE(page.find(label), std::string::npos) << label;
  EXPECT_EQ(page.find("heldout fast_1"), std::string::npos);
  // Stacked seconds: coder three stages, proposer two, heldout two, summed per iteration.
  EXPECT_EQ(count(page, "<rect"), 9u);
  EXPECT_NE(page.find("iteration 1 generate: 10.0 s"), std::string::npos);
  EXPECT_NE(page.find("iteration 1 evaluate: 10.0 s"), std::string::npos);
  // A header row and one per metrics row.
  EXPECT_EQ(count(rows_table(page), "<tr>"), 10u);
  EXPECT_NE(rows_table(page).find("<th>seconds/generate</th>"), std::string::npos);
  EXPECT_NE(page.find("<b>4</b> iterations done"), std::string::npos);
  EXPECT_NE(page.find("coder <b>coder-7b</b>"), std::string::npos);
  EXPECT_NE(page.find("<th style=\"text-align:left\">lr</th><td>1e-06</td>"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http"), std::string::npos);  // self-contained: nothing to fetch
}

TEST(EvolveReport, NamesAndFieldsAreEscaped) {
  json info = {{"coder", "<script>alert(1)</script>"}, {"proposer", "a&b \"q\""}};
  json row = {{"iteration", 1}, {"phase", "<img src=x>"}, {"reward_mean", 1.0}};
  std::string page = render_evolve_report(info, {row});
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("<img"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(page.find("a&amp;b &quot;q&quot;"), std::string::npos);
  EXPECT_NE(page.find("&lt;img src=x&gt; reward_mean"), std::string::npos);
}

TEST(EvolveReport, NullAndAbsentFieldsSkipPoints) {
  std::vector<json> rows = {coder_row(1, 0.05), coder_row(2, nullptr), coder_row(3, 0.07)};
  rows[1].erase("entropy");
  rows.push_back({{"phase", "coder"}, {"kl", 9.0}});  // no iteration: in the table, on no curve
  std::string page = render_evolve_report(json::object(), rows);
  EXPECT_NE(page.find("coder kl, iteration 1:"), std::string::npos);
  EXPECT_EQ(page.find("coder kl, iteration 2:"), std::string::npos);
  EXPECT_NE(page.find("coder kl, iteration 3:"), std::string::npos);
  EXPECT_EQ(page.find("coder entropy, iteration 2:"), std::string::npos);
  EXPECT_EQ(page.find("coder kl, iteration 9"), std::string::npos);
  EXPECT_EQ(count(rows_table(page), "<tr>"), 5u);
}

TEST(EvolveReport, AChartWithNothingLoggedSaysSo) {
  json row = {{"iteration", 1}, {"phase", "heldout"}, {"pass_at_1", nullptr}, {"fast_1", nullptr}};
  std::string page = render_evolve_report(json::object(), {row});
  EXPECT_NE(page.find("No correct_rate, pass_at_1, fast_1 logged yet"), std::string::npos);
  EXPECT_NE(page.find("No seconds logged yet"), std::string::npos);
  EXPECT_EQ(page.find("<polyline"), std::string::npos);
}

TEST(EvolveReport, ASingleRowRenders) {
  std::string page = render_evolve_report(json(), {coder_row(0, 0.05)});
  EXPECT_NE(page.find("coder reward_mean, iteration 0:"), std::string::npos);
  EXPECT_NE(page.find("<b>1</b> iterations done"), std::string::npos);
  EXPECT_EQ(count(rows_table(page), "<tr>"), 2u);
}

TEST(EvolveReport, NoRowsSaysNoIterationsYet) {
  std::string page = render_evolve_report(json{{"coder", "c"}}, {});
  EXPECT_NE(page.find("No iterations yet"), std::string::npos);
  EXPECT_NE(page.find("<b>0</b> iterations done"), std::string::npos);
  EXPECT_EQ(page.find("<svg"), std::string::npos);
  EXPECT_EQ(page.find("</html>"), page.size() - 8);
}

class EvolveReportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_evolve_report_test_");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    ASSERT_TRUE(write_file_atomic(dir_ / name, text).is_ok());
  }
  fs::path dir_;
};

TEST_F(EvolveReportFileTest, WritesReportHtmlIntoTheRunDir) {
  write("metrics.jsonl", coder_row(1, 0.05).dump() + "\n" + proposer_row(1).dump() + "\n");
  write("run.json", R"({"coder": "coder-from-run-json", "iterations": 1})");
  auto path = write_evolve_report(dir_);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  EXPECT_EQ(*path, dir_ / "report.html");
  auto page = read_file(*path);
  ASSERT_TRUE(page.ok()) << page.status().to_string();
  EXPECT_NE(page->find("coder-from-run-json"), std::string::npos);
  EXPECT_NE(page->find("proposer reward_mean"), std::string::npos);
}

TEST_F(EvolveReportFileTest, RunJsonIsOptional) {
  write("metrics.jsonl", "");
  auto path = write_evolve_report(dir_);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  EXPECT_TRUE(fs::exists(dir_ / "report.html"));
}

TEST_F(EvolveReportFileTest, MissingMetricsIsNotFoundNamingThePath) {
  auto path = write_evolve_report(dir_);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::not_found);
  EXPECT_NE(path.status().message().find((dir_ / "metrics.jsonl").string()), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "report.html"));
}

TEST_F(EvolveReportFileTest, CorruptRunJsonIsAnErrorNamingIt) {
  write("metrics.jsonl", coder_row(1, 0.05).dump() + "\n");
  write("run.json", R"({"coder": )");
  auto path = write_evolve_report(dir_);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::parse_error);
  EXPECT_NE(path.status().message().find((dir_ / "run.json").string()), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "report.html"));
}

}  // namespace
}  // namespace kz::loop
