// GridSample's schema (2-D: X [N, C, H, W], grid [N, Ho, Wo, 2] -> [N, C, Ho, Wo]) and its tap builder
// (grid_sample.h).
//
// Coordinates: grid values denormalised per align_corners (to [0, size - 1] or [-0.5, size - 0.5]); nearest rounds
// half to even; a coordinate outside those bounds is clamped (border; not for cubic) or reflected (reflection)
// first; then each tap outside the image reads 0 (zeros), the nearest edge (border) or its reflection. Linear takes
// 2 x 2 taps, cubic 4 x 4 (Keys, a = -0.75). ONNX Runtime and PyTorch agree on all of it; the ONNX reference also
// clamps cubic's coordinate under border padding, which its own tests do not tell apart.
#include "ops/grid_sample.h"

#include <algorithm>
#include <cmath>

#include "ops/op_registry.h"

namespace osprey {
namespace {

double Reflect(double v, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (v >= lo && v <= hi) return v;
  // Distance past the near border, folded by the period 2 * range (fmod: no integer overflow for huge values).
  const double d = std::fmod(v < lo ? lo - v : v - hi, 2 * range);
  const bool back = d > range;  // an odd number of reflections
  const double r = back ? d - range : d;
  return (v < lo) != back ? lo + r : hi - r;
}

void CubicWeights(double t, double w[4]) {
  constexpr double a = -0.75;
  const double x0 = t + 1, x1 = t, x2 = 1 - t, x3 = 2 - t;
  w[0] = ((a * x0 - 5 * a) * x0 + 8 * a) * x0 - 4 * a;
  w[1] = ((a + 2) * x1 - (a + 3)) * x1 * x1 + 1;
  w[2] = ((a + 2) * x2 - (a + 3)) * x2 * x2 + 1;
  w[3] = ((a * x3 - 5 * a) * x3 + 8 * a) * x3 - 4 * a;
}

// One axis of `size`: the coordinate of grid value g, and the index a tap at i reads (-1: a padding zero).
struct Axis {
  const GridSampleParams& p;
  int64_t size;
  double lo() const { return p.align_corners ? 0.0 : -0.5; }
  double hi() const { return p.align_corners ? size - 1.0 : size - 0.5; }
  double Coordinate(float g) const {
    double v = p.align_corners ? (g + 1.0) / 2 * (size - 1) : ((g + 1.0) * size - 1) / 2;
    if (p.mode == GridSampleParams::kNearest) v = std::nearbyint(v);
    if (v < lo() || v > hi()) {
      if (p.padding == GridSampleParams::kBorder && p.mode != GridSampleParams::kCubic)
        v = std::clamp(v, 0.0, static_cast<double>(size - 1));
      if (p.padding == GridSampleParams::kReflection) v = Reflect(v, lo(), hi());
    }
    // Past a few pixels outside the image every tap is padding: clamp so huge values convert to integers safely.
    return std::clamp(v, -4.0 - size, 4.0 + 2 * size);
  }
  int64_t Tap(int64_t i) const {
    if (i >= 0 && i < size) return i;
    if (p.padding == GridSampleParams::kZeros) return -1;
    if (p.padding == GridSampleParams::kBorder) return std::clamp<int64_t>(i, 0, size - 1);
    return std::clamp<int64_t>(static_cast<int64_t>(Reflect(static_cast<double>(i), lo(), hi())), 0, size - 1);
  }
};

void InferGridSample(InferContext& ctx) {
  if (!ctx.Has(0) || !ctx.Has(1)) ctx.Fail("inputs 'X' and 'grid' are required");
  const Shape& x = ctx.input_shapes[0];
  const Shape& grid = ctx.input_shapes[1];
  if (ctx.input_dtypes[0] != DType::kF32 || ctx.input_dtypes[1] != DType::kF32)
    ctx.Fail("X and grid must be float32, got " + std::string(DTypeName(ctx.input_dtypes[0])) + " and " +
             DTypeName(ctx.input_dtypes[1]));
  if (x.size() != 4) ctx.Fail("X must be 4-D [N, C, H, W] (osprey samples 2-D images only), got " + ShapeToString(x));
  if (grid.size() != 4 || grid[0] != x[0] || grid[3] != 2)
    ctx.Fail("grid must be [N, H_out, W_out, 2] with X's N, got " + ShapeToString(grid) + " for X " + ShapeToString(x));
  const std::string mode = ctx.node.GetString("mode", "bilinear");
  if (mode != "bilinear" && mode != "linear" && mode != "nearest" && mode != "bicubic" && mode != "cubic")
    ctx.Fail("mode must be bilinear/linear, nearest or bicubic/cubic, got \"" + mode + "\"");
  const std::string padding = ctx.node.GetString("padding_mode", "zeros");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    ctx.Fail("padding_mode must be zeros, border or reflection, got \"" + padding + "\"");
  const Shape out = {x[0], x[1], grid[1], grid[2]};
  (void)NumElements(out);
  ctx.SetOutput(0, DType::kF32, out);
}

// AffineGrid (opset 20): theta [N, 2, 3] with size [N, C, H, W] gives the sampling grid [N, H, W, 2] for GridSample
// (3-D: [N, 3, 4], [N, C, D, H, W] -> [N, D, H, W, 3]); size must be known at compile time (it sets the shape).
void InferAffineGrid(InferContext& ctx) {
  if (!ctx.Has(0) || !ctx.Has(1)) ctx.Fail("inputs 'theta' and 'size' are required");
  if (ctx.input_dtypes[0] != DType::kF32)
    ctx.Fail("theta must be float32, got " + std::string(DTypeName(ctx.input_dtypes[0])));
  if (ctx.input_dtypes[1] != DType::kI64)
    ctx.Fail("size must be int64, got " + std::string(DTypeName(ctx.input_dtypes[1])));
  const std::vector<int64_t> size = ctx.Value(1).ToInt64Vector();  // known at compile time: it sets the shape
  const Shape& theta = ctx.input_shapes[0];
  if (size.size() != 4 && size.size() != 5)
    ctx.Fail("size must be [N, C, H, W] or [N, C, D, H, W], got " + ShapeToString(size));
  const int64_t dims = static_cast<int64_t>(size.size()) - 2;
  if (theta.size() != 3 || theta[1] != dims || theta[2] != dims + 1 || theta[0] != size[0])
    ctx.Fail("theta must be [N, " + std::to_string(dims) + ", " + std::to_string(dims + 1) + "] with size's N, got " +
             ShapeToString(theta) + " for size " + ShapeToString(size));
  for (int64_t s : size)
    if (s < 1) ctx.Fail("size must be positive, got " + ShapeToString(size));
  ctx.node.GetInt("align_corners", 0);
  Shape out = {size[0]};
  for (int64_t d = 2; d < static_cast<int64_t>(size.size()); ++d) out.push_back(size[d]);
  out.push_back(dims);
  (void)NumElements(out);
  ctx.SetOutput(0, DType::kF32, out);
}

}  // namespace

GridSampleParams ReadGridSample(const Node& node, int64_t height, int64_t width) {
  GridSampleParams p;
  const std::string mode = node.GetString("mode", "bilinear");
  p.mode = mode == "nearest"                      ? GridSampleParams::kNearest
           : mode == "bicubic" || mode == "cubic" ? GridSampleParams::kCubic
                                                  : GridSampleParams::kLinear;
  const std::string padding = node.GetString("padding_mode", "zeros");
  p.padding = padding == "border"       ? GridSampleParams::kBorder
              : padding == "reflection" ? GridSampleParams::kReflection
                                        : GridSampleParams::kZeros;
  p.align_corners = node.GetInt("align_corners", 0) != 0;
  p.height = height;
  p.width = width;
  return p;
}

int GridTaps(const GridSampleParams& p, float gx, float gy, int64_t offset[kMaxGridTaps], float weight[kMaxGridTaps]) {
  if (p.mode == GridSampleParams::kLinear && p.padding == GridSampleParams::kZeros)
    return LinearZerosTaps(p, gx, gy, offset, weight);
  if (std::isnan(gx) || std::isnan(gy)) return -1;
  const Axis ax{p, p.width}, ay{p, p.height};
  const double fx = ax.Coordinate(gx), fy = ay.Coordinate(gy);
  int n = 0;
  if (p.mode == GridSampleParams::kNearest) {
    const int64_t r = ay.Tap(static_cast<int64_t>(fy)), c = ax.Tap(static_cast<int64_t>(fx));
    if (r >= 0 && c >= 0) offset[n] = r * p.width + c, weight[n++] = 1.f;
    return n;
  }
  const int taps = p.mode == GridSampleParams::kLinear ? 2 : 4;
  const double x0 = std::floor(fx), y0 = std::floor(fy);
  double wx[4], wy[4];
  if (taps == 2) {
    wx[0] = 1 - (fx - x0), wx[1] = fx - x0, wy[0] = 1 - (fy - y0), wy[1] = fy - y0;
  } else {
    CubicWeights(fx - x0, wx);
    CubicWeights(fy - y0, wy);
  }
  const int64_t first_x = static_cast<int64_t>(x0) - (taps == 4), first_y = static_cast<int64_t>(y0) - (taps == 4);
  for (int j = 0; j < taps; ++j) {
    const int64_t r = ay.Tap(first_y + j);
    if (r < 0) continue;
    for (int i = 0; i < taps; ++i) {
      const int64_t c = ax.Tap(first_x + i);
      if (c < 0) continue;
      offset[n] = r * p.width + c;
      weight[n++] = static_cast<float>(wy[j] * wx[i]);
    }
  }
  return n;
}

void RegisterGridSampleOps(OpRegistry& r) {
  r.Add(OpSchema{"GridSample", 2, 2, 1, 1, InferGridSample, {}});
  r.Add(OpSchema{"AffineGrid", 2, 2, 1, 1, InferAffineGrid, {}});
}

}  // namespace osprey
