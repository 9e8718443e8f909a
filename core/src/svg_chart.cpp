// The reports' SVG chart pieces (svg_chart.h).
#include "kz/core/svg_chart.h"

#include <fmt/format.h>

#include "kz/core/text.h"

namespace kz {

double ChartFrame::x(double value) const {
  double span = x_hi - x_lo;
  return left + (span == 0 ? 0.5 : (value - x_lo) / span) * (width - left - right);
}

double ChartFrame::y(double value) const { return top + (y_hi - value) / (y_hi - y_lo) * (height - top - bottom); }

std::string chart_open_svg(const ChartFrame& frame) {
  // Inline in an HTML page, which needs no xmlns: the pages name no URL, nothing to fetch.
  return fmt::format(R"(<svg width="{}" height="{}" font-size="12">)", frame.width, frame.height);
}

std::string chart_axes_svg(const ChartFrame& frame, const std::function<std::string(double)>& y_label,
                           const std::vector<std::pair<double, std::string>>& x_ticks, const std::string& x_title) {
  std::string svg;
  for (int k = 0; k <= 4; ++k) {
    double value = frame.y_lo + k * (frame.y_hi - frame.y_lo) / 4;
    svg += fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/>)", frame.left,
                       frame.width - frame.right, frame.y(value), frame.y(value));
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">{}</text>)", frame.left - 6, frame.y(value) + 4,
                       y_label(value));
  }
  for (const auto& [at, label] : x_ticks)
    svg += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)", frame.x(at),
                       frame.height - frame.bottom + 16, label);
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", (frame.left + frame.width - frame.right) / 2,
                     frame.height - 6, x_title);
  return svg;
}

std::string chart_series_svg(const ChartFrame& frame, const std::vector<ChartPoint>& points, const std::string& color) {
  std::string line, dots;
  for (const auto& p : points) {
    line += fmt::format("{:.1f},{:.1f} ", frame.x(p.x), frame.y(p.y));
    dots += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>{}</title></circle>)", frame.x(p.x),
                        frame.y(p.y), color, html_escape(p.title));
  }
  return fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)", line, color) + dots;
}

std::string chart_legend_svg(const ChartFrame& frame, int index, const std::string& label, const std::string& color) {
  return fmt::format(R"(<text x="{}" y="{}" fill="{}">{}</text>)", frame.width - frame.right + 10,
                     frame.top + 16 * index + 10, color, html_escape(label));
}

}  // namespace kz
