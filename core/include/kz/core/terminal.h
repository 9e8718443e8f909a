// What people read in the terminal: a progress bar for long work and aligned tables.
#pragma once

#include <chrono>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace kz {

// A one-line progress bar on stderr: "[#######.......] 12/20  60%  eta 0:41  03_gelu ok".
// On a terminal it redraws in place; otherwise (CI logs) it prints a plain line per step, so
// logs stay readable.
class ProgressBar {
 public:
  ProgressBar(std::string label, size_t total, std::ostream& out);
  void advance(std::string_view note = {});  // one unit done
  void show(std::string_view note);          // news without a unit done (work beside the counted one)
  void finish();                             // final newline; idempotent
  ~ProgressBar();

 private:
  void draw(std::string_view note);
  std::string label_;
  size_t total_;
  size_t done_ = 0;
  std::ostream& out_;
  bool interactive_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

// A plain-text table with a header rule; numeric-looking cells are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);  // missing cells print empty
  std::string render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// Whether the stream is attached to a terminal (std::cerr / std::cout only).
bool is_terminal(const std::ostream& out);

}  // namespace kz
