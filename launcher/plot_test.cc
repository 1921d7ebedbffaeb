#include "launcher/plot.h"

#include <zlib.h>

#include <cmath>
#include <cstring>

#include "catch2/catch.hpp"

namespace ember::plot {
namespace {

uint32_t U32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint8_t(s[at + 3]);
}

// An independent PNG reader for what EncodePng writes: checks the signature and every chunk's
// CRC, inflates the IDATs and undoes filter type 0. Returns RGB rows.
std::vector<uint8_t> DecodePng(const std::string& png, int* w, int* h) {
  REQUIRE(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
  std::string z;
  size_t at = 8;
  bool end = false;
  while (at + 12 <= png.size()) {
    const uint32_t len = U32(png, at);
    const std::string type = png.substr(at + 4, 4);
    REQUIRE(at + 12 + len <= png.size());
    const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(png.data() + at + 4), 4 + len);
    REQUIRE(crc == U32(png, at + 8 + len));
    if (type == "IHDR") {
      *w = U32(png, at + 8);
      *h = U32(png, at + 12);
      REQUIRE(png[at + 16] == 8);  // bit depth
      REQUIRE(png[at + 17] == 2);  // RGB
    } else if (type == "IDAT") {
      z += png.substr(at + 8, len);
    } else if (type == "IEND") {
      end = true;
    }
    at += 12 + len;
  }
  REQUIRE(end);
  REQUIRE(at == png.size());
  std::vector<uint8_t> raw(size_t(*h) * (1 + *w * 3));
  uLongf n = raw.size();
  REQUIRE(uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(z.data()), z.size()) == Z_OK);
  REQUIRE(n == raw.size());
  std::vector<uint8_t> rgb;
  for (int y = 0; y < *h; ++y) {
    REQUIRE(raw[y * (1 + *w * 3)] == 0);
    rgb.insert(rgb.end(), raw.begin() + y * (1 + *w * 3) + 1, raw.begin() + (y + 1) * (1 + *w * 3));
  }
  return rgb;
}

Chart Diagonal() {
  Chart c{.title = "loss: <job & \"x\">", .x_label = "step", .y_label = "loss"};
  Line l{.label = "rank 0"};
  for (int i = 0; i <= 100; ++i) {
    l.x.push_back(i);
    l.y.push_back(i);
  }
  c.lines.push_back(l);
  return c;
}

TEST_CASE("NiceTicks are round, ordered and inside the range") {
  auto t = NiceTicks(0.13, 9.7, 5);
  REQUIRE(t.size() >= 3);
  CHECK(t.front() >= 0.13);
  CHECK(t.back() <= 9.7);
  const double step = t[1] - t[0];
  const double mant = step / std::pow(10, std::floor(std::log10(step)));
  CHECK((std::fabs(mant - 1) < 1e-9 || std::fabs(mant - 2) < 1e-9 || std::fabs(mant - 5) < 1e-9));
  for (size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == Approx(step));
  CHECK(NiceTicks(1, 1, 5).empty());
  CHECK(TickLabel(25000) == "25k");
  CHECK(TickLabel(0.25) == "0.25");
  CHECK(TickLabel(3e6) == "3M");
}

TEST_CASE("PNG: a valid file whose pixels follow the line") {
  const std::string png = RenderPng(Diagonal(), 300, 200);
  int w = 0, h = 0;
  auto rgb = DecodePng(png, &w, &h);
  REQUIRE(w == 300);
  REQUIRE(h == 200);
  // RenderPng's frame: left 70, top 20, right w-20, bottom h-40. Bounds pad y by 5%: y in
  // [-5, 105]. The point (50, 50) must be drawn in the first palette colour #1f77b4.
  const double x = 70 + 0.5 * (280 - 70);
  const double y = 160 - (55.0 / 110.0) * (160 - 20);
  bool hit = false;
  for (int dy = -2; dy <= 2; ++dy) {
    for (int dx = -2; dx <= 2; ++dx) {
      const uint8_t* p = &rgb[(size_t(std::lround(y) + dy) * w + std::lround(x) + dx) * 3];
      hit |= p[0] == 0x1f && p[1] == 0x77 && p[2] == 0xb4;
    }
  }
  CHECK(hit);
  // Far from the line (top-left of the plot area, above the diagonal) stays background or grid.
  const uint8_t* far = &rgb[(size_t(30) * w + 250) * 3 - 0];
  CHECK(!(far[0] == 0x1f && far[1] == 0x77 && far[2] == 0xb4));
}

TEST_CASE("SVG escapes text and carries the exact points") {
  const std::string svg = RenderSvg(Diagonal());
  CHECK(svg.find("loss: &lt;job &amp; &quot;x&quot;&gt;") != std::string::npos);
  CHECK(svg.find("<job") == std::string::npos);
  CHECK(svg.find("data-points=\"0:0 1:1 2:2") != std::string::npos);
  CHECK(svg.find("100:100\"") != std::string::npos);
}

TEST_CASE("Braille: a rising diagonal fills the bottom-left and top-right cells") {
  const std::string text = RenderBraille(Diagonal(), 40, 8, false);
  std::vector<std::string> rows;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    rows.push_back(text.substr(start, nl - start));
  REQUIRE(rows.size() == 1 + 8 + 2);  // title, 8 rows, x ticks, x label
  auto cells = [](const std::string& row) {  // the braille code points after the axis "┤"
    std::vector<int> out;
    size_t at = row.find("\xe2\x94\xa4") + 3;
    for (; at + 2 < row.size() + 0; at += 3) {
      out.push_back(((row[at] & 0x0f) << 12) | ((row[at + 1] & 0x3f) << 6) | (row[at + 2] & 0x3f));
    }
    return out;
  };
  auto top = cells(rows[1]), bottom = cells(rows[8]);
  REQUIRE(top.size() == 29);
  CHECK(top.back() != 0x2800);
  CHECK(top.front() == 0x2800);
  CHECK(bottom.front() != 0x2800);
  CHECK(bottom.back() == 0x2800);
  for (int cp : top) CHECK((cp >= 0x2800 && cp <= 0x28ff));
}

}  // namespace
}  // namespace ember::plot
