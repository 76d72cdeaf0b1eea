#pragma once
// DeformConv (opset 19, 2-D): a convolution whose every kernel tap samples the input at its regular place plus a
// learned offset (bilinear, zeros outside), optionally scaled by a mask (DCNv2). Resolved from the node and input
// shapes; shared by the schema (deform_conv.cc) and the kernel (kernels/reference/deform_conv.cc).
#include "osprey/graph.h"

namespace osprey {

struct DeformConvParams {
  int64_t n = 0, in_c = 0, in_h = 0, in_w = 0, out_c = 0, out_h = 0, out_w = 0;
  int64_t kh = 0, kw = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, pad_top = 0, pad_left = 0;
  int64_t group = 1, offset_group = 1;
  bool bias = false, mask = false;
};

/// Shapes of X, W, offset and (present or null) B and mask; throws kInvalidArgument naming the node.
DeformConvParams ResolveDeformConv(const Node& node, const Shape& x, const Shape& w, const Shape& offset,
                                   const Shape* bias, const Shape* mask);

}  // namespace osprey
