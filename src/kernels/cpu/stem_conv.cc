// A network's first convolution: an image of 1-4 channels (plain NCHW, as the request brings it, or channels-last, as
// a TensorFlow export's transposed NHWC image is) into 8-128
// channels-last output channels, any window up to 11 x 11 and stride, bias and activation. oneDNN 3.2 has no fast
// kernel reading a plain source for a channels-last destination, so the plan reordered the image to NHWC first, and its
// direct kernel then ran the 3-channel product at ~75 GFLOP/s with a SiLU pass after: EfficientNet-B0's 3 -> 32 3x3
// stride-2 layer took 0.29 ms against ONNX Runtime's 0.21 (docs/performance.md, "Thirty-fifth session").
//
// Here each thread takes whole output rows, their output channels in blocks of up to 64 (SqueezeNet's 96: 64 + 32). Per
// block of P output pixels of a row, P x V accumulators (V vectors of 16 output channels) stay in registers over every
// tap (input channel, kernel row, kernel column): per tap, V weight vectors (packed [C][KH][KW][K] at build) and one
// broadcast input value per pixel, read from the input row (pixel, channel and row strides for either layout). Blocks
// whose window lies inside the row run without bounds checks; the few at the borders, and a row's last partial block,
// one pixel at a time with them. Bias and the activation are applied in registers (activation_avx512.h), Tanh and GELU
// over the row while it is in the cache. With a fused MaxPool (ops/fused_pool.h) the rows go to a small ring per thread
// instead and are pooled there (ExecutePooled): the wide convolution output (36 MB for SqueezeNet at batch 8) never
// goes to memory and back.
#include "kernels/cpu/stem_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/activation_avx512.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive, as in winograd_conv.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxWindow = 11;

class StemConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Stem"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    nhwc_input_ = ctx.InLayout(0) == Layout::kNhwc;
    // Input floats between horizontally adjacent pixels, between channels, and one row's floats.
    pixel_ = nhwc_input_ ? g.in_c : 1;
    channel_ = nhwc_input_ ? 1 : g.in_h * g.in_w;
    row_ = g.in_w * pixel_;
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    const Tensor& w = *ctx.input_values[1];
    const int64_t taps = g.in_c * g.kernel_h * g.kernel_w;
    padded_c_ = (g.out_c + 15) / 16 * 16;
    last_mask_ = static_cast<__mmask16>(g.out_c % 16 == 0 ? 0xffff : (1u << (g.out_c % 16)) - 1);
    packed_.assign(static_cast<size_t>(taps * padded_c_), 0.f);
    const float* src = w.data<float>();
    for (int64_t k = 0; k < g.out_c; ++k)
      for (int64_t t = 0; t < taps; ++t) packed_[static_cast<size_t>(t * padded_c_ + k)] = src[k * taps + t];
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), g_, nhwc_input_ ? Layout::kNhwc : Layout::kPlain);
    Execute(ctx.In(0).data<float>(), g_.bias ? ctx.In(2).data<float>() : nullptr, ctx.Out(0).data<float>());
  }

  double TimeMs(int runs) override {
    OwnConvTimingBuffers t(g_);
    return BestRunMs(runs, [&] { Execute(t.x.data(), t.bias.data(), t.y.data()); });
  }

 private:
  // Every output row on the thread team (or, with a fused pool, every pooled row: ExecutePooled).
  void Execute(const float* x, const float* bias, float* y) const {
    if (g_.pool_kh > 0) return ExecutePooled(x, bias, y);
    const int64_t rows = g_.batch * g_.out_h;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t row = 0; row < rows; ++row)
      ComputeRow(x, bias, row / g_.out_h, row % g_.out_h, y + row * g_.out_w * g_.out_c);
  }

  // With a fused MaxPool: each thread takes a contiguous band of pooled rows; per pooled row, the convolution rows of
  // its window are computed into a ring of pool_kh rows (a row two windows share, at stride < window, is computed
  // once), their maximum taken down the window, then across it, into the pooled row. The wide convolution output
  // never leaves the core's caches.
  void ExecutePooled(const float* x, const float* bias, float* y) const {
    const int64_t rows = g_.batch * g_.pooled_h, row_floats = g_.out_w * g_.out_c;
#pragma omp parallel num_threads(threads_)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::vector<float> ring(static_cast<size_t>(g_.pool_kh * row_floats)), down(static_cast<size_t>(row_floats));
      // The convolution row (n * out_h + oy) each slot of the ring holds.
      std::vector<int64_t> held(static_cast<size_t>(g_.pool_kh), -1);
      for (int64_t row = rows * t / nt; row < rows * (t + 1) / nt; ++row) {
        const int64_t n = row / g_.pooled_h, py = row % g_.pooled_h;
        const int64_t y0 = py * g_.pool_sh - g_.pool_top;
        const int64_t ya = std::max<int64_t>(0, y0), yb = std::min(g_.out_h, y0 + g_.pool_kh);
        for (int64_t oy = ya; oy < yb; ++oy) {
          const size_t slot = static_cast<size_t>(oy % g_.pool_kh);
          float* conv_row = ring.data() + slot * row_floats;
          if (held[slot] != n * g_.out_h + oy) {
            ComputeRow(x, bias, n, oy, conv_row);
            held[slot] = n * g_.out_h + oy;
          }
          if (oy == ya)
            std::copy(conv_row, conv_row + row_floats, down.data());
          else
            MaxInto(down.data(), conv_row, row_floats);
        }
        PoolAcross(down.data(), y + row * g_.pooled_w * g_.out_c);
      }
    }
  }

  // dst = max(dst, src), elementwise over n values.
  __attribute__((target("avx512f"))) static void MaxInto(float* dst, const float* src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_max_ps(_mm512_loadu_ps(dst + i), _mm512_loadu_ps(src + i)));
    for (; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  }

  // One pooled row from `down` (the window's maximum down the rows, out_w pixels of out_c channels): per pooled column
  // the maximum over the window's columns inside the row.
  __attribute__((target("avx512f"))) void PoolAcross(const float* down, float* out) const {
    const int64_t k = g_.out_c;
    for (int64_t px = 0; px < g_.pooled_w; ++px) {
      const int64_t x0 = px * g_.pool_sw - g_.pool_left;
      const int64_t xa = std::max<int64_t>(0, x0), xb = std::min(g_.out_w, x0 + g_.pool_kw);
      float* o = out + px * k;
      for (int64_t c = 0; c < k; c += 16) {
        const __mmask16 mask = static_cast<__mmask16>(k - c >= 16 ? 0xffff : (1u << (k - c)) - 1);
        __m512 m = _mm512_maskz_loadu_ps(mask, down + xa * k + c);
        for (int64_t ix = xa + 1; ix < xb; ++ix) m = _mm512_max_ps(m, _mm512_maskz_loadu_ps(mask, down + ix * k + c));
        _mm512_mask_storeu_ps(o + c, mask, m);
      }
    }
  }

  // Output row oy of image n into out_row (out_w pixels of out_c channels); per row, the output channels in blocks of
  // up to 64 (4 vectors), each block over the whole row while its input rows are in the cache.
  void ComputeRow(const float* x, const float* bias, int64_t n, int64_t oy, float* out_row) const {
    RowGeometry r;
    r.iy0 = oy * g_.stride_h - g_.pad_top;
    r.ky_begin = std::max<int64_t>(0, -r.iy0);
    r.ky_end = std::min(g_.kernel_h, g_.in_h - r.iy0);
    r.n = n;
    // Output columns whose whole window lies inside the row: [inside_begin, inside_end).
    r.inside_begin = std::min(g_.out_w, (g_.pad_left + g_.stride_w - 1) / g_.stride_w);
    const int64_t last = g_.in_w - g_.kernel_w + g_.pad_left;  // ox * stride <= last
    r.inside_end = last < 0 ? r.inside_begin : std::max(r.inside_begin, std::min(g_.out_w, last / g_.stride_w + 1));
    // The row's taps inside the image (rows ky_begin..ky_end of the window) as one list: their input offsets from
    // the image's column x0 of row 0 and their weights (one loop over taps, not three short nested ones).
    thread_local std::vector<int64_t> in_off, w_off;
    in_off.clear();
    w_off.clear();
    for (int64_t c = 0; c < g_.in_c; ++c)
      for (int64_t ky = r.ky_begin; ky < r.ky_end; ++ky)
        for (int64_t kx = 0; kx < g_.kernel_w; ++kx) {
          in_off.push_back(c * channel_ + (r.iy0 + ky) * row_ + kx * pixel_);
          w_off.push_back(((c * g_.kernel_h + ky) * g_.kernel_w + kx) * padded_c_);
        }
    r.in_off = in_off.data();
    r.w_off = w_off.data();
    r.taps = static_cast<int64_t>(in_off.size());
    for (int64_t k0 = 0; k0 < padded_c_; k0 += 64) {
      switch (std::min<int64_t>(4, (padded_c_ - k0) / 16)) {
        case 1:
          RowBlock<1, 24>(x, bias, r, k0, out_row);
          break;
        case 2:
          RowBlock<2, 12>(x, bias, r, k0, out_row);
          break;
        case 3:
          RowBlock<3, 8>(x, bias, r, k0, out_row);
          break;
        default:
          RowBlock<4, 6>(x, bias, r, k0, out_row);
      }
    }
    if (!ActivatesInRegisters(g_.activation.kind)) g_.activation.Apply(out_row, g_.out_w * g_.out_c);
  }

  // What the blocks of one output row share.
  struct RowGeometry {
    int64_t n, iy0, ky_begin, ky_end, inside_begin, inside_end, taps;
    const int64_t* in_off;
    const int64_t* w_off;
  };

  // Output channels [k0, k0 + 16 V) of one row, P pixels at a time.
  template <int V, int P>
  __attribute__((target("avx512f"))) void RowBlock(const float* x, const float* bias, const RowGeometry& r, int64_t k0,
                                                   float* out_row) const {
    const float* image = x + r.n * g_.in_c * g_.in_h * g_.in_w;
    const bool last_block = k0 + 16 * V == padded_c_;
    int64_t ox = 0;
    for (; ox < r.inside_begin; ++ox) Pixel<V>(x, bias, r, k0, last_block, ox, out_row);
    for (; ox + P <= r.inside_end; ox += P)
      Block<V, P>(image + (ox * g_.stride_w - g_.pad_left) * pixel_, r, k0, last_block, bias, ox, out_row);
    for (; ox < g_.out_w; ++ox) Pixel<V>(x, bias, r, k0, last_block, ox, out_row);
  }

  // Bias and the activation, where ActivatesInRegisters, then the store of the lanes in `mask` (the last vector of an
  // output channel count that is not a multiple of 16 has fewer).
  __attribute__((target("avx512f"), always_inline)) inline void Store(__m512 value, const float* bias, int64_t k,
                                                                      float* out, __mmask16 mask) const {
    if (bias) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, bias + k));
    _mm512_mask_storeu_ps(out, mask, ActivateVector(value, g_.activation));
  }

  // The lanes of vector v of a block: all, but for the last vector of the last block (a channel count that is not a
  // multiple of 16).
  template <int V>
  __mmask16 MaskOf(int v, bool last_block) const {
    return last_block && v == V - 1 ? last_mask_ : static_cast<__mmask16>(0xffff);
  }

  // P output pixels from column ox on, all inside the row: no bounds checks along W; output channels [k0, k0 + 16 V).
  // `in` is the image's column x0 of the first pixel's window (row 0, channel 0); the row's taps at r.in_off (input)
  // and r.w_off (packed weights).
  template <int V, int P>
  __attribute__((target("avx512f"))) void Block(const float* in, const RowGeometry& r, int64_t k0, bool last_block,
                                                const float* bias, int64_t ox, float* out_row) const {
    // Fully unrolled, so the accumulators stay in registers (a rolled loop kept them in memory).
    __m512 acc[P][V];
#pragma GCC unroll 24
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[p][v] = _mm512_setzero_ps();
    const int64_t sw = g_.stride_w * pixel_;
    const float* weights = packed_.data() + k0;
    for (int64_t t = 0; t < r.taps; ++t) {
      const float* tap = in + r.in_off[t];
      const float* w = weights + r.w_off[t];
      __m512 wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + v * 16);
#pragma GCC unroll 24
      for (int p = 0; p < P; ++p) {
        const __m512 xv = _mm512_set1_ps(tap[p * sw]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
      }
    }
#pragma GCC unroll 24
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        Store(acc[p][v], bias, k0 + v * 16, out_row + (ox + p) * g_.out_c + k0 + v * 16, MaskOf<V>(v, last_block));
  }

  // One output pixel, with bounds checks (the borders and a row's last columns); output channels [k0, k0 + 16 V).
  template <int V>
  __attribute__((target("avx512f"))) void Pixel(const float* x, const float* bias, const RowGeometry& r, int64_t k0,
                                                bool last_block, int64_t ox, float* out_row) const {
    const int64_t n = r.n, iy0 = r.iy0, ky_begin = r.ky_begin, ky_end = r.ky_end;
    __m512 acc[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[v] = _mm512_setzero_ps();
    const int64_t x0 = ox * g_.stride_w - g_.pad_left;
    const int64_t kx_begin = std::max<int64_t>(0, -x0), kx_end = std::min(g_.kernel_w, g_.in_w - x0);
    for (int64_t c = 0; c < g_.in_c; ++c)
      for (int64_t ky = ky_begin; ky < ky_end; ++ky) {
        const float* in = x + n * g_.in_c * g_.in_h * g_.in_w + c * channel_ + (iy0 + ky) * row_ + x0 * pixel_;
        const float* w = packed_.data() + ((c * g_.kernel_h + ky) * g_.kernel_w) * padded_c_ + k0;
        for (int64_t kx = kx_begin; kx < kx_end; ++kx) {
          const __m512 xv = _mm512_set1_ps(in[kx * pixel_]);
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v)
            acc[v] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + kx * padded_c_ + v * 16), acc[v]);
        }
      }
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      Store(acc[v], bias, k0 + v * 16, out_row + ox * g_.out_c + k0 + v * 16, MaskOf<V>(v, last_block));
  }

  OwnConvGeometry g_;
  bool nhwc_input_ = false;  // the image channels-last (a TensorFlow export's NHWC input) instead of plain NCHW
  int64_t pixel_ = 1, channel_ = 1, row_ = 1;  // input floats between adjacent pixels, channels, rows
  int threads_ = 1;
  int64_t padded_c_ = 0;          // output channels rounded up to whole vectors
  __mmask16 last_mask_ = 0xffff;  // the lanes of the last vector that are output channels
  std::vector<float> packed_;     // [C][KH][KW][padded_c_], zeros past the output channels
};

}  // namespace

