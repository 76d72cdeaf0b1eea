#pragma once
// osprey's 1x1 convolution on channels-last float32 tensors with its activation applied in registers
// (pointwise_conv.cc): SiLU layers, where oneDNN's kernel leaves SiLU to a second pass over an output that may no
// longer be in the cache, and weight-heavy layers of any window (gathered first). dnnl_conv.cc decides when it
// replaces oneDNN's.
#include <memory>

#include "kernels/cpu/own_conv.h"

namespace osprey::cpu {

/// Whether this CPU and `g` suit the kernel: AVX-512 F; 1-4096 input channels and at least 16 output channels; an
/// activation ActivatesInRegisters computes; non-empty shapes; a residual; and either a 1x1 window, stride 1, no pads
/// (an input scale taken) or, for a PointwiseConvWeightHeavy layer, any undilated window up to 16 x 16 with any
/// stride and pads: each output pixel's window is gathered into a row first (im2col), rows no larger than the weights.
bool PointwiseConvApplies(const OwnConvGeometry& g);

/// Whether `g` has no more output pixels (all images) than output channels: its weights dominate the bytes it moves,
/// and streaming them once for all pixels (the kernel's order for such layers) beats oneDNN's kernels (ResNet-50's 7x7
/// layers at batch 1).
bool PointwiseConvWeightHeavy(const OwnConvGeometry& g);

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, 1, 1]); nullptr when !PointwiseConvApplies(g).
std::unique_ptr<OwnConvKernel> CreatePointwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g);

}  // namespace osprey::cpu
