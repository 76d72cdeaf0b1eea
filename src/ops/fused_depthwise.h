#pragma once
// A Conv carrying a fused depthwise convolution: a pointwise (1x1) Conv whose output only a 3x3 depthwise Conv reads
// (MobileNetV2/V3 and EfficientNet's expand -> depthwise pairs). runtime/fusion_depthwise.cc makes them one node for
// oneDNN's fused kernel, which computes the wide intermediate tensor a few rows at a time in cache instead of writing
// it to memory and reading it back. The fused node keeps op type Conv (docs/architecture.md):
//   inputs 0-2  X, W, B of the pointwise convolution (its attributes and `_activation` are the node's own);
//   input 3     absent (no residual);
//   input 4     the depthwise weights [M, 1, 3, 3] (M = the pointwise convolution's output channels);
//   input 5     the depthwise bias [M] (optional);
//   `_dw_strides` [s, s] marks the node as fused; `_dw_pads` [top, left, bottom, right] are the depthwise
//   convolution's pads (default 1 each; TensorFlow's "same" padding at stride 2 is [0, 0, 1, 1]); it has dilation 1
//   and group M, and its activation is `_dw_activation` / `_dw_alpha` / `_dw_beta` (as `_activation` / ...).
// Result = dw_activation(depthwise(activation(pointwise(X)))). The shape rule (ops/nn.cc), the reference kernel and
// the oneDNN kernel all read the node through the two parts below.
#include "osprey/graph.h"

namespace osprey {

inline constexpr int kDwWeightInput = 4;
inline constexpr int kDwBiasInput = 5;

/// Whether `conv` carries a fused depthwise convolution (`_dw_strides`).
bool HasFusedDepthwise(const Node& conv);

/// The pointwise convolution of a fused node: inputs 0-2, its attributes without the `_dw_*` ones.
Node FusedPointwisePart(const Node& fused);

/// The depthwise convolution of a fused node as a Conv of its own: inputs {input 0 (stands for the pointwise output),
/// input 4, input 5}, group `channels`, kernel 3x3, pads `_dw_pads`, strides `_dw_strides`, `_activation` from
/// `_dw_*`.
Node FusedDepthwisePart(const Node& fused, int64_t channels);

/// Makes `pointwise` (a Conv, possibly with `_activation`) the fused node of it and `depthwise` (a Conv whose input 0
/// is pointwise's output): `_dw_*` attributes (`depthwise_pads`: its resolved pads, auto_pad included), inputs 4 and
/// 5, depthwise's output. The caller checks the pattern.
Node FuseDepthwiseInto(const Node& pointwise, const Node& depthwise, const std::vector<int64_t>& depthwise_pads);

}  // namespace osprey
