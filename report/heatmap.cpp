// heatmap.cpp - SVG heatmap of |err|/bound over (query row x head dim) with tiles and mask drawn beside.
//
// Design (what a reader should see at a glance):
//  - colour: log10 of the ratio. Ratios <= 1 (within the bound) are shades of blue from white (<= 1e-4)
//    to dark blue (1); ratios > 1 jump to yellow and go to dark red (>= 1e4). The jump at 1 is the bound.
//    Black: NaN/Inf mismatch (ratio +inf). Grey: not compared (sampled rows).
//  - tile boundaries: horizontal lines at query rows that are multiples of 16 (thin), 32, 64 (thick);
//    vertical lines at head-dim multiples of 16/32/64 (lighter). A tail error shows as a band after the
//    last line; a tile error as a repeating pattern between lines.
//  - the mask, on the row axis: a gutter left of the map is dark for fully masked rows; a panel right of
//    the map draws each row's visible key interval over 0..Sk (the mask's shape: causal triangle,
//    window band, Sq != Sk offset); red dashed lines cross the map where fully masked rows begin/end;
//    a purple dotted line marks the first row whose visible keys reach the last key (Sk - 1) when the
//    mask has a finite right edge. Mask errors show up as error rows lining up with these.
//  - an optional LSE column (per-row ratio of the logsumexp) between the map and the mask panel.
//  - large maps are max-pooled (NaN-safe) to at most max_rows x max_cols cells.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "attnfuzz/report.h"

namespace attnfuzz {

RatioMap::RatioMap(int64_t r, int64_t c, bool with_lse)
    : rows(r), cols(c), ratio(static_cast<size_t>(std::max<int64_t>(0, r * c)), kNotCompared) {
  if (with_lse) lse_ratio.assign(static_cast<size_t>(std::max<int64_t>(0, r)), kNotCompared);
}

namespace {

// NaN-safe max: a NaN ratio means "cannot be compared" and must count as the worst, never vanish.
float worst_of(float cell, double r) {
  const float v = std::isnan(r) ? INFINITY : static_cast<float>(r < 0 ? 0 : r);
  return v > cell ? v : cell;
}

}  // namespace

void RatioMap::fold(int64_t row, int64_t col, double r) {
  if (row < 0 || row >= rows || col < 0 || col >= cols) return;
  float& cell = ratio[static_cast<size_t>(row * cols + col)];
  cell = worst_of(cell, r);
}

void RatioMap::fold_lse(int64_t row, double r) {
  if (row < 0 || row >= static_cast<int64_t>(lse_ratio.size())) return;
  lse_ratio[static_cast<size_t>(row)] = worst_of(lse_ratio[static_cast<size_t>(row)], r);
}

namespace {

struct Rgb {
  double r, g, b;
};
Rgb mix(Rgb a, Rgb b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}
std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(std::lround(c.r)),
                static_cast<int>(std::lround(c.g)), static_cast<int>(std::lround(c.b)));
  return buf;
}
// Piecewise-linear ramp through stops at t = 0, 1/(n-1), ..., 1.
Rgb ramp(const std::vector<Rgb>& stops, double t) {
  t = std::clamp(t, 0.0, 1.0) * static_cast<double>(stops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), stops.size() - 2);
  return mix(stops[i], stops[i + 1], t - static_cast<double>(i));
}

constexpr int kLevels = 16;  // quantisation per side of 1 (keeps runs long and the SVG small)
const char* kNotComparedColour = "#d9d9d9";
const char* kMismatchColour = "#000000";

