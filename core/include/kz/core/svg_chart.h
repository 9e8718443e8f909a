// The pieces of the HTML reports' inline SVG charts (kz bench's pass@k, kz report's curves and
// bars): a plot area that maps x and y ranges onto pixels, grid lines with their labels, polylines
// with a dot per point, and a legend in the right margin.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kz {

// A chart's size, its plot area's margins (the right one holds the legend) and the ranges the plot
// shows.
struct ChartFrame {
  int width = 0, height = 0, left = 0, right = 0, top = 0, bottom = 0;
  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;

  // Pixels of an x value (mid-plot where the range is a single value) and of a y value.
  double x(double value) const;
  double y(double value) const;
};

struct ChartPoint {
  double x = 0, y = 0;
  std::string title;  // shown on hover over the point's dot
};

// The opening <svg> tag; the caller closes it.
std::string chart_open_svg(const ChartFrame& frame);

// Five horizontal grid lines from y_lo to y_hi, each labelled y_label(value) on the left; the x
// ticks' labels under the plot (at their x values), and the x axis's title below them.
std::string chart_axes_svg(const ChartFrame& frame, const std::function<std::string(double)>& y_label,
                           const std::vector<std::pair<double, std::string>>& x_ticks, const std::string& x_title);

// A polyline through `points` in `color`, each point a dot with its title; a lone point shows as
// its dot.
std::string chart_series_svg(const ChartFrame& frame, const std::vector<ChartPoint>& points, const std::string& color);

// The legend's entry number `index` (from 0, top down) in the right margin.
std::string chart_legend_svg(const ChartFrame& frame, int index, const std::string& label, const std::string& color);

}  // namespace kz
