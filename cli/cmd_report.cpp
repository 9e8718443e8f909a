// `kz report RUN_DIR`: the HTML page of a `kz evolve` run, written into the run dir beside its logs.
#include <iostream>

#include "commands.h"
#include "kz/loop/report.h"

namespace kz::cli {

Action add_report_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto* report = app.add_subcommand("report", "Write RUN_DIR/report.html: the curves and metrics rows of a kz "
                                              "evolve run (self-contained HTML)");
  report->add_option("run_dir", *run_dir, "The run directory (holds metrics.jsonl)")->required();
  return [run_dir] {
    auto path = loop::write_evolve_report(*run_dir);
    if (!path.ok()) return report_error(path.status());
    std::cout << "report: " << path->string() << "\n";
    return static_cast<int>(kExitOk);
  };
}

}  // namespace kz::cli
