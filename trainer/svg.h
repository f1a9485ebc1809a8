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

// "#rrggbb" for t in [0, 1] on a white -> yellow -> red scale (0 = white).
std::string heat_colour(double t);
// One of eight distinct line colours.
std::string series_colour(int index);

}  // namespace hdp
