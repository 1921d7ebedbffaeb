// Chart geometry, SVG and braille output (plot.h); the PNG raster is in plot_png.cc.
#include "launcher/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ember::plot {
namespace {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;  // no control chars
    }
  }
  return out;
}

bool Finite(double v) { return std::isfinite(v); }

// Plot area inside a width x height canvas.
struct Frame {
  double left, top, right, bottom;
  Range r;
  double X(double x) const { return left + (x - r.x0) / (r.x1 - r.x0) * (right - left); }
  double Y(double y) const { return bottom - (y - r.y0) / (r.y1 - r.y0) * (bottom - top); }
};

}  // namespace

const char* LineColor(size_t i) {
  static const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return kPalette[i % (sizeof kPalette / sizeof *kPalette)];
}

Range Bounds(const Chart& c) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Line& l : c.lines) {
    for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i) {
      if (!Finite(l.x[i]) || !Finite(l.y[i])) continue;
      x0 = std::min(x0, l.x[i]);
      x1 = std::max(x1, l.x[i]);
      double lo = i < l.lo.size() && Finite(l.lo[i]) ? std::min(l.lo[i], l.y[i]) : l.y[i];
      double hi = i < l.hi.size() && Finite(l.hi[i]) ? std::max(l.hi[i], l.y[i]) : l.y[i];
      y0 = std::min(y0, lo);
      y1 = std::max(y1, hi);
    }
  }
  Range r;
  if (x0 > x1) return r;  // nothing to draw
  if (x0 == x1) { x0 -= 1; x1 += 1; }
  if (y0 == y1) {
    const double d = y0 == 0 ? 1 : std::fabs(y0) * 0.1;
    y0 -= d;
    y1 += d;
  }
  const double m = (y1 - y0) * 0.05;
  r.x0 = x0;
  r.x1 = x1;
  r.y0 = y0 - m;
  r.y1 = y1 + m;
  return r;
}

std::vector<double> NiceTicks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(hi > lo) || target < 1) return out;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

std::string TickLabel(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return absl::StrFormat("%gG", v / 1e9);
  if (a >= 1e6) return absl::StrFormat("%gM", v / 1e6);
  if (a >= 1e4) return absl::StrFormat("%gk", v / 1e3);
  return absl::StrFormat("%.4g", v);
}

std::string RenderSvg(const Chart& c, int width, int height) {
  Frame f{70, c.title.empty() ? 20.0 : 40.0, width - 20.0, height - 50.0, Bounds(c)};
  std::string s = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
      width, height, width, height, width, height);
  if (!c.title.empty()) {
    absl::StrAppendFormat(&s, "<text class=\"title\" x=\"%d\" y=\"24\" text-anchor=\"middle\" "
                          "font-size=\"16\">%s</text>\n", width / 2, XmlEscape(c.title));
  }
  s += "<g class=\"grid\" stroke=\"#e0e0e0\">\n";
  const auto xt = NiceTicks(f.r.x0, f.r.x1, 8), yt = NiceTicks(f.r.y0, f.r.y1, 6);
  for (double v : xt) {
    absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f.X(v),
                          f.top, f.X(v), f.bottom);
  }
  for (double v : yt) {
    absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f.left,
                          f.Y(v), f.right, f.Y(v));
  }
  s += "</g>\n<g class=\"axes\" stroke=\"#333333\">\n";
  absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f.left,
                        f.bottom, f.right, f.bottom);
  absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f.left,
                        f.top, f.left, f.bottom);
  s += "</g>\n<g class=\"ticks\" fill=\"#333333\">\n";
  for (double v : xt) {
    absl::StrAppendFormat(&s, "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"middle\">%s</text>\n", f.X(v), f.bottom + 16,
                          XmlEscape(TickLabel(v)));
  }
  for (double v : yt) {
    absl::StrAppendFormat(&s, "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"end\">%s</text>\n", f.left - 6, f.Y(v) + 4,
                          XmlEscape(TickLabel(v)));
  }
  absl::StrAppendFormat(&s, "<text class=\"xlabel\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">"
                        "%s</text>\n", (f.left + f.right) / 2, height - 12, XmlEscape(c.x_label));
  absl::StrAppendFormat(&s, "<text class=\"ylabel\" transform=\"translate(16 %.1f) rotate(-90)\" "
                        "text-anchor=\"middle\">%s</text>\n</g>\n", (f.top + f.bottom) / 2,
                        XmlEscape(c.y_label));
  for (size_t li = 0; li < c.lines.size(); ++li) {
    const Line& l = c.lines[li];
    const size_t n = std::min(l.x.size(), l.y.size());
    const bool band = l.lo.size() == n && l.hi.size() == n && n > 0;
    if (band) {  // min..max of each bucket: the upper edge forward, the lower edge back
      std::string pts;
      for (size_t i = 0; i < n; ++i) {
        if (Finite(l.x[i]) && Finite(l.hi[i]))
          absl::StrAppendFormat(&pts, "%.2f,%.2f ", f.X(l.x[i]), f.Y(l.hi[i]));
      }
      for (size_t i = n; i-- > 0;) {
        if (Finite(l.x[i]) && Finite(l.lo[i]))
          absl::StrAppendFormat(&pts, "%.2f,%.2f ", f.X(l.x[i]), f.Y(l.lo[i]));
      }
      absl::StrAppendFormat(&s, "<polygon class=\"band\" fill=\"%s\" fill-opacity=\"0.2\" "
                            "stroke=\"none\" points=\"%s\"/>\n", LineColor(li), pts);
    }
    std::string pts, data;
    for (size_t i = 0; i < n; ++i) {
      if (!Finite(l.x[i]) || !Finite(l.y[i])) continue;
      absl::StrAppendFormat(&pts, "%.2f,%.2f ", f.X(l.x[i]), f.Y(l.y[i]));
      absl::StrAppendFormat(&data, "%s%.17g:%.17g", data.empty() ? "" : " ", l.x[i], l.y[i]);
    }
    // data-points: the exact values (x:y), for tools and tests; `points` are pixels.
    absl::StrAppendFormat(&s, "<polyline class=\"curve\" data-label=\"%s\" data-points=\"%s\" "
                          "fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n",
                          XmlEscape(l.label), data, LineColor(li), pts);
  }
  if (c.lines.size() > 1 || (!c.lines.empty() && !c.lines[0].label.empty())) {
    for (size_t li = 0; li < c.lines.size(); ++li) {
      const double y = f.top + 8 + 16 * li;
      absl::StrAppendFormat(&s, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                            "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%.1f\" "
                            "y=\"%.1f\">%s</text></g>\n", f.right - 110, y, f.right - 90, y,
                            LineColor(li), f.right - 85, y + 4, XmlEscape(c.lines[li].label));
    }
  }
  s += "</svg>\n";
  return s;
}

