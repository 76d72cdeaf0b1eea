#include "ops/onnx_resize.h"

#include <algorithm>
#include <cmath>

#include "ops/op_registry.h"

namespace osprey {
namespace {

[[noreturn]] void Internal(const Node& node, const std::string& what) {
  throw Error(ErrorCode::kInternal, node.Describe() + ": " + what);
}

}  // namespace

ResizeParams GetResizeParams(const Node& node, int opset, const Shape& x_shape, const Tensor* input1,
                             const Tensor* input2, const Tensor* input3) {
  const int64_t rank = static_cast<int64_t>(x_shape.size());
  ResizeParams p;
  p.mode = node.GetString("mode", "nearest");
  p.legacy = node.op_type == "Upsample" || opset < 11;
  p.scales.assign(rank, 1.0);
  p.roi_start.assign(rank, 0.0);
  p.roi_end.assign(rank, 1.0);
  if (p.legacy) {
    p.coord = "asymmetric";
    std::vector<double> scales;
    if (node.op_type == "Upsample" && opset < 9) {
      for (float s : node.GetFloats("scales")) scales.push_back(s);
    } else {
      if (!input1) Internal(node, "scales are missing");
      const Tensor& t = *input1;
      for (int64_t i = 0; i < t.numel(); ++i) scales.push_back(t.GetAsDouble(i));
    }
    if (static_cast<int64_t>(scales.size()) != rank) Internal(node, "scales length differs from the rank");
    p.scales = scales;
    return p;
  }
  p.coord = node.GetString("coordinate_transformation_mode", "half_pixel");
  p.nearest_mode = node.GetString("nearest_mode", "round_prefer_floor");
  p.cubic_a = node.GetFloat("cubic_coeff_a", -0.75f);
  p.exclude_outside = node.GetInt("exclude_outside", 0) != 0;
  p.extrapolation = node.GetFloat("extrapolation_value", 0.f);
  std::vector<int64_t> axes;
  if (node.Has("axes")) {
    for (int64_t a : node.GetInts("axes")) axes.push_back(NormalizeAxis(a, rank, node));
  } else {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  size_t n = axes.size();
  if (input3 && input3->numel() > 0) {
    std::vector<int64_t> sizes = input3->ToInt64Vector();
    if (sizes.size() != n) Internal(node, "sizes length");
    std::string policy = node.GetString("keep_aspect_ratio_policy", "stretch");
    std::vector<double> s(n);
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<double>(sizes[i]) / static_cast<double>(x_shape[axes[i]]);
    if (policy == "not_larger" && n > 0) s.assign(n, *std::min_element(s.begin(), s.end()));
    if (policy == "not_smaller" && n > 0) s.assign(n, *std::max_element(s.begin(), s.end()));
    for (size_t i = 0; i < n; ++i) p.scales[axes[i]] = s[i];
  } else {
    if (!input2) Internal(node, "neither scales nor sizes are given");
    const Tensor& t = *input2;
    if (static_cast<size_t>(t.numel()) != n) Internal(node, "scales length");
    for (size_t i = 0; i < n; ++i) p.scales[axes[i]] = t.GetAsDouble(static_cast<int64_t>(i));
  }
  if (input1 && static_cast<size_t>(input1->numel()) == 2 * n) {
    for (size_t i = 0; i < n; ++i) {
      p.roi_start[axes[i]] = input1->GetAsDouble(static_cast<int64_t>(i));
      p.roi_end[axes[i]] = input1->GetAsDouble(static_cast<int64_t>(n + i));
    }
  }
  return p;
}

double OriginalCoordinate(const ResizeParams& p, int64_t d, double x, int64_t in, int64_t out_int, bool* outside) {
  double scale = p.scales[d];
  double in_f = static_cast<double>(in);
  double out_f = scale * in_f;  // ONNX's output_width: the unrounded output length
  const std::string& c = p.coord;
  if (c == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (c == "asymmetric") return x / scale;
  if (c == "align_corners") return out_f == 1 ? 0.0 : x * (in_f - 1) / (out_f - 1);
  if (c == "pytorch_half_pixel") return out_f == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (c == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (c == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(out_int) / out_f;
    double center = in_f / 2;
    return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
  }
  if (c == "tf_crop_and_resize") {
    double s = p.roi_start[d], e = p.roi_end[d];
    double xo = out_f == 1 ? (e - s) * (in_f - 1) / 2 : x * (e - s) * (in_f - 1) / (out_f - 1);
    xo += s * (in_f - 1);
    if (xo < 0 || xo > in_f - 1) *outside = true;
    return xo;
  }
  throw Error(ErrorCode::kInvalidArgument, "coordinate_transformation_mode '" + c + "' is not supported");
}

AxisTaps BuildTaps(const ResizeParams& p, int64_t d, int64_t in, int64_t out, int64_t stride) {
  AxisTaps t;
  t.count.assign(out, 0);
  t.offset.resize(out);
  t.weight.resize(out);
  t.outside.assign(out, 0);
  for (int64_t o = 0; o < out; ++o) {
    bool outside = false;
    double xo = OriginalCoordinate(p, d, static_cast<double>(o), in, out, &outside);
    t.outside[o] = outside;
    if (outside) continue;
    double fl = std::floor(xo);
    double ratio = xo - fl;
    int64_t base = static_cast<int64_t>(fl);
    std::array<int64_t, 4> idx{};
    std::array<double, 4> w{};
    int n = 0;
    if (p.mode == "nearest") {
      int64_t i;
      if (p.legacy) {
        i = p.scales[d] < 1 ? static_cast<int64_t>(std::ceil(xo)) : base;
      } else if (ratio == 0) {
        i = base;
      } else if (p.nearest_mode == "round_prefer_floor") {
        i = ratio <= 0.5 ? base : base + 1;
      } else if (p.nearest_mode == "round_prefer_ceil") {
        i = ratio < 0.5 ? base : base + 1;
      } else if (p.nearest_mode == "floor") {
        i = base;
      } else {
        i = base + 1;
      }
      idx[0] = i;
      w[0] = 1;
      n = 1;
    } else if (p.mode == "linear") {
      idx = {base, base + 1, 0, 0};
      w = {1 - ratio, ratio, 0, 0};
      n = 2;
    } else {  // cubic: taps base-1 .. base+2 at distances 1+r, r, 1-r, 2-r
      double a = p.cubic_a, r = ratio;
      auto outer_weight = [a](double s) { return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a; };  // 1 <= |s| < 2
      auto inner_weight = [a](double s) { return ((a + 2) * s - (a + 3)) * s * s + 1; };        // |s| <= 1
      idx = {base - 1, base, base + 1, base + 2};
      w = {outer_weight(r + 1), inner_weight(r), inner_weight(1 - r), outer_weight(2 - r)};
      n = 4;
      if (p.exclude_outside) {
        double sum = 0;
        for (int k = 0; k < 4; ++k) {
          if (idx[k] < 0 || idx[k] >= in) w[k] = 0;
          sum += w[k];
        }
        if (sum != 0)
          for (int k = 0; k < 4; ++k) w[k] /= sum;
      }
    }
    int kept = 0;
    for (int k = 0; k < n; ++k) {
      if (w[k] == 0 && n > 1) continue;
      t.offset[o][kept] = std::clamp<int64_t>(idx[k], 0, in - 1) * stride;
      t.weight[o][kept] = w[k];
      ++kept;
    }
    t.count[o] = kept;
  }
  return t;
}

}  // namespace osprey
