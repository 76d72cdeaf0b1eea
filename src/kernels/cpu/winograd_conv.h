#pragma once
// osprey's own Winograd F(4x4, 3x3) convolution on channels-last float32 tensors (winograd_conv.cc): 3x3, stride 1,
// undilated, ungrouped, channel counts multiples of 16, AVX-512. dnnl_conv.cc decides when it replaces oneDNN's
// direct convolution (by timing both on this machine).
#include <cstdint>
#include <memory>

#include "kernels/kernel.h"
#include "ops/activation.h"

namespace osprey::cpu {

struct WinogradConvGeometry {
  int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;  // input [N, H, W, C] (NHWC)
  int64_t out_h = 0, out_w = 0, out_c = 0;          // output [N, OH, OW, K]; OH = H + pad_top + pad_bottom - 2
  int64_t pad_top = 0, pad_left = 0;
  bool bias = false;      // input 2, [K]
  bool residual = false;  // input 3 (NHWC, the output's shape), added before the activation
  Activation activation;
};

/// Whether this CPU and `g` suit the kernel (AVX-512 F; channel counts multiples of 16; non-empty shapes).
bool WinogradConvApplies(const WinogradConvGeometry& g);

class WinogradConvKernel : public Kernel {
 public:
  /// Milliseconds of one run on zero-filled tensors: the best of `runs` after one untimed (for choosing kernels).
  virtual double TimeMs(int runs) = 0;
};

/// The kernel for node `ctx.node` (weights: constant input 1, [K, C, 3, 3]), its transformed weights shared and
/// counted through ctx.derive_weight; nullptr when !WinogradConvApplies(g) or oneDNN has no fast batched matrix
/// multiplication for its middle step.
std::unique_ptr<WinogradConvKernel> CreateWinogradConv(const KernelBuildContext& ctx, const WinogradConvGeometry& g);

}  // namespace osprey::cpu
