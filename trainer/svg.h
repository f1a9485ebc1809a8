#pragma once
// A small SVG writer for the trainer's charts (the straggler heatmap of
// `trainer analyze`, the curves of `trainer plot`): shapes and text in user
// units, escaped, written as one standalone document.

#include <string>
#include <utility>
#include <vector>

namespace hdp {

class Svg {
 public:
  Svg(double width, double height);
  // `title` (may be empty) becomes a tooltip.
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& title = {},
            const std::string& stroke = {});
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1);
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke, double width = 1.5);
  // anchor: "start", "middle" or "end".
  void text(double x, double y, const std::string& text, double size = 12, const std::string& anchor = "start",
            double rotate = 0);
  std::string str() const;
  void save(const std::string& path) const;  // throws std::runtime_error when it cannot write

 private:
  double width_, height_;
  std::string body_;
};

// An axis's ticks at a round step, 1, 2 or 5 times a power of ten, at most
// `at_most` of them over [lo, hi]; `lo` and `hi` are the range widened to the
// ticks around it (a chart's y range; an x range of steps keeps its ends).
struct AxisTicks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
AxisTicks nice_ticks(double lo, double hi, int at_most = 6);
// A tick's label, with the digits the step needs and no more: "0.25"; "1.5e-04"
// for a step below 0.001; "20k", "1.5M" for a step of 1,000 or more; zero is "0".
std::string tick_label(double value, double step);

// "#rrggbb" for t in [0, 1] on a white -> yellow -> red scale (0 = white).
std::string heat_colour(double t);
// One of eight distinct line colours.
std::string series_colour(int index);

}  // namespace hdp
