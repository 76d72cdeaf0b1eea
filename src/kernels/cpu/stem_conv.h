#pragma once
// osprey's convolution for a network's first layer (stem_conv.cc): few input channels (1-4: an image), read straight
// from the plain NCHW input, written channels-last (NHWC) with bias and activation. dnnl_conv.cc decides when it
// replaces oneDNN's, which needs the input reordered to NHWC first and runs a 3-channel input at a fraction of its
// speed.
#include <cstdint>
#include <memory>

#include "kernels/kernel.h"
#include "ops/activation.h"

namespace osprey::cpu {

struct StemConvGeometry {
  int64_t batch = 0, in_c = 0, in_h = 0, in_w = 0;  // input [N, C, H, W] (plain)
  int64_t out_c = 0, out_h = 0, out_w = 0;          // output [N, OH, OW, K] (NHWC)
  int64_t kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;
  bool bias = false;  // input 2, [K]
  Activation activation;
};

/// Whether this CPU and `g` suit the kernel: AVX-512 F; 1-4 input channels; 8-64 output channels; windows up to
/// 11 x 11; non-empty shapes.
bool StemConvApplies(const StemConvGeometry& g);

class StemConvKernel : public Kernel {
 public:
  /// Milliseconds of one run on zero-filled tensors: the best of `runs` after one untimed (for choosing kernels).
  virtual double TimeMs(int runs) = 0;
};

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, KH, KW]); nullptr when !StemConvApplies(g).
std::unique_ptr<StemConvKernel> CreateStemConv(const KernelBuildContext& ctx, const StemConvGeometry& g);

}  // namespace osprey::cpu
