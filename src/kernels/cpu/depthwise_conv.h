#pragma once
// osprey's depthwise convolution (depthwise_conv.cc): one filter per channel (group = input channels = output
// channels), channels-last input and output, any window, stride and dilation, bias and activation. dnnl_conv.cc takes
// it where oneDNN has no depthwise kernel for the layer and would run it as im2col + GEMM per channel: a Keras
// SeparableConv1D of dilation 8 (128 channels, 1000 steps, batch 8) took 7 ms there, where dilations 1-4 took 0.1-0.4
// on oneDNN's jit_dw (whose left pad may not exceed its block of outputs).
#include <memory>

#include "kernels/cpu/own_conv.h"

namespace osprey::cpu {

/// Whether this CPU and `g` suit the kernel: AVX-512 F or AVX2 + FMA; g.in_c == g.out_c (the caller checks the
/// group); non-empty shapes; positive strides and dilations; pads smaller than the dilated window; no fused pool,
/// residual or input parts, scale or affine.
bool DepthwiseConvApplies(const OwnConvGeometry& g);

/// The kernel for node `ctx.node` (weights: constant input 1, [C, 1, KH, KW]); nullptr when !DepthwiseConvApplies(g).
std::unique_ptr<OwnConvKernel> CreateDepthwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g);

}  // namespace osprey::cpu
