#pragma once
// osprey's convolution for a network's first layer (stem_conv.cc): few input channels (1-4: an image), read straight
// from the plain NCHW input (or a channels-last one), written channels-last (NHWC) with bias and activation, and a
// fused MaxPool. dnnl_conv.cc decides when it replaces oneDNN's, which needs a plain input reordered to NHWC first and
// runs a 3-channel input at a fraction of its speed.
#include <memory>

#include "kernels/cpu/own_conv.h"

namespace osprey::cpu {

/// Whether this CPU and `g` suit the kernel: AVX-512 F or AVX2 + FMA; 1-4 input channels; 8-128 output channels;
/// windows up to 11 x 11, or one row up to 256 wide; non-empty shapes.
bool StemConvApplies(const OwnConvGeometry& g);

/// Whether the kernel also runs `g`'s fused MaxPool (pool_kh > 0): windows up to 11 x 11, pads smaller than the
/// window, every pooled output's window holding a convolution output.
bool StemConvPoolApplies(const OwnConvGeometry& g);

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, KH, KW]); nullptr when !StemConvApplies(g).
std::unique_ptr<OwnConvKernel> CreateStemConv(const KernelBuildContext& ctx, const OwnConvGeometry& g);

}  // namespace osprey::cpu
