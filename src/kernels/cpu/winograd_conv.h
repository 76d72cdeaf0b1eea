#pragma once
// osprey's own Winograd F(4x4, 3x3) convolution on channels-last float32 tensors (winograd_conv.cc): 3x3, stride 1,
// undilated, ungrouped, channel counts multiples of 16, AVX-512 or AVX2 with FMA. dnnl_conv.cc decides when it replaces
// oneDNN's direct convolution (by timing both on this machine).
#include <memory>

#include "kernels/cpu/own_conv.h"

namespace osprey::cpu {

/// Whether this CPU and `g` suit the kernel (AVX-512 F, or AVX2 and FMA; channel counts multiples of 16; non-empty
/// shapes).
bool WinogradConvApplies(const OwnConvGeometry& g);

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, 3, 3]), its transformed weights shared and
/// counted through ctx.derive_weight; nullptr when !WinogradConvApplies(g) or oneDNN has no fast batched matrix
/// multiplication for its middle step.
std::unique_ptr<OwnConvKernel> CreateWinogradConv(const KernelBuildContext& ctx, const OwnConvGeometry& g);

}  // namespace osprey::cpu
