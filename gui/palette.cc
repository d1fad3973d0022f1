// Colours of runs and groups: a colour-blind-safe categorical palette for the dark plot
// background that stays distinct beyond the usual 8-10 colours, and the ordered gradient.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "gui/view_model.h"

namespace moelab::gui {

namespace {

double ToLinear(double c) { return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4); }
double ToGamma(double c) {
  c = std::clamp(c, 0.0, 1.0);
  return c <= 0.0031308 ? 12.92 * c : 1.055 * std::pow(c, 1 / 2.4) - 0.055;
}

OkLab LinearToOkLab(double r, double g, double b) {
  const double l = std::cbrt(0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * b);
  const double m = std::cbrt(0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b);
  const double s = std::cbrt(0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b);
  return {0.2104542553 * l + 0.7936177850 * m - 0.0040720453 * s,
          1.9779984951 * l - 2.4285922050 * m + 0.4505937099 * s,
          0.0259040371 * l + 0.7827717662 * m - 0.8086757660 * s};
}

// OKLCh -> sRGB; false when out of gamut.
bool FromOkLch(double l, double c, double h, Rgba* out) {
  const double a = c * std::cos(h), b = c * std::sin(h);
  const double l_ = l + 0.3963377774 * a + 0.2158037573 * b;
  const double m_ = l - 0.1055613458 * a - 0.0638541728 * b;
  const double s_ = l - 0.0894841775 * a - 1.2914855480 * b;
  const double L = l_ * l_ * l_, M = m_ * m_ * m_, S = s_ * s_ * s_;
  const double r = 4.0767416621 * L - 3.3077115913 * M + 0.2309699292 * S;
  const double g = -1.2684380046 * L + 2.6097574011 * M - 0.3413193965 * S;
  const double bb = -0.0041960863 * L - 0.7034186147 * M + 1.7076147010 * S;
  const double eps = 1e-4;
  if (r < -eps || r > 1 + eps || g < -eps || g > 1 + eps || bb < -eps || bb > 1 + eps) return false;
  *out = {static_cast<float>(ToGamma(r)), static_cast<float>(ToGamma(g)),
          static_cast<float>(ToGamma(bb)), 1};
  return true;
}

Rgba FromBytes(int r, int g, int b) { return {r / 255.0f, g / 255.0f, b / 255.0f, 1}; }

// Okabe & Ito (2008), in an order whose first pairs differ most on a dark background; their
// black is light grey here (the plots are dark).
const std::array<Rgba, 8>& OkabeIto() {
  static const std::array<Rgba, 8> kColors = {
      FromBytes(86, 180, 233),   // sky blue
      FromBytes(230, 159, 0),    // orange
      FromBytes(0, 158, 115),    // bluish green
      FromBytes(204, 121, 167),  // reddish purple
      FromBytes(240, 228, 66),   // yellow
      FromBytes(213, 94, 0),     // vermillion
      FromBytes(220, 220, 220),  // light grey (for black)
      FromBytes(0, 114, 178),    // blue
  };
  return kColors;
}

std::vector<Rgba> BuildPalette() {
  std::vector<Rgba> palette(OkabeIto().begin(), OkabeIto().end());
  // Candidates: an OKLCh grid bright enough to read on the background.
  std::vector<Rgba> candidates;
  for (double l = 0.62; l <= 0.93; l += 0.05) {
    for (double c = 0.05; c <= 0.23; c += 0.045) {
      for (int h = 0; h < 360; h += 8) {
        Rgba rgb;
        if (FromOkLch(l, c, h * M_PI / 180, &rgb)) candidates.push_back(rgb);
      }
    }
  }
  // Greedy farthest point: each new colour maximises its smallest CVD-safe distance to the
  // colours chosen so far and to the background.
  std::vector<double> nearest(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    nearest[i] = CvdSafeDistance(candidates[i], PlotBackground());
    for (const Rgba& p : palette)
      nearest[i] = std::min(nearest[i], CvdSafeDistance(candidates[i], p));
  }
  while (static_cast<int>(palette.size()) < kPaletteSize) {
    const size_t best = std::max_element(nearest.begin(), nearest.end()) - nearest.begin();
    const Rgba pick = candidates[best];
    palette.push_back(pick);
    for (size_t i = 0; i < candidates.size(); ++i)
      nearest[i] = std::min(nearest[i], CvdSafeDistance(candidates[i], pick));
  }
  return palette;
}

}  // namespace

OkLab ToOkLab(const Rgba& c) { return LinearToOkLab(ToLinear(c.r), ToLinear(c.g), ToLinear(c.b)); }

double OkDistance(const OkLab& x, const OkLab& y) {
  return std::sqrt((x.l - y.l) * (x.l - y.l) + (x.a - y.a) * (x.a - y.a) +
                   (x.b - y.b) * (x.b - y.b));
}

Rgba SimulateCvd(const Rgba& c, Cvd kind) {
  // Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB.
  static const double kM[3][3][3] = {{{0.152286, 1.052583, -0.204868},
                                      {0.114503, 0.786281, 0.099216},
                                      {-0.003882, -0.048116, 1.051998}},
                                     {{0.367322, 0.860646, -0.227968},
                                      {0.280085, 0.672501, 0.047413},
                                      {-0.011820, 0.042940, 0.968881}},
                                     {{1.255528, -0.076749, -0.178779},
                                      {-0.078411, 0.930809, 0.147602},
                                      {0.004733, 0.691367, 0.303900}}};
  if (kind == Cvd::kNone) return c;
  const auto& m = kM[static_cast<int>(kind) - 1];
  const double in[3] = {ToLinear(c.r), ToLinear(c.g), ToLinear(c.b)};
  float out[3];
  for (int i = 0; i < 3; ++i) {
    out[i] = static_cast<float>(ToGamma(m[i][0] * in[0] + m[i][1] * in[1] + m[i][2] * in[2]));
  }
  return {out[0], out[1], out[2], c.a};
}

double CvdSafeDistance(const Rgba& x, const Rgba& y) {
  double d = INFINITY;
  for (Cvd k : {Cvd::kNone, Cvd::kProtan, Cvd::kDeutan, Cvd::kTritan}) {
    d = std::min(d, OkDistance(ToOkLab(SimulateCvd(x, k)), ToOkLab(SimulateCvd(y, k))));
  }
  return d;
}

Rgba PlotBackground() {
  // ImGui's dark style: FrameBg (0.16, 0.29, 0.48, 0.54) over WindowBg (0.06, 0.06, 0.06).
  auto over = [](float f, float w) { return f * 0.54f + w * 0.46f; };
  return {over(0.16f, 0.06f), over(0.29f, 0.06f), over(0.48f, 0.06f), 1};
}

Rgba CategoryColor(int index) {
  static const std::vector<Rgba> kPalette = BuildPalette();
  return kPalette[((index % kPaletteSize) + kPaletteSize) % kPaletteSize];
}

Rgba GroupColor(int rank, int count, bool ordered) {
  if (!ordered || count <= 1) return CategoryColor(rank);
  // Viridis from its middle up: its dark blue-violet half vanishes on the dark navy plot
  // background (a family drawn there was unreadable); lightness still grows with the value.
  return Viridis(kGradientStart + (1 - kGradientStart) * rank / std::max(1, count - 1));
}

}  // namespace moelab::gui
