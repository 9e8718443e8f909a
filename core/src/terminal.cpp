// Terminal output: a progress bar that redraws in place on a tty and logs plain lines
// elsewhere, and a plain-text table renderer with right-aligned numeric columns.
#include "kz/core/terminal.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <regex>

#include <fmt/format.h>

namespace kz {
namespace {

// "m:ss", or "h:mm:ss" past an hour.
std::string format_duration(double seconds) {
  long s = std::max(0L, static_cast<long>(seconds + 0.5));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// Display width in code points, so UTF-8 cells (e.g. "µs") don't throw columns off.
size_t display_width(std::string_view s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

bool looks_numeric(const std::string& cell) {
  // Numbers with an optional sign, exponent and a trailing unit-ish suffix: "1.23", "-4",
  // "87.5%", "1.02x", "3e-5".
  static const std::regex re(R"(^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?[%x]?$)");
  return std::regex_match(cell, re);
}

}  // namespace

bool is_terminal(const std::ostream& out) {
  if (&out == &std::cerr || &out == &std::clog) return ::isatty(2) == 1;
  if (&out == &std::cout) return ::isatty(1) == 1;
  return false;
}

ProgressBar::ProgressBar(std::string label, size_t total, std::ostream& out)
    : label_(std::move(label)),
      total_(total),
      out_(out),
      interactive_(is_terminal(out)),
      start_(std::chrono::steady_clock::now()) {
  if (interactive_) draw({});  // show 0/N right away so a long first step isn't silent
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(std::string_view note) {
  if (finished_) return;
  ++done_;
  draw(note);
}

void ProgressBar::show(std::string_view note) {
  if (!finished_) draw(note);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  // Only the in-place bar leaves the cursor mid-line; plain mode already ended each line.
  if (interactive_) out_ << '\n' << std::flush;
}

void ProgressBar::draw(std::string_view note) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double frac = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done_) / total_);
  std::string eta = "?";
  if (done_ >= total_) eta = "0:00";
  else if (done_ > 0) eta = format_duration(elapsed / done_ * (total_ - done_));
  int pct = static_cast<int>(frac * 100.0);
  std::string times = fmt::format("elapsed {} eta {}", format_duration(elapsed), eta);
  if (interactive_) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    // "\x1b[K" clears leftovers of a longer previous note.
    out_ << fmt::format("\r{} [{}] {}/{} {:3}%  {}  {}\x1b[K", label_, bar, done_, total_, pct,
                        times, note)
         << std::flush;
  } else {
    std::string line = fmt::format("[{}] {}/{} ({}%) {}", label_, done_, total_, pct, times);
    if (!note.empty()) line += fmt::format(" {}", note);
    out_ << line << '\n' << std::flush;
  }
}

Table::Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

void Table::add_row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

std::string Table::render() const {
  size_t ncols = headers_.size();
  for (const auto& row : rows_) ncols = std::max(ncols, row.size());
  auto cell = [](const std::vector<std::string>& row, size_t c) -> const std::string& {
    static const std::string empty;
    return c < row.size() ? row[c] : empty;
  };
  std::vector<size_t> width(ncols, 0);
  std::vector<bool> numeric_col(ncols, true);  // header follows its column's alignment
  for (size_t c = 0; c < ncols; ++c) {
    width[c] = display_width(cell(headers_, c));
    bool any = false;
    for (const auto& row : rows_) {
      const std::string& v = cell(row, c);
      width[c] = std::max(width[c], display_width(v));
      if (v.empty()) continue;
      any = true;
      if (!looks_numeric(v)) numeric_col[c] = false;
    }
    numeric_col[c] = numeric_col[c] && any;
  }
  auto render_line = [&](const std::vector<std::string>& row, bool header) {
    std::string line;
    for (size_t c = 0; c < ncols; ++c) {
      const std::string& v = cell(row, c);
      bool right = header ? numeric_col[c] : looks_numeric(v);
      std::string pad(width[c] - display_width(v), ' ');
      if (c > 0) line += "  ";
      line += right ? pad + v : v + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);  // no trailing blanks (npos+1 == 0 clears all)
    return line + '\n';
  };
  std::string out = render_line(headers_, true);
  std::string rule;
  for (size_t c = 0; c < ncols; ++c) rule += (c > 0 ? "  " : "") + std::string(width[c], '-');
  out += rule + '\n';
  for (const auto& row : rows_) out += render_line(row, false);
  return out;
}

}  // namespace kz
