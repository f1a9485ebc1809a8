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

AxisTicks nice_ticks(double lo, double hi, int at_most) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, at_most - 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  AxisTicks t;
  t.step = 10 * power;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power * (at_most - 1) >= (hi - lo) * (1 - 1e-9)) {
      t.step = m * power;
      break;
    }
  }
  // The widened ends, and ticks counted from them (no drift from adding the step).
  const int64_t first = static_cast<int64_t>(std::floor(lo / t.step + 1e-9));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / t.step - 1e-9));
  t.lo = static_cast<double>(first) * t.step;
  t.hi = static_cast<double>(last) * t.step;
  for (int64_t k = first; k <= last; ++k) t.values.push_back(static_cast<double>(k) * t.step);
  return t;
}

std::string tick_label(double value, double step) {
  char buf[32];
  if (std::abs(value) < step * 1e-6) return "0";  // -0 and rounding noise too
  const int step_exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const double magnitude = std::abs(value);
  if (step >= 1e3) {  // the step, not the value, picks the suffix: one per axis
    static const char* const kSuffixes[] = {"k", "M", "G", "T", "P"};
    const int n = std::min(5, (step_exponent + 1) / 3);
    const int decimals = std::max(0, 3 * n - step_exponent);
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals, value / std::pow(1000.0, n), kSuffixes[n - 1]);
  } else if (step < 1e-3) {
    const int digits = std::max(0, static_cast<int>(std::floor(std::log10(magnitude) + 1e-9)) - step_exponent);
    std::snprintf(buf, sizeof buf, "%.*e", digits, value);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", std::max(0, -step_exponent), value);
  }
  return buf;
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
