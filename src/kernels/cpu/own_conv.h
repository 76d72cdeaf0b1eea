#pragma once
// What osprey's own 2-D convolution kernels (winograd_conv.cc, stem_conv.cc, pointwise_conv.cc) are built from: the
// shapes and window of one float32 Conv node, filled once by dnnl_conv.cc (OwnConvGeometryOf), which chooses between
// them and oneDNN; and how they time themselves (BestRunMs).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/kernel.h"
#include "ops/activation.h"

namespace osprey::cpu {

struct OwnConvGeometry {
  int64_t batch = 0, in_c = 0, in_h = 0, in_w = 0;  // input [N, C, H, W] (logical; each kernel says its layout)
  int64_t out_c = 0, out_h = 0, out_w = 0;          // output [N, K, OH, OW]
  int64_t kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // other than 1 for the depthwise kernel only (depthwise_conv.h)
  bool bias = false;      // input 2, [K]
  bool residual = false;  // input 3 (the output's shape and layout), added before the activation
  bool input_scale = false;  // input 7, [N or 1, C, 1, 1]: the input times its channel's factor (conv_input_scale.h)
  bool input_affine = false;  // inputs 8 and 9, [C] each: the input times a plus b per channel (conv_input_scale.h)
  bool input_relu = false;    // with input_affine: then max(., 0)
  std::vector<int64_t> input_parts;  // not empty: the input's channels come from these parts (conv_input_scale.h)
  Activation activation;  // the node's fused activation
  // A fused MaxPool (ops/fused_pool.h; the first-layer kernel only) when pool_kh > 0: its window, strides and top/left
  // pads; output 0 is then [N, K, pooled_h, pooled_w] (out_h and out_w stay the convolution's).
  int64_t pool_kh = 0, pool_kw = 0, pool_sh = 1, pool_sw = 1, pool_top = 0, pool_left = 0, pooled_h = 0, pooled_w = 0;
};

/// One of osprey's convolution kernels: its run time, for choosing it against oneDNN's (PreferOwnKernel).
class OwnConvKernel : public Kernel {
 public:
  /// Milliseconds of one run on zero-filled tensors: the best of `runs` after one untimed.
  virtual double TimeMs(int runs) = 0;
};

/// Checks the tensors of one run of kernel `name` built for `g` (own_conv.cc): input 0 in `input_layout`, output 0
/// channels-last (pooled when `g` has a fused pool), the residual (input 3, when `g.residual`) channels-last, the bias
/// (input 2, when `g.bias`) of `g.out_c` values, the input scale (input 7, when `g.input_scale`) of `g.in_c` values per
/// image, the parts and the input affine (`g.input_parts`, `g.input_affine`) of their channels; throws kInternal naming
/// the node otherwise.
void CheckOwnConvTensors(const KernelContext& ctx, const char* name, const OwnConvGeometry& g, Layout input_layout);

/// Zero-filled tensors a kernel times itself on (TimeMs): input and output of `g`'s sizes (in any layout), the bias,
/// the residual when `g.residual`, and one image's input scale (ones) when `g.input_scale`.
struct OwnConvTimingBuffers {
  explicit OwnConvTimingBuffers(const OwnConvGeometry& g)
      : x(static_cast<size_t>(g.batch * g.in_c * g.in_h * g.in_w)),
        y(static_cast<size_t>(g.batch * g.out_c * g.out_h * g.out_w)),
        bias(static_cast<size_t>(g.out_c)),
        residual(g.residual ? y.size() : 0),
        scale(g.input_scale ? static_cast<size_t>(g.in_c) : 0, 1.f) {}
  std::vector<float> x, y, bias, residual, scale;
};

/// A run this long is run once, the untimed first one counting as the timing: another would not change the choice by
/// more than the noise, and a layer of a huge input (a hostile model asking for 85 million values, a segmentation model
/// at 4K) run 16-24 times made its first compile ~24x its run (docs/performance.md, "Forty-first session"). Every
/// tuning loop (osprey's kernels, oneDNN's implementations, the own-or-oneDNN verdict) stops there.
constexpr double kLongTimedRunMs = 50.0;

/// Milliseconds of `run()`: the best of `runs` after one untimed, `before()` untimed before each; once a run (the
/// untimed one too) takes kLongTimedRunMs, that one.
template <class Run, class Before = void (*)()>
double BestRunMs(
    int runs, Run&& run, Before&& before = [] {}) {
  double best = 1e30;
  for (int i = 0; i <= runs; ++i) {
    before();
    const auto start = std::chrono::steady_clock::now();
    run();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 || ms >= kLongTimedRunMs) best = std::min(best, ms);
    if (ms >= kLongTimedRunMs) break;
  }
  return best;
}

}  // namespace osprey::cpu
