// Line charts for `emberctl plot`: SVG text, a PNG image (our own rasterizer and encoder over
// zlib) and terminal output in braille characters, from one description. No other dependency.
//
//   plot::Chart c{.title = "loss: my-job", .x_label = "step", .y_label = "loss"};
//   c.lines.push_back({.label = "rank 0", .x = steps, .y = values, .lo = mins, .hi = maxs});
//   std::string svg = plot::RenderSvg(c);               // a standalone <svg> document
//   std::string png = plot::RenderPng(c, 800, 450);      // the bytes of a .png file
//   std::string text = plot::RenderBraille(c, 80, 20, /*color=*/false);
//
// Lines are drawn in order with a fixed palette; lo/hi (optional, same length as x) draw a band of
// each downsampled bucket's min..max behind the line, so a spike shows however coarse the x axis.
// Non-finite values are skipped. Pure functions; thread-safe.
#ifndef EMBER_LAUNCHER_PLOT_H_
#define EMBER_LAUNCHER_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ember::plot {

struct Line {
  std::string label;
  std::vector<double> x, y;
  std::vector<double> lo, hi;  // empty, or one per x
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Line> lines;
};

// Data bounds with a little margin; a flat or empty range is widened so it is never zero.
struct Range {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
};
Range Bounds(const Chart& c);

// "Nice" tick values (1, 2, 5 x 10^k steps) covering [lo, hi], about `target` of them, all
// within [lo, hi].
std::vector<double> NiceTicks(double lo, double hi, int target);
// A tick label: short, no trailing zeros ("0.25", "1.5k", "2e-05").
std::string TickLabel(double v);

// "#rrggbb" of line i.
const char* LineColor(size_t i);

std::string RenderSvg(const Chart& c, int width = 800, int height = 450);
std::string RenderBraille(const Chart& c, int cols = 80, int rows = 20, bool color = false);
std::string RenderPng(const Chart& c, int width = 800, int height = 450);

// The PNG encoder under RenderPng: 8-bit RGB, rows top to bottom, `rgb` width*height*3 bytes.
std::string EncodePng(const std::vector<uint8_t>& rgb, int width, int height);

}  // namespace ember::plot

#endif  // EMBER_LAUNCHER_PLOT_H_
