// A depthwise convolution on channels-last tensors (depthwise_conv.h): each output pixel's channels as vectors, its
// taps (those inside the image: borders need no padding copy) summed in registers, the weights packed [KH][KW][C]
// (C rounded up to whole vectors, zeros after) so that one tap's weights for a vector of channels are one load. The
// work is shared out as pieces of output rows (a 1-D signal is one long row per image). Memory-bound like oneDNN's
// jit_dw: it reads each input pixel once per tap, from the cache. The loops are written once
// (depthwise_conv_rows.inc) and compiled for AVX-512 and for AVX2 + FMA.
#include "kernels/cpu/depthwise_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/activation_avx512.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/simd_lanes.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's masked AVX-512 intrinsics (as in stem_conv.cc)

namespace osprey::cpu {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using namespace simd::avx512;
#include "kernels/cpu/depthwise_conv_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using namespace simd::avx2;
#include "kernels/cpu/depthwise_conv_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

constexpr int64_t kPiecePixels = 64;  // output pixels per piece of work at most

class DepthwiseConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Depthwise"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    avx512_ = __builtin_cpu_supports("avx512f");
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    const int64_t lanes = avx512_ ? 16 : 8, taps = g.kernel_h * g.kernel_w;
    padded_c_ = (g.in_c + lanes - 1) / lanes * lanes;
    packed_.assign(static_cast<size_t>(taps * padded_c_), 0.f);
    const float* w = ctx.input_values[1]->data<float>();  // [C, 1, KH, KW]
    for (int64_t c = 0; c < g.in_c; ++c)
      for (int64_t t = 0; t < taps; ++t) packed_[static_cast<size_t>(t * padded_c_ + c)] = w[c * taps + t];
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), g_, Layout::kNhwc);
    Execute(ctx.In(0).data<float>(), g_.bias ? ctx.In(2).data<float>() : nullptr, ctx.Out(0).data<float>());
  }

  double TimeMs(int runs) override {
    OwnConvTimingBuffers t(g_);
    return BestRunMs(runs, [&] { Execute(t.x.data(), t.bias.data(), t.y.data()); });
  }

 private:
  void Execute(const float* x, const float* b, float* y) const {
    const int64_t pieces_per_row = (g_.out_w + kPiecePixels - 1) / kPiecePixels;
    const int64_t pieces = g_.batch * g_.out_h * pieces_per_row;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t row = p / pieces_per_row, ox0 = p % pieces_per_row * kPiecePixels;
      const int64_t n = row / g_.out_h, oy = row % g_.out_h, ox1 = std::min(g_.out_w, ox0 + kPiecePixels);
      if (avx512_)
        avx512::DepthwisePixels(g_, packed_.data(), padded_c_, x, b, n, oy, ox0, ox1, y);
      else
        avx2::DepthwisePixels(g_, packed_.data(), padded_c_, x, b, n, oy, ox0, ox1, y);
      if (!ActivatesInRegisters(g_.activation.kind))
        g_.activation.Apply(y + ((n * g_.out_h + oy) * g_.out_w + ox0) * g_.out_c, (ox1 - ox0) * g_.out_c);
    }
  }

  OwnConvGeometry g_;
  bool avx512_ = false;  // else AVX2 + FMA
  int threads_ = 1;
  int64_t padded_c_ = 0;
  std::vector<float> packed_;  // [KH][KW][padded_c_]
};

}  // namespace

bool DepthwiseConvApplies(const OwnConvGeometry& g) {
  static const bool simd =
      __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return simd && g.batch > 0 && g.in_c > 0 && g.in_c == g.out_c && g.in_h > 0 && g.in_w > 0 && g.out_h > 0 &&
         g.out_w > 0 && g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 && g.dilation_h > 0 &&
         g.dilation_w > 0 && g.pad_top >= 0 && g.pad_left >= 0 && g.pad_top < (g.kernel_h - 1) * g.dilation_h + 1 &&
         g.pad_left < (g.kernel_w - 1) * g.dilation_w + 1 && g.pool_kh == 0 && !g.residual && !g.input_scale &&
         !g.input_affine && g.input_parts.empty();
}

std::unique_ptr<OwnConvKernel> CreateDepthwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
  if (!DepthwiseConvApplies(g) || ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr ||
      ctx.input_values[1]->raw() == nullptr || ctx.input_values[1]->numel() != g.in_c * g.kernel_h * g.kernel_w)
    return nullptr;
  auto kernel = std::make_unique<DepthwiseConv>();
  kernel->Build(ctx, g);
  return kernel;
}

}  // namespace osprey::cpu
