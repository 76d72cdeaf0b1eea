#pragma once
// ONNX Resize / Upsample, in one place: the parameters (mode, coordinate transformation, nearest rounding, cubic
// coefficient, scales from `scales` or `sizes`, roi) and, per axis, each output index's source taps computed with
// ONNX's reference formulas (onnx/reference/ops/op_resize.py). The reference kernel (kernels/reference/shape.cc)
// takes the tensor product of the axes' taps; the fast CPU kernel (kernels/cpu/resize_kernel.cc) the same taps per
// axis. (The osprey-domain ResizeImage follows Pillow and OpenCV instead: ops/resize_taps.h.)
#include <array>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

struct ResizeParams {
  bool legacy = false;  // Upsample and Resize-10: asymmetric coordinates, ORT's "simple" nearest rounding
  std::string mode, coord, nearest_mode;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  float extrapolation = 0.f;
  std::vector<double> scales, roi_start, roi_end;
};

/// The taps of one axis: per output index, up to four (element offset = source index * stride, weight) pairs.
struct AxisTaps {
  std::vector<int> count;
  std::vector<std::array<int64_t, 4>> offset;  // element offsets (index * stride)
  std::vector<std::array<double, 4>> weight;
  std::vector<char> outside;  // tf_crop_and_resize: coordinate outside the input -> extrapolation_value
};

/// The parameters of Resize/Upsample node `node` on an input of shape `x_shape`. `input1..3` are the node's inputs
/// 1..3 where present (null otherwise): for Upsample and Resize-10 input 1 is `scales`; from opset 11 they are roi,
/// scales and sizes.
ResizeParams GetResizeParams(const Node& node, int opset, const Shape& x_shape, const Tensor* input1,
                             const Tensor* input2, const Tensor* input3);

/// Source coordinate of output coordinate `x` along axis `d` (ONNX's coordinate_transformation_mode); sets *outside
/// for tf_crop_and_resize coordinates outside the input.
double OriginalCoordinate(const ResizeParams& p, int64_t d, double x, int64_t in, int64_t out_int, bool* outside);

/// The taps of axis `d`, resized from `in` to `out` elements, with element stride `stride`.
AxisTaps BuildTaps(const ResizeParams& p, int64_t d, int64_t in, int64_t out, int64_t stride);

}  // namespace osprey
