#pragma once
// GridSample's one tap builder: where a grid point reads the image and with what weights, as ONNX Runtime and
// PyTorch compute it. Used by the reference kernel and the CPU kernel (which shares each point's taps across the
// channels).
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

}  // namespace osprey