bool StemConvApplies(const OwnConvGeometry& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && g.batch > 0 && g.in_c >= 1 && g.in_c <= 4 && g.in_h > 0 && g.in_w > 0 && g.out_c >= 8 &&
         g.out_c <= 128 && g.out_h > 0 && g.out_w > 0 && g.kernel_h >= 1 && g.kernel_h <= kMaxWindow &&
         g.kernel_w >= 1 && g.kernel_w <= kMaxWindow && g.stride_h >= 1 && g.stride_w >= 1 &&
         g.stride_h <= kMaxWindow && g.stride_w <= kMaxWindow && g.pad_top >= 0 && g.pad_left >= 0 &&
         g.pad_top < g.kernel_h && g.pad_left < g.kernel_w;
}

bool StemConvPoolApplies(const OwnConvGeometry& g) {
  if (g.pool_kh <= 0) return true;
  return g.pool_kh <= kMaxWindow && g.pool_kw >= 1 && g.pool_kw <= kMaxWindow && g.pool_sh >= 1 && g.pool_sw >= 1 &&
         g.pool_sh <= kMaxWindow && g.pool_sw <= kMaxWindow && g.pool_top >= 0 && g.pool_left >= 0 &&
         g.pool_top < g.pool_kh && g.pool_left < g.pool_kw && g.pooled_h > 0 && g.pooled_w > 0 &&
         (g.pooled_h - 1) * g.pool_sh - g.pool_top < g.out_h && (g.pooled_w - 1) * g.pool_sw - g.pool_left < g.out_w;
}

std::unique_ptr<OwnConvKernel> CreateStemConv(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
  if (!StemConvApplies(g) || !StemConvPoolApplies(g) || ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr ||
      ctx.input_values[1]->raw() == nullptr ||
      ctx.input_values[1]->numel() != g.out_c * g.in_c * g.kernel_h * g.kernel_w)
    return nullptr;
  auto kernel = std::make_unique<StemConv>();
  kernel->Build(ctx, g);
  return kernel;
}

}  // namespace osprey::cpu