std::string colour(float r) {
  if (r < 0) return kNotComparedColour;
  if (std::isinf(r) || std::isnan(r)) return kMismatchColour;
  static const std::vector<Rgb> cool = {
      {247, 251, 255}, {198, 219, 239}, {107, 174, 214}, {33, 113, 181}, {8, 48, 107}};
  static const std::vector<Rgb> hot = {
      {254, 224, 139}, {253, 174, 97}, {244, 109, 67}, {215, 48, 39}, {103, 0, 13}};
  if (r <= 1.0f) {
    const double t = (std::log10(std::max<double>(r, 1e-9)) + 4.0) / 4.0;  // 1e-4 -> 0, 1 -> 1
    const double q = std::round(std::clamp(t, 0.0, 1.0) * (kLevels - 1)) / (kLevels - 1);
    return hex(ramp(cool, q));
  }
  const double t = std::log10(static_cast<double>(r)) / 4.0;  // 1 -> 0, 1e4 -> 1
  const double q = std::round(std::clamp(t, 0.0, 1.0) * (kLevels - 1)) / (kLevels - 1);
  return hex(ramp(hot, q));
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Tick step for an axis of n items: the smallest of 1, 2, 4, 8, 16, ... giving at most ~10 ticks.
int64_t tick_step(int64_t n) {
  int64_t step = 1;
  while (n / step > 10) step *= 2;
  return step;
}

// Where everything goes: the pooled grid, the map's pixel box, the LSE column, the mask panel and the legend.
struct Layout {
  int64_t rows, cols;  // the map's size (at least 1 x 1)
  int64_t fr, fc;      // rows / columns max-pooled into one cell
  int64_t nr, nc;      // pooled cells
  double cw, ch, pw, ph;
  double x0 = 84, y0 = 64;
  bool has_lse;
  double lse_x, lse_w, mp_x, mp_w = 80, lg_x, lg_h = 200, width, height;

  Layout(const RatioMap& map, const HeatmapOptions& opt)
      : rows(std::max<int64_t>(map.rows, 1)),
        cols(std::max<int64_t>(map.cols, 1)),
        fr(ceil_div(rows, std::max<int64_t>(1, opt.max_rows))),
        fc(ceil_div(cols, std::max<int64_t>(1, opt.max_cols))),
        nr(ceil_div(rows, fr)),
        nc(ceil_div(cols, fc)),
        cw(std::clamp<double>(std::floor(480.0 / nc), 2, 24)),
        ch(std::clamp<double>(std::floor(480.0 / nr), 2, 24)),
        pw(nc * cw),
        ph(nr * ch),
        has_lse(!map.lse_ratio.empty()) {
    lse_x = x0 + pw + 10;
    lse_w = has_lse ? 14 : 0;
    mp_x = lse_x + lse_w + (has_lse ? 16 : 6);
    lg_x = mp_x + mp_w + 34;
    width = lg_x + 190;
    height = y0 + std::max(ph, lg_h + 150) + 56;
  }
  double row_y(double i) const { return y0 + i * ph / static_cast<double>(rows); }
  double col_x(double d) const { return x0 + d * pw / static_cast<double>(cols); }
  // Original rows [first, end) pooled into cell row R, clipped to n rows.
  int64_t row_begin(int64_t R) const { return R * fr; }
  int64_t row_end(int64_t R, int64_t n) const { return std::min(n, (R + 1) * fr); }
};

// The worst ratio of the original cells pooled into (R, C).
float pooled(const RatioMap& map, const Layout& L, int64_t R, int64_t C) {
  float v = RatioMap::kNotCompared;
  for (int64_t i = L.row_begin(R); i < L.row_end(R, std::min(L.rows, map.rows)); ++i)
    for (int64_t j = C * L.fc; j < std::min(std::min(L.cols, map.cols), (C + 1) * L.fc); ++j) {
      const float x = map.at(i, j);
      if (x >= 0 || std::isnan(x)) v = worst_of(v, x);
    }
  return v;
}

void write_header(std::ostream& s, const Layout& L, const HeatmapOptions& opt) {
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(L.width) << "\" height=\"" << fmt(L.height)
    << "\" viewBox=\"0 0 " << fmt(L.width) << ' ' << fmt(L.height)
    << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"11\">\n";
  s << "<title>" << xml_escape(opt.title) << "</title>\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  s << "<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << xml_escape(opt.title)
    << "</text>\n";
  s << "<text x=\"12\" y=\"40\" fill=\"#333333\">" << xml_escape(opt.subtitle) << "</text>\n";
  if (L.fr > 1 || L.fc > 1)
    s << "<text x=\"12\" y=\"54\" fill=\"#666666\">max-pooled: " << L.fr << " row(s) x " << L.fc
      << " column(s) per cell</text>\n";
}

// The map, one rect per run of equal colour in a pooled row, and its frame.
void write_cells(std::ostream& s, const RatioMap& map, const Layout& L) {
  s << "<g id=\"cells\" shape-rendering=\"crispEdges\">\n";
  for (int64_t R = 0; R < L.nr; ++R) {
    int64_t start = 0;
    std::string run = colour(pooled(map, L, R, 0));
    for (int64_t C = 1; C <= L.nc; ++C) {
      const std::string next = C < L.nc ? colour(pooled(map, L, R, C)) : std::string();
      if (next == run) continue;
      s << "<rect x=\"" << fmt(L.x0 + start * L.cw) << "\" y=\"" << fmt(L.y0 + R * L.ch) << "\" width=\""
        << fmt((C - start) * L.cw) << "\" height=\"" << fmt(L.ch) << "\" fill=\"" << run << "\"/>\n";
      start = C;
      run = next;
    }
  }
  s << "</g>\n";
  s << "<rect x=\"" << fmt(L.x0) << "\" y=\"" << fmt(L.y0) << "\" width=\"" << fmt(L.pw) << "\" height=\""
    << fmt(L.ph) << "\" fill=\"none\" stroke=\"#000000\" stroke-width=\"1\"/>\n";
}

// Tile boundaries: rows (strong) and head dim (light). Skip a tile size whose lines would be < 4 px apart.
void write_tiles(std::ostream& s, const RatioMap& map, const Layout& L) {
  s << "<g id=\"tiles\" fill=\"none\">\n";
  const struct {
    int64_t t;
    const char* stroke;
    double w;
  } tiles[] = {{64, "#222222", 1.6}, {32, "#444444", 1.0}, {16, "#666666", 0.6}};
  for (const auto& t : tiles) {
    if (t.t * L.ph / L.rows >= 4)
      for (int64_t k = t.t; k < map.rows; k += t.t) {
        if (t.t < 64 && k % (2 * t.t) == 0) continue;  // drawn by the larger tile
        s << "<line x1=\"" << fmt(L.x0) << "\" x2=\"" << fmt(L.x0 + L.pw) << "\" y1=\"" << fmt(L.row_y(k))
          << "\" y2=\"" << fmt(L.row_y(k)) << "\" stroke=\"" << t.stroke << "\" stroke-width=\"" << t.w
          << "\"/>\n";
      }
    if (t.t * L.pw / L.cols >= 4)
      for (int64_t k = t.t; k < map.cols; k += t.t) {
        if (t.t < 64 && k % (2 * t.t) == 0) continue;
        s << "<line y1=\"" << fmt(L.y0) << "\" y2=\"" << fmt(L.y0 + L.ph) << "\" x1=\"" << fmt(L.col_x(k))
          << "\" x2=\"" << fmt(L.col_x(k)) << "\" stroke=\"" << t.stroke << "\" stroke-width=\"" << t.w * 0.6
          << "\" stroke-opacity=\"0.6\"/>\n";
      }
  }
  s << "</g>\n";
}

// The gutter of fully masked rows, the red lines where they begin / end, the line of the first row seeing Sk
// - 1.
void write_mask_lines(std::ostream& s, const RatioMap& map, const Problem& p, const Layout& L,
                      const std::vector<KeyRange>& vis) {
  for (int64_t R = 0; R < L.nr; ++R) {
    int64_t masked = 0, n = 0;
    for (int64_t i = L.row_begin(R); i < L.row_end(R, map.rows); ++i, ++n) masked += vis[i].empty();
    if (masked == 0) continue;
    s << "<rect x=\"" << fmt(L.x0 - 10) << "\" y=\"" << fmt(L.y0 + R * L.ch) << "\" width=\"7\" height=\""
      << fmt(L.ch) << "\" fill=\"" << (masked == n ? "#404040" : "#a0a0a0") << "\"/>\n";
  }
  for (int64_t i = 1; i < map.rows; ++i)
    if (vis[i].empty() != vis[i - 1].empty())
      s << "<line x1=\"" << fmt(L.x0 - 10) << "\" x2=\"" << fmt(L.mp_x + L.mp_w) << "\" y1=\""
        << fmt(L.row_y(i)) << "\" y2=\"" << fmt(L.row_y(i))
        << "\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/>\n";
  if (p.mask_kind == AF_MASK_NONE || window_right(p) == AF_UNBOUNDED || p.seq_k <= 0) return;
  for (int64_t i = 1; i < map.rows; ++i)
    if (!vis[i].empty() && vis[i].last == p.seq_k && (vis[i - 1].empty() || vis[i - 1].last < p.seq_k)) {
      s << "<line x1=\"" << fmt(L.x0) << "\" x2=\"" << fmt(L.mp_x + L.mp_w) << "\" y1=\"" << fmt(L.row_y(i))
        << "\" y2=\"" << fmt(L.row_y(i))
        << "\" stroke=\"#7b3294\" stroke-width=\"1.5\" stroke-dasharray=\"2,2\"/>\n";
      break;
    }
}

// The panel right of the map: each pooled row's visible key interval over 0 .. Sk, and its labels.
void write_mask_panel(std::ostream& s, const RatioMap& map, const Problem& p, const Layout& L,
                      const std::vector<KeyRange>& vis) {
  s << "<rect x=\"" << fmt(L.mp_x) << "\" y=\"" << fmt(L.y0) << "\" width=\"" << fmt(L.mp_w) << "\" height=\""
    << fmt(L.ph) << "\" fill=\"#f4f4f4\" stroke=\"#000000\" stroke-width=\"0.8\"/>\n";
  if (p.seq_k > 0) {
    for (int64_t R = 0; R < L.nr; ++R) {
      int64_t first = p.seq_k, last = 0;
      for (int64_t i = L.row_begin(R); i < L.row_end(R, map.rows); ++i)
        if (!vis[i].empty()) {
          first = std::min(first, vis[i].first);
          last = std::max(last, vis[i].last);
        }
      if (first >= last) continue;
      s << "<rect x=\"" << fmt(L.mp_x + L.mp_w * first / p.seq_k) << "\" y=\"" << fmt(L.y0 + R * L.ch)
        << "\" width=\"" << fmt(std::max(0.5, L.mp_w * (last - first) / static_cast<double>(p.seq_k)))
        << "\" height=\"" << fmt(L.ch) << "\" fill=\"#737373\"/>\n";
    }
    for (int64_t k = 64; k < p.seq_k; k += 64)
      s << "<line x1=\"" << fmt(L.mp_x + L.mp_w * k / p.seq_k) << "\" x2=\""
        << fmt(L.mp_x + L.mp_w * k / p.seq_k) << "\" y1=\"" << fmt(L.y0) << "\" y2=\"" << fmt(L.y0 + L.ph)
        << "\" stroke=\"#ffffff\" stroke-width=\"0.8\"/>\n";
  } else {
    s << "<text x=\"" << fmt(L.mp_x + L.mp_w / 2) << "\" y=\"" << fmt(L.y0 + L.ph / 2)
      << "\" text-anchor=\"middle\">Sk = 0</text>\n";
  }
  s << "<text x=\"" << fmt(L.mp_x + L.mp_w / 2) << "\" y=\"" << fmt(L.y0 - 6)
    << "\" text-anchor=\"middle\">visible keys</text>\n";
  s << "<text x=\"" << fmt(L.mp_x) << "\" y=\"" << fmt(L.y0 + L.ph + 14) << "\">0</text>\n";
  s << "<text x=\"" << fmt(L.mp_x + L.mp_w) << "\" y=\"" << fmt(L.y0 + L.ph + 14)
    << "\" text-anchor=\"end\">Sk=" << p.seq_k << "</text>\n";
  s << "<text x=\"" << fmt(L.mp_x + L.mp_w / 2) << "\" y=\"" << fmt(L.y0 + L.ph + 28)
    << "\" text-anchor=\"middle\">" << xml_escape(mask_to_string(p)) << "</text>\n";
}

void write_mask(std::ostream& s, const RatioMap& map, const Problem& p, const Layout& L) {
  std::vector<KeyRange> vis(static_cast<size_t>(map.rows));
  for (int64_t i = 0; i < map.rows; ++i) vis[i] = visible_keys(p, i);
  s << "<g id=\"mask\">\n";
  write_mask_lines(s, map, p, L, vis);
  write_mask_panel(s, map, p, L, vis);
  s << "</g>\n";
}

void write_lse(std::ostream& s, const RatioMap& map, const Layout& L) {
  if (!L.has_lse) return;
  s << "<g id=\"lse\" shape-rendering=\"crispEdges\">\n";
  for (int64_t R = 0; R < L.nr; ++R) {
    float v = RatioMap::kNotCompared;
    for (int64_t i = L.row_begin(R); i < L.row_end(R, static_cast<int64_t>(map.lse_ratio.size())); ++i) {
      const float x = map.lse_ratio[i];
      if (x >= 0 || std::isnan(x)) v = worst_of(v, x);
    }
    s << "<rect x=\"" << fmt(L.lse_x) << "\" y=\"" << fmt(L.y0 + R * L.ch) << "\" width=\"" << fmt(L.lse_w)
      << "\" height=\"" << fmt(L.ch) << "\" fill=\"" << colour(v) << "\"/>\n";
  }
  s << "<rect x=\"" << fmt(L.lse_x) << "\" y=\"" << fmt(L.y0) << "\" width=\"" << fmt(L.lse_w)
    << "\" height=\"" << fmt(L.ph) << "\" fill=\"none\" stroke=\"#000000\" stroke-width=\"0.8\"/>\n";
  s << "<text x=\"" << fmt(L.lse_x + L.lse_w / 2) << "\" y=\"" << fmt(L.y0 - 6)
    << "\" text-anchor=\"middle\">LSE</text>\n";
  s << "</g>\n";
}

// Ticks at 0, every step and the last index of an axis of n items.
std::vector<int64_t> axis_ticks(int64_t n) {
  std::vector<int64_t> ticks;
  for (int64_t i = 0; i < n; i += tick_step(n)) ticks.push_back(i);
  if (n > 0 && ticks.back() != n - 1) ticks.push_back(n - 1);
  return ticks;
}

void write_axes(std::ostream& s, const RatioMap& map, const Problem& p, const Layout& L) {
  s << "<g id=\"axes\">\n";
  for (int64_t i : axis_ticks(map.rows))
    s << "<text x=\"" << fmt(L.x0 - 14) << "\" y=\"" << fmt(L.row_y(i + 0.5) + 4) << "\" text-anchor=\"end\">"
      << i << "</text>\n";
  for (int64_t d : axis_ticks(map.cols))
    s << "<text x=\"" << fmt(L.col_x(d + 0.5)) << "\" y=\"" << fmt(L.y0 + L.ph + 14)
      << "\" text-anchor=\"middle\">" << d << "</text>\n";
  s << "<text x=\"" << fmt(L.x0 + L.pw / 2) << "\" y=\"" << fmt(L.y0 + L.ph + 32)
    << "\" text-anchor=\"middle\">head dim d of O (Dv = " << p.head_dim_v << ")</text>\n";
  s << "<text transform=\"translate(16," << fmt(L.y0 + L.ph / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">query row i (Sq = " << p.seq_q << ")</text>\n";
  s << "</g>\n";
}

// The log colour bar with the bound marked.
void write_colour_bar(std::ostream& s, const Layout& L) {
  s << "<text x=\"" << fmt(L.lg_x) << "\" y=\"" << fmt(L.y0 - 6) << "\">|err| / bound (log)</text>\n";
  const int kSteps = 64;
  for (int k = 0; k < kSteps; ++k) {
    const double e = 4.0 - 8.0 * (k + 0.5) / kSteps;  // top: 1e4, bottom: 1e-4
    s << "<rect x=\"" << fmt(L.lg_x) << "\" y=\"" << fmt(L.y0 + L.lg_h * k / kSteps)
      << "\" width=\"16\" height=\"" << fmt(L.lg_h / kSteps + 0.5) << "\" fill=\""
      << colour(static_cast<float>(std::pow(10.0, e))) << "\"/>\n";
  }
  s << "<rect x=\"" << fmt(L.lg_x) << "\" y=\"" << fmt(L.y0) << "\" width=\"16\" height=\"" << fmt(L.lg_h)
    << "\" fill=\"none\" stroke=\"#000000\" stroke-width=\"0.8\"/>\n";
  const struct {
    double e;
    const char* label;
  } ticks[] = {{4, "1e4 or more"}, {2, "1e2"}, {0, "1 = bound"}, {-2, "1e-2"}, {-4, "1e-4 or less"}};
  for (const auto& t : ticks) {
    const double y = L.y0 + L.lg_h * (4.0 - t.e) / 8.0;
    const bool bound = t.e == 0;
    s << "<line x1=\"" << fmt(L.lg_x - (bound ? 6 : 0)) << "\" x2=\"" << fmt(L.lg_x + 22) << "\" y1=\""
      << fmt(y) << "\" y2=\"" << fmt(y) << "\" stroke=\"#000000\" stroke-width=\"" << (bound ? 2.5 : 1)
      << "\"/>\n";
    s << "<text x=\"" << fmt(L.lg_x + 26) << "\" y=\"" << fmt(y + 4) << "\""
      << (bound ? " font-weight=\"bold\"" : "") << ">" << t.label << "</text>\n";
  }
}

// The colour bar, then the swatches and line styles under it.
void write_legend(std::ostream& s, const Layout& L) {
  s << "<g id=\"legend\">\n";
  write_colour_bar(s, L);
  double ly = L.y0 + L.lg_h + 22;
  auto swatch = [&](const char* fill, const char* label) {
    s << "<rect x=\"" << fmt(L.lg_x) << "\" y=\"" << fmt(ly - 10) << "\" width=\"16\" height=\"12\" fill=\""
      << fill << "\" stroke=\"#000000\" stroke-width=\"0.5\"/>\n";
    s << "<text x=\"" << fmt(L.lg_x + 22) << "\" y=\"" << fmt(ly) << "\">" << label << "</text>\n";
    ly += 18;
  };
  auto line_key = [&](const char* stroke, const char* dash, double w, const char* label) {
    s << "<line x1=\"" << fmt(L.lg_x) << "\" x2=\"" << fmt(L.lg_x + 16) << "\" y1=\"" << fmt(ly - 4)
      << "\" y2=\"" << fmt(ly - 4) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << w << "\""
      << (dash[0] ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string()) << "/>\n";
    s << "<text x=\"" << fmt(L.lg_x + 22) << "\" y=\"" << fmt(ly) << "\">" << label << "</text>\n";
    ly += 18;
  };
  swatch(kMismatchColour, "NaN/Inf mismatch");
  swatch(kNotComparedColour, "not compared");
  swatch("#404040", "fully masked row (gutter)");
  line_key("#222222", "", 1.6, "tile edge: 64 (32, 16 thinner)");
  line_key("#d62728", "6,3", 1.5, "fully masked rows begin/end");
  line_key("#7b3294", "2,2", 1.5, "first row seeing key Sk-1");
  s << "</g>\n";
}

}  // namespace

std::string heatmap_svg(const RatioMap& map, const Problem& p, const HeatmapOptions& opt) {
  const Layout L(map, opt);
  std::ostringstream s;
  write_header(s, L, opt);
  write_cells(s, map, L);
  write_tiles(s, map, L);
  write_mask(s, map, p, L);
  write_lse(s, map, L);
  write_axes(s, map, p, L);
  write_legend(s, L);
  s << "</svg>\n";
  return s.str();
}

}  // namespace attnfuzz
