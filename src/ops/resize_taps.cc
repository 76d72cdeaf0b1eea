// The image resize taps (rules in resize_taps.h).
#include "ops/resize_taps.h"

#include <algorithm>
#include <cmath>

namespace osprey {

double CubicWeight(double x, double a) {
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

void ResizeTaps(const std::string& mode, bool antialias, bool area_shrinks, int64_t in, int64_t out, int64_t o,
                std::vector<ResizeTap>& taps) {
  taps.clear();
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  if (mode == "nearest") {
    taps.push_back({std::min<int64_t>(static_cast<int64_t>(std::floor((o + 0.5) * scale)), in - 1), 1.0});
  } else if (mode == "area" && area_shrinks) {
    const double lo = o * scale, hi = (o + 1) * scale;
    for (int64_t i = static_cast<int64_t>(std::floor(lo)); i < in && i < hi; ++i) {
      const double overlap = std::min<double>(hi, i + 1) - std::max<double>(lo, i);
      if (overlap > 1e-12) taps.push_back({i, overlap / scale});
    }
  } else if (mode == "area") {
    // OpenCV's exact arithmetic (position from the inverse of out / in), so ties break the same way.
    const double inv_scale = static_cast<double>(out) / static_cast<double>(in);
    const int64_t s = static_cast<int64_t>(std::floor(o * (1.0 / inv_scale)));
    double f = (o + 1) - (s + 1) * inv_scale;
    f = f <= 0 ? 0.0 : f - std::floor(f);
    if (s >= in - 1) {
      taps.push_back({in - 1, 1.0});
    } else {
      taps.push_back({s, 1.0 - f});
      taps.push_back({s + 1, f});
    }
  } else if (antialias) {
    const bool cubic = mode == "bicubic";
    const double filter_scale = std::max(scale, 1.0);
    const double support = (cubic ? 2.0 : 1.0) * filter_scale;
    const double center = (o + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    double sum = 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      const double x = std::fabs((i - center + 0.5) / filter_scale);
      const double w = cubic ? CubicWeight(x, -0.5) : (x < 1.0 ? 1.0 - x : 0.0);
      taps.push_back({i, w});
      sum += w;
    }
    if (sum != 0.0)
      for (ResizeTap& t : taps) t.weight /= sum;
  } else {
    const double f = (o + 0.5) * scale - 0.5;
    int64_t s = static_cast<int64_t>(std::floor(f));
    double t = f - s;
    if (mode == "bilinear") {
      if (s < 0) s = 0, t = 0.0;
      if (s >= in - 1) s = in - 1, t = 0.0;
      taps.push_back({s, 1.0 - t});
      taps.push_back({std::min(s + 1, in - 1), t});
    } else {
      for (int k = -1; k <= 2; ++k) taps.push_back({std::clamp<int64_t>(s + k, 0, in - 1), CubicWeight(t - k, -0.75)});
    }
  }
}

}  // namespace osprey