std::string RenderBraille(const Chart& c, int cols, int rows, bool color) {
  cols = std::max(cols, 20);
  rows = std::max(rows, 4);
  const Range r = Bounds(c);
  constexpr int kLabel = 10;  // y tick labels
  const int w = cols - kLabel - 1, dots_x = w * 2, dots_y = rows * 4;
  std::vector<uint8_t> cell(w * rows, 0);
  std::vector<int> owner(w * rows, -1);
  auto dot = [&](int x, int y, int line) {  // y = 0 at the top
    if (x < 0 || x >= dots_x || y < 0 || y >= dots_y) return;
    static const uint8_t kBit[4][2] = {{0x01, 0x08}, {0x02, 0x10}, {0x04, 0x20}, {0x40, 0x80}};
    const int i = (y / 4) * w + x / 2;
    cell[i] |= kBit[y % 4][x % 2];
    owner[i] = line;
  };
  auto px = [&](double x) { return (x - r.x0) / (r.x1 - r.x0) * (dots_x - 1); };
  auto py = [&](double y) { return (r.y1 - y) / (r.y1 - r.y0) * (dots_y - 1); };
  for (size_t li = 0; li < c.lines.size(); ++li) {
    const Line& l = c.lines[li];
    bool have = false;
    double ax = 0, ay = 0;
    for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i) {
      if (!Finite(l.x[i]) || !Finite(l.y[i])) continue;
      const double bx = px(l.x[i]), by = py(l.y[i]);
      if (i < l.lo.size() && i < l.hi.size() && Finite(l.lo[i]) && Finite(l.hi[i])) {
        for (double y = py(l.hi[i]); y <= py(l.lo[i]); y += 1) dot(std::lround(bx), std::lround(y), li);
      }
      if (!have) {
        dot(std::lround(bx), std::lround(by), li);
      } else {  // a segment from the previous point, one dot per step of the longer axis
        const int steps = std::max(1, static_cast<int>(std::ceil(
                                          std::max(std::fabs(bx - ax), std::fabs(by - ay)))));
        for (int k = 1; k <= steps; ++k) {
          const double t = static_cast<double>(k) / steps;
          dot(std::lround(ax + (bx - ax) * t), std::lround(ay + (by - ay) * t), li);
        }
      }
      have = true;
      ax = bx;
      ay = by;
    }
  }
  static const int kAnsi[] = {34, 31, 32, 33, 35, 36, 37, 94};
  std::string out;
  if (!c.title.empty()) out += c.title + "\n";
  for (int row = 0; row < rows; ++row) {
    std::string label;
    if (row == 0) label = TickLabel(r.y1);
    if (row == rows - 1) label = TickLabel(r.y0);
    if (row == rows / 2) label = TickLabel((r.y0 + r.y1) / 2);
    out += absl::StrFormat("%*s", kLabel, label.substr(0, kLabel)) + "\xe2\x94\xa4";  // "┤"
    int prev = -1;
    for (int x = 0; x < w; ++x) {
      const int i = row * w + x;
      const int o = cell[i] ? owner[i] : -1;
      if (color && o != prev) {
        out += o < 0 ? "\x1b[0m" : absl::StrCat("\x1b[", kAnsi[o % 8], "m");
        prev = o;
      }
      const int cp = 0x2800 + cell[i];  // U+2800.. braille patterns, 3 bytes in UTF-8
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
    if (color && prev >= 0) out += "\x1b[0m";
    out += "\n";
  }
  std::string left = TickLabel(r.x0), right = TickLabel(r.x1);
  const int gap = std::max(1, w - static_cast<int>(left.size() + right.size()));
  out += std::string(kLabel + 1, ' ') + left + std::string(gap, ' ') + right + "\n";
  out += std::string(kLabel + 1, ' ') + c.x_label;
  for (size_t li = 0; li < c.lines.size() && c.lines.size() > 1; ++li) {
    out += "  ";
    if (color) out += absl::StrCat("\x1b[", kAnsi[li % 8], "m");
    out += "\xe2\x94\x80 " + c.lines[li].label;  // "─ label"
    if (color) out += "\x1b[0m";
  }
  out += "\n";
  return out;
}

}  // namespace ember::plot
