// A 1x1, stride-1 convolution on channels-last (NHWC) float32 tensors with bias and activation: the product of the
// [pixels, C] input and the [C, K] weights. oneDNN's kernel computes it well but takes SiLU only as a slow post-op, so
// the plan applied SiLU in a second pass over the output (OwnSilu); for the expansion layers of an EfficientNet block
// that output no longer fits the cache (16 -> 96 channels on 112x112: 4.8 MB), and ONNX Runtime, which also runs
// SiLU as a pass, was faster there (docs/performance.md, "Thirty-sixth session").
//
// Here the pixels go in chunks of 24 and the output channels in groups of up to 4 vectors (64 channels), split evenly;
// the work is (chunk, group) pairs, split over the threads in contiguous ranges, so a chunk's input stays in the
// cache for all its groups. Per block of P pixels, P x V accumulators stay in registers over the input channels: per
// channel V weight vectors (packed [C][K] at build, zeros past the output channels) and one broadcast input value
// per pixel. Bias and the activation are applied in registers before the store (activation_avx512.h).
#include "kernels/cpu/pointwise_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/activation_avx512.h"
#include "kernels/cpu/dnnl_common.h"

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive, as in winograd_conv.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxInputChannels = 256;
constexpr int64_t kChunk = 24;  // pixels per work item: a multiple of every block size below

// Pixels per block for V vectors of output channels: 24 accumulators (12 for one vector).
template <int V>
constexpr int PixelsFor() {
  return V == 4 ? 6 : V == 3 ? 8 : 12;
}

class PointwiseConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Pointwise"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    vectors_ = (g.out_c + 15) / 16;
    padded_c_ = vectors_ * 16;
    const int64_t groups = (vectors_ + 3) / 4;
    group_vectors_ = (vectors_ + groups - 1) / groups;
    groups_ = (vectors_ + group_vectors_ - 1) / group_vectors_;
    last_mask_ = static_cast<__mmask16>(g.out_c % 16 == 0 ? 0xffff : (1u << (g.out_c % 16)) - 1);
    packed_.assign(static_cast<size_t>(g.in_c * padded_c_), 0.f);
    const float* src = ctx.input_values[1]->data<float>();
    for (int64_t k = 0; k < g.out_c; ++k)
      for (int64_t c = 0; c < g.in_c; ++c) packed_[static_cast<size_t>(c * padded_c_ + k)] = src[k * g.in_c + c];
  }

  void Run(KernelContext& ctx) override {
    const Shape x_shape{g_.batch, g_.in_c, g_.in_h, g_.in_w}, y_shape{g_.batch, g_.out_c, g_.out_h, g_.out_w};
    CheckActivation(ctx.node, Name(), "input", ctx.In(0), x_shape, Layout::kNhwc);
    CheckActivation(ctx.node, Name(), "output", ctx.Out(0), y_shape, Layout::kNhwc);
    if (g_.bias && ctx.In(2).numel() != g_.out_c)
      throw Error(ErrorCode::kInternal,
                  ctx.node.Describe() + ": " + Name() + " was built for " + std::to_string(g_.out_c) + " bias values");
    Execute(ctx.In(0).data<float>(), g_.bias ? ctx.In(2).data<float>() : nullptr, ctx.Out(0).data<float>());
  }

  double TimeMs(int runs) override {
    std::vector<float> x(static_cast<size_t>(g_.batch * g_.in_h * g_.in_w * g_.in_c));
    std::vector<float> y(static_cast<size_t>(g_.batch * g_.out_h * g_.out_w * g_.out_c));
    std::vector<float> bias(static_cast<size_t>(g_.out_c));
    return BestRunMs(runs, [&] { Execute(x.data(), bias.data(), y.data()); });
  }

 private:
  void Execute(const float* x, const float* bias, float* y) const {
    const int64_t pixels = g_.batch * g_.in_h * g_.in_w;
    const int64_t items = (pixels + kChunk - 1) / kChunk * groups_;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t p0 = item / groups_ * kChunk, p1 = std::min(pixels, p0 + kChunk);
      const int64_t v0 = item % groups_ * group_vectors_;
      switch (std::min(group_vectors_, vectors_ - v0)) {
        case 1:
          Chunk<1>(x, bias, y, p0, p1, v0);
          break;
        case 2:
          Chunk<2>(x, bias, y, p0, p1, v0);
          break;
        case 3:
          Chunk<3>(x, bias, y, p0, p1, v0);
          break;
        default:
          Chunk<4>(x, bias, y, p0, p1, v0);
          break;
      }
    }
  }

  // Pixels [p0, p1), output channel vectors [v0, v0 + V).
  template <int V>
  __attribute__((target("avx512f"))) void Chunk(const float* x, const float* bias, float* y, int64_t p0, int64_t p1,
                                                int64_t v0) const {
    constexpr int P = PixelsFor<V>();
    const __mmask16 last = v0 + V == vectors_ ? last_mask_ : static_cast<__mmask16>(0xffff);
    __m512 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      b[v] = bias ? _mm512_maskz_loadu_ps(v == V - 1 ? last : 0xffff, bias + (v0 + v) * 16) : _mm512_setzero_ps();
    const float* w = packed_.data() + v0 * 16;
    int64_t p = p0;
    for (; p + P <= p1; p += P) Block<V, P>(x + p * g_.in_c, w, b, y + p * g_.out_c + v0 * 16, last);
    for (; p < p1; ++p) Block<V, 1>(x + p * g_.in_c, w, b, y + p * g_.out_c + v0 * 16, last);
  }

  // P pixels from `in` (their input channels), V output vectors at `out`, the last one's lanes `last`.
  template <int V, int P>
  __attribute__((target("avx512f"))) void Block(const float* in, const float* w, const __m512* b, float* out,
                                                __mmask16 last) const {
    // Fully unrolled, so the accumulators stay in registers.
    __m512 acc[P][V];
#pragma GCC unroll 12
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[p][v] = b[v];
    const int64_t c = g_.in_c;
    for (int64_t k = 0; k < c; ++k, w += padded_c_) {
      __m512 wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + v * 16);
#pragma GCC unroll 12
      for (int p = 0; p < P; ++p) {
        const __m512 xv = _mm512_set1_ps(in[p * c + k]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
      }
    }
#pragma GCC unroll 12
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
      for (int v = 0; v < V - 1; ++v)
        _mm512_storeu_ps(out + p * g_.out_c + v * 16, ActivateVector(acc[p][v], g_.activation));
      _mm512_mask_storeu_ps(out + p * g_.out_c + (V - 1) * 16, last, ActivateVector(acc[p][V - 1], g_.activation));
    }
  }

  OwnConvGeometry g_;
  int threads_ = 1;
  int64_t vectors_ = 0;        // output channel vectors of 16
  int64_t padded_c_ = 0;       // vectors_ * 16
  int64_t group_vectors_ = 1;  // vectors per group (the last group may have fewer)
  int64_t groups_ = 1;
  __mmask16 last_mask_ = 0xffff;  // the lanes of the last vector that are output channels
  std::vector<float> packed_;     // [C][padded_c_], zeros past the output channels
};

}  // namespace

bool PointwiseConvApplies(const OwnConvGeometry& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && g.batch > 0 && g.in_c >= 1 && g.in_c <= kMaxInputChannels && g.out_c >= 16 && g.in_h > 0 &&
         g.in_w > 0 && g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 &&
         g.pad_left == 0 && g.out_h == g.in_h && g.out_w == g.in_w && !g.residual &&
         ActivatesInRegisters(g.activation.kind);
}

std::unique_ptr<OwnConvKernel> CreatePointwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
  if (!PointwiseConvApplies(g) || ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr ||
      ctx.input_values[1]->raw() == nullptr || ctx.input_values[1]->numel() != g.out_c * g.in_c)
    return nullptr;
  auto kernel = std::make_unique<PointwiseConv>();
  kernel->Build(ctx, g);
  return kernel;
}

}  // namespace osprey::cpu
