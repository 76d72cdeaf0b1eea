#pragma once
// osprey's 1x1 convolution on channels-last float32 tensors with its activation applied in registers
// (pointwise_conv.cc): SiLU layers, where oneDNN's kernel leaves SiLU to a second pass over an output that may no
// longer be in the cache. dnnl_conv.cc decides when it replaces oneDNN's.
#include <memory>

#include "kernels/cpu/own_conv.h"

namespace osprey::cpu {

/// Whether this CPU and `g` suit the kernel: AVX-512 F; a 1x1 window, stride 1, no pads; 1-4096 input channels and at
/// least 16 output channels; an activation ActivatesInRegisters computes; non-empty shapes (a residual and an input
/// scale are taken).
bool PointwiseConvApplies(const OwnConvGeometry& g);

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, 1, 1]); nullptr when !PointwiseConvApplies(g).
std::unique_ptr<OwnConvKernel> CreatePointwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g);

}  // namespace osprey::cpu
