// RenderPng and EncodePng (plot.h): a small RGB rasterizer (grid, axes, a 3x5 pixel font for the
// tick numbers, bands and lines) and a PNG writer (IHDR, one zlib IDAT, IEND; CRCs from zlib).
// The title and axis names are not drawn in PNG (no text font beyond the tick characters); the
// SVG has them.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "launcher/plot.h"

namespace ember::plot {
namespace {

struct Rgb {
  uint8_t r, g, b;
};

Rgb Hex(const char* h) {  // "#rrggbb"
  auto v = [&](int i) { return static_cast<uint8_t>(std::stoi(std::string(h + i, 2), nullptr, 16)); };
  return {v(1), v(3), v(5)};
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h * 3, 255) {}
  void Set(int x, int y, Rgb c, double alpha = 1) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    uint8_t* p = &px_[(static_cast<size_t>(y) * w_ + x) * 3];
    p[0] = static_cast<uint8_t>(std::lround(p[0] * (1 - alpha) + c.r * alpha));
    p[1] = static_cast<uint8_t>(std::lround(p[1] * (1 - alpha) + c.g * alpha));
    p[2] = static_cast<uint8_t>(std::lround(p[2] * (1 - alpha) + c.b * alpha));
  }
  void Line(double x0, double y0, double x1, double y1, Rgb c, int thick = 1) {
    const int n = std::max(1, static_cast<int>(std::ceil(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0)))));
    for (int k = 0; k <= n; ++k) {
      const double t = static_cast<double>(k) / n;
      const int x = std::lround(x0 + (x1 - x0) * t), y = std::lround(y0 + (y1 - y0) * t);
      for (int dx = 0; dx < thick; ++dx)
        for (int dy = 0; dy < thick; ++dy) Set(x + dx, y + dy, c);
    }
  }
  // Tick text in a 3x5 font scaled by 2; (x, y) is the top-left corner.
  void Text(int x, int y, const std::string& s, Rgb c) {
    for (char ch : s) {
      const uint16_t* g = Glyph(ch);
      for (int row = 0; g && row < 5; ++row)
        for (int col = 0; col < 3; ++col)
          if (g[row] & (4 >> col))
            for (int d = 0; d < 4; ++d) Set(x + col * 2 + d % 2, y + row * 2 + d / 2, c);
      x += 8;
    }
  }
  static int TextWidth(const std::string& s) { return static_cast<int>(s.size()) * 8; }
  const std::vector<uint8_t>& pixels() const { return px_; }

 private:
  static const uint16_t* Glyph(char ch) {
    static const char kChars[] = "0123456789.-+ekMG";
    static const uint16_t kGlyphs[][5] = {
        {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1},
        {7, 4, 7, 1, 7}, {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7},
        {0, 0, 0, 0, 2}, {0, 0, 7, 0, 0}, {0, 2, 7, 2, 0}, {0, 7, 7, 4, 7}, {4, 5, 6, 5, 5},
        {5, 7, 7, 5, 5}, {7, 4, 5, 5, 7}};
    const char* at = std::strchr(kChars, ch);
    return ch != '\0' && at ? kGlyphs[at - kChars] : nullptr;
  }
  int w_, h_;
  std::vector<uint8_t> px_;
};

void PutU32(std::string* s, uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) s->push_back(static_cast<char>((v >> sh) & 0xff));
}

void Chunk(std::string* out, const char* type, const std::string& data) {
  PutU32(out, static_cast<uint32_t>(data.size()));
  const size_t at = out->size();
  out->append(type, 4);
  out->append(data);
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(out->data() + at), 4 + data.size());
  PutU32(out, static_cast<uint32_t>(crc));
}

}  // namespace

std::string EncodePng(const std::vector<uint8_t>& rgb, int width, int height) {
  std::string raw;  // each row: filter type 0, then the pixels
  raw.reserve(static_cast<size_t>(height) * (1 + width * 3));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&rgb[static_cast<size_t>(y) * width * 3]), width * 3);
  }
  uLongf zlen = compressBound(raw.size());
  std::string z(zlen, '\0');
  compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
            raw.size(), 6);
  z.resize(zlen);
  std::string ihdr;
  PutU32(&ihdr, width);
  PutU32(&ihdr, height);
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  std::string out("\x89PNG\r\n\x1a\n", 8);
  Chunk(&out, "IHDR", ihdr);
  Chunk(&out, "IDAT", z);
  Chunk(&out, "IEND", "");
  return out;
}

std::string RenderPng(const Chart& c, int width, int height) {
  width = std::clamp(width, 100, 8000);
  height = std::clamp(height, 80, 8000);
  Canvas cv(width, height);
  const Range r = Bounds(c);
  const double left = 70, top = 20, right = width - 20.0, bottom = height - 40.0;
  auto X = [&](double x) { return left + (x - r.x0) / (r.x1 - r.x0) * (right - left); };
  auto Y = [&](double y) { return bottom - (y - r.y0) / (r.y1 - r.y0) * (bottom - top); };
  const Rgb grid{224, 224, 224}, ink{51, 51, 51};
  for (double v : NiceTicks(r.x0, r.x1, 8)) {
    cv.Line(X(v), top, X(v), bottom, grid);
    const std::string t = TickLabel(v);
    cv.Text(static_cast<int>(X(v)) - Canvas::TextWidth(t) / 2, static_cast<int>(bottom) + 8, t, ink);
  }
  for (double v : NiceTicks(r.y0, r.y1, 6)) {
    cv.Line(left, Y(v), right, Y(v), grid);
    const std::string t = TickLabel(v);
    cv.Text(static_cast<int>(left) - 6 - Canvas::TextWidth(t), static_cast<int>(Y(v)) - 5, t, ink);
  }
  cv.Line(left, bottom, right, bottom, ink);
  cv.Line(left, top, left, bottom, ink);
  for (size_t li = 0; li < c.lines.size(); ++li) {
    const Line& l = c.lines[li];
    const Rgb col = Hex(LineColor(li));
    const size_t n = std::min(l.x.size(), l.y.size());
    if (l.lo.size() == n && l.hi.size() == n) {
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(l.lo[i]) || !std::isfinite(l.hi[i]) || !std::isfinite(l.x[i])) continue;
        const int x = std::lround(X(l.x[i]));
        for (int y = std::lround(Y(l.hi[i])); y <= std::lround(Y(l.lo[i])); ++y) cv.Set(x, y, col, 0.25);
      }
    }
    bool have = false;
    double ax = 0, ay = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(l.x[i]) || !std::isfinite(l.y[i])) continue;
      const double bx = X(l.x[i]), by = Y(l.y[i]);
      if (have) cv.Line(ax, ay, bx, by, col, 2);
      else cv.Line(bx, by, bx, by, col, 2);
      have = true;
      ax = bx;
      ay = by;
    }
  }
  return EncodePng(cv.pixels(), width, height);
}

}  // namespace ember::plot
