#pragma once
// A Conv carrying a fused MaxPool: a network's first convolution (an image of 1-4 channels) whose output only a 2-D
// MaxPool reads (ResNet, DenseNet, GoogLeNet, ShuffleNet, SqueezeNet: 7x7 or 3x3 stride 2, then a 3x3 stride-2 pool).
// runtime/fusion.cc FuseConvMaxPool makes them one node for osprey's first-layer kernel (kernels/cpu/stem_conv.cc),
// which pools the convolution's rows while they are in the cache instead of writing the wide output to memory and
// reading it back. The fused node keeps op type Conv, its inputs, attributes and activation; the pool is:
//   `_pool_kernel` [kh, kw] marks the node as fused; `_pool_strides` [sh, sw]; `_pool_pads` [top, left, bottom,
//   right] (resolved: auto_pad applied); `_pool_ceil` 0 or 1 (ceil_mode); dilation 1, no Indices output.
// Result = MaxPool(activation(Conv(X))). The shape rule (ops/nn.cc), the reference kernel and the CPU kernel all read
// the node through the two parts below.
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// Whether `conv` carries a fused MaxPool (`_pool_kernel`).
bool HasFusedPool(const Node& conv);

/// Whether `conv` carries a fused part a pool cannot follow (a residual, a depthwise convolution, a PRelu, int8
/// rounding, an input scale, affine or parts): the shape rule refuses a pool beside one, and the fusion makes none.
bool CarriesAnotherFusedPart(const Node& conv);

/// The convolution's output shape [N, K, OH, OW] of a fused node with input `x` and weights `w` (before the pool).
Shape FusedConvOutputShape(const Node& fused, const Shape& x, const Shape& w);

/// The convolution of a fused node: the node without the `_pool_*` attributes.
Node FusedConvPart(const Node& fused);

/// The MaxPool of a fused node as a MaxPool node of its own: input 0 (stands for the convolution's output), output 0,
/// kernel_shape, strides, pads and ceil_mode from the `_pool_*` attributes.
Node FusedPoolPart(const Node& fused);

/// Makes `conv` the fused node of it and `pool` (a MaxPool of dilation 1 and one output, whose input 0 is conv's
/// output): `_pool_*` attributes (`pool_pads`: its resolved pads, auto_pad included), pool's output. The caller checks
/// the pattern.
Node FusePoolInto(const Node& conv, const Node& pool, const std::vector<int64_t>& pool_pads);

}  // namespace osprey
