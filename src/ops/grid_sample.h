#pragma once
// GridSample's one tap builder: where a grid point reads the image and with what weights, as ONNX Runtime and
// PyTorch compute it. Used by the reference kernel and the CPU kernel (which shares each point's taps across the
// channels; LinearZerosTaps, inline, for the common modes).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "osprey/graph.h"

namespace osprey {

struct GridSampleParams {
  enum Mode { kNearest, kLinear, kCubic } mode = kLinear;
  enum Padding { kZeros, kBorder, kReflection } padding = kZeros;
  bool align_corners = false;
  int64_t height = 0, width = 0;  // of the sampled image
};

/// The node's attributes (mode "bilinear"/"linear", "nearest", "bicubic"/"cubic"; the schema checked them).
GridSampleParams ReadGridSample(const Node& node, int64_t height, int64_t width);

constexpr int kMaxGridTaps = 16;

/// The taps of grid point (gx, gy) (x along the width, in [-1, 1] for the image): row-major offsets into one
/// [height, width] plane and their weights; taps that read padding zeros are left out. Returns how many, or -1 when
/// the point is NaN (its output is NaN).
int GridTaps(const GridSampleParams& p, float gx, float gy, int64_t offset[kMaxGridTaps], float weight[kMaxGridTaps]);

/// GridTaps for mode linear with zeros padding (PyTorch's defaults), inline for the CPU kernel's loop over points;
/// GridTaps returns this for those modes.
inline int LinearZerosTaps(const GridSampleParams& p, float gx, float gy, int64_t offset[4], float weight[4]) {
  if (std::isnan(gx) || std::isnan(gy)) return -1;
  auto coordinate = [&](float g, int64_t size) {  // clamped so huge values convert to integers safely
    const double v = p.align_corners ? (g + 1.0) / 2 * (size - 1) : ((g + 1.0) * size - 1) / 2;
    return std::clamp(v, -4.0 - size, 4.0 + 2 * size);
  };
  const double fx = coordinate(gx, p.width), fy = coordinate(gy, p.height);
  const double x0 = std::floor(fx), y0 = std::floor(fy);
  const double wx[2] = {1 - (fx - x0), fx - x0}, wy[2] = {1 - (fy - y0), fy - y0};
  const int64_t c0 = static_cast<int64_t>(x0), r0 = static_cast<int64_t>(y0);
  int n = 0;
  for (int j = 0; j < 2; ++j) {
    const int64_t r = r0 + j;
    if (r < 0 || r >= p.height) continue;
    for (int i = 0; i < 2; ++i) {
      const int64_t c = c0 + i;
      if (c < 0 || c >= p.width) continue;
      offset[n] = r * p.width + c;
      weight[n++] = static_cast<float>(wy[j] * wx[i]);
    }
  }
  return n;
}

}  // namespace osprey
