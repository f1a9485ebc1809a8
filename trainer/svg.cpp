#include "trainer/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace hdp {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& title,
               const std::string& stroke) {
  body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
           "\" fill=\"" + escape(fill) + "\"";
  if (!stroke.empty()) body_ += " stroke=\"" + escape(stroke) + "\"";
  if (title.empty()) {
    body_ += "/>\n";
  } else {
    body_ += "><title>" + escape(title) + "</title></rect>\n";
  }
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width) {
  body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) +
           "\" stroke=\"" + escape(stroke) + "\" stroke-width=\"" + num(width) + "\"/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke, double width) {
  if (points.empty()) return;
  body_ += "<polyline fill=\"none\" stroke=\"" + escape(stroke) + "\" stroke-width=\"" + num(width) + "\" points=\"";
  for (const auto& [x, y] : points) body_ += num(x) + "," + num(y) + " ";
  body_ += "\"/>\n";
}

void Svg::text(double x, double y, const std::string& text, double size, const std::string& anchor, double rotate) {
  body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-family=\"sans-serif\" font-size=\"" + num(size) +
           "\" text-anchor=\"" + escape(anchor) + "\"";
  if (rotate != 0) body_ += " transform=\"rotate(" + num(rotate) + " " + num(x) + " " + num(y) + ")\"";
  body_ += ">" + escape(text) + "</text>\n";
}

std::string Svg::str() const {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width_) + "\" height=\"" + num(height_) +
         "\" viewBox=\"0 0 " + num(width_) + " " + num(height_) + "\">\n<rect width=\"100%\" height=\"100%\" " +
         "fill=\"white\"/>\n" + body_ + "</svg>\n";
}

void Svg::save(const std::string& path) const {
  std::ofstream out(path);
  out << str();
  if (!out) throw std::runtime_error(path + ": cannot write the SVG file");
}

std::string heat_colour(double t) {
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0);
  // White (255,255,255) -> yellow (255,210,0) at 0.5 -> red (200,0,0) at 1.
  double r, g, b;
  if (t < 0.5) {
    const double u = t / 0.5;
    r = 255;
    g = 255 - 45 * u;
    b = 255 * (1 - u);
  } else {
    const double u = (t - 0.5) / 0.5;
    r = 255 - 55 * u;
    g = 210 * (1 - u);
    b = 0;
  }
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(r), static_cast<int>(g), static_cast<int>(b));
  return buf;
}

std::string series_colour(int index) {
  static const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return kColours[((index % 8) + 8) % 8];
}

}  // namespace hdp
