// A network's first convolution: an image of 1-4 channels (plain NCHW, as the request brings it, or channels-last, as
// a TensorFlow export's transposed NHWC image is) into 8-128 channels-last output channels, any window up to 11 x 11
// (or one row up to 256 wide: a raw audio signal's first layer) and stride, bias and activation. oneDNN 3.2 has no fast
// kernel reading a plain source for a channels-last destination, so the plan reordered the image to NHWC first, and its
// direct kernel then ran the 3-channel product at ~75 GFLOP/s with a SiLU pass after: EfficientNet-B0's 3 -> 32 3x3
// stride-2 layer took 0.29 ms against ONNX Runtime's 0.21 (docs/performance.md, "Thirty-fifth session"). On AVX2 its
// im2col + GEMM ran a keyword spotter's 1 -> 64 channel, 80-tap stride-4 layer at 9 ms channels-last (4 ms plain).
//
// Here each thread takes whole output rows, their output channels in blocks of up to 4 vectors (AVX-512: 64 channels,
// SqueezeNet's 96 as 64 + 32) or 2 (AVX2: 16). Per block of P output pixels of a row, P x V accumulators (V vectors of
// output channels) stay in registers over every tap (input channel, kernel row, kernel column): per tap, V weight
// vectors (packed [C][KH][KW][K] at build) and one broadcast input value per pixel, read from the input row (pixel,
// channel and row strides for either layout). Blocks whose window lies inside the row run without bounds checks; the
// few at the borders, and a row's last partial block, one pixel at a time with them. Bias and the activation are
// applied in registers (activation_avx512.h), Tanh and GELU over the row while it is in the cache. With a fused MaxPool
// (ops/fused_pool.h) the rows go to a small ring per thread instead and are pooled there (ExecutePooled): the wide
// convolution output (36 MB for SqueezeNet at batch 8) never goes to memory and back. The loops are written once
// (stem_conv_rows.inc) and compiled for AVX-512 and for AVX2 + FMA.
#include "kernels/cpu/stem_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/cpu/activation_avx512.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/simd_lanes.h"

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive, as in winograd_conv.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxWindow = 11;
constexpr int64_t kMaxRowWindow = 256;  // a window of one row: up to this wide
constexpr int64_t kMaxOutC = 128;

// What the loops of an output row read, fixed when the kernel is built.
struct StemRows {
  OwnConvGeometry g;
  int64_t pixel = 1, channel = 1, row = 1;  // input floats between adjacent pixels, channels, rows
  int64_t padded_c = 0;                     // output channels rounded up to whole vectors
  std::vector<float> packed;                // [C][KH][KW][padded_c], zeros past the output channels
};

// What the blocks of one output row share.
struct RowGeometry {
  int64_t n, iy0, ky_begin, ky_end, inside_begin, inside_end, taps;
  int64_t ox_begin, ox_end;  // the columns to compute
  const int64_t* in_off;
  const int64_t* w_off;
};

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using namespace simd::avx512;
constexpr int kMaxVectors = 4, kAccumulators = 24;  // of 32 registers
#include "kernels/cpu/stem_conv_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using namespace simd::avx2;
constexpr int kMaxVectors = 2, kAccumulators = 12;  // of 16 registers
#include "kernels/cpu/stem_conv_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

bool HasAvx512() {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
}

bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

class StemConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Stem"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    avx512_ = HasAvx512();
    StemRows& s = rows_;
    s.g = g;
    nhwc_input_ = ctx.InLayout(0) == Layout::kNhwc;
    s.pixel = nhwc_input_ ? g.in_c : 1;
    s.channel = nhwc_input_ ? 1 : g.in_h * g.in_w;
    s.row = g.in_w * s.pixel;
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    const Tensor& w = *ctx.input_values[1];
    const int64_t taps = g.in_c * g.kernel_h * g.kernel_w, lanes = avx512_ ? 16 : 8;
    s.padded_c = (g.out_c + lanes - 1) / lanes * lanes;
    s.packed.assign(static_cast<size_t>(taps * s.padded_c), 0.f);
    const float* src = w.data<float>();
    for (int64_t k = 0; k < g.out_c; ++k)
      for (int64_t t = 0; t < taps; ++t) s.packed[static_cast<size_t>(t * s.padded_c + k)] = src[k * taps + t];
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), rows_.g, nhwc_input_ ? Layout::kNhwc : Layout::kPlain);
    Execute(ctx.In(0).data<float>(), rows_.g.bias ? ctx.In(2).data<float>() : nullptr, ctx.Out(0).data<float>());
  }

  double TimeMs(int runs) override {
    OwnConvTimingBuffers t(rows_.g);
    return BestRunMs(runs, [&] { Execute(t.x.data(), t.bias.data(), t.y.data()); });
  }

 private:
  // Every output row on the thread team (or, with a fused pool, every pooled row: ExecutePooled). The bias is read
  // padded to whole vectors.
  void Execute(const float* x, const float* bias, float* y) const {
    const OwnConvGeometry& g = rows_.g;
    std::array<float, kMaxOutC> padded_bias{};
    if (bias) std::copy(bias, bias + g.out_c, padded_bias.begin());
    const float* b = bias ? padded_bias.data() : nullptr;
    if (g.pool_kh > 0) return ExecutePooled(x, b, y);
    // Rows, each cut into `parts` pieces of columns where there are fewer than two rows per thread (a 1-D signal is
    // one row per image).
    const int64_t rows = g.batch * g.out_h;
    const int64_t parts = rows >= 2 * threads_ ? 1 : std::min(g.out_w, (2 * threads_ + rows - 1) / rows);
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t task = 0; task < rows * parts; ++task) {
      const int64_t row = task / parts, part = task % parts;
      ComputeRow(x, b, row / g.out_h, row % g.out_h, y + row * g.out_w * g.out_c, g.out_w * part / parts,
                 g.out_w * (part + 1) / parts);
    }
  }

  // With a fused MaxPool: each thread takes a contiguous band of pooled rows; per pooled row, the convolution rows of
  // its window are computed into a ring of pool_kh rows (a row two windows share, at stride < window, is computed
  // once), their maximum taken down the window, then across it, into the pooled row. The wide convolution output
  // never leaves the core's caches.
  void ExecutePooled(const float* x, const float* bias, float* y) const {
    const OwnConvGeometry& g = rows_.g;
    const int64_t rows = g.batch * g.pooled_h, row_floats = g.out_w * g.out_c;
#pragma omp parallel num_threads(threads_)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::vector<float> ring(static_cast<size_t>(g.pool_kh * row_floats));
      std::vector<float> down(g.pool_kh > 1 ? static_cast<size_t>(row_floats) : 0);
      // The convolution row (n * out_h + oy) each slot of the ring holds.
      std::vector<int64_t> held(static_cast<size_t>(g.pool_kh), -1);
      for (int64_t row = rows * t / nt; row < rows * (t + 1) / nt; ++row) {
        const int64_t n = row / g.pooled_h, py = row % g.pooled_h;
        const int64_t y0 = py * g.pool_sh - g.pool_top;
        const int64_t ya = std::max<int64_t>(0, y0), yb = std::min(g.out_h, y0 + g.pool_kh);
        const float* pooled_down = down.data();
        for (int64_t oy = ya; oy < yb; ++oy) {
          const size_t slot = static_cast<size_t>(oy % g.pool_kh);
          float* conv_row = ring.data() + slot * row_floats;
          if (held[slot] != n * g.out_h + oy) {
            ComputeRow(x, bias, n, oy, conv_row, 0, g.out_w);
            held[slot] = n * g.out_h + oy;
          }
          if (yb - ya == 1)  // one row in the window (a 1-D pool): pooled across as it is
            pooled_down = conv_row;
          else if (oy == ya)
            std::copy(conv_row, conv_row + row_floats, down.data());
          else if (avx512_)
            avx512::MaxInto(down.data(), conv_row, row_floats);
          else
            avx2::MaxInto(down.data(), conv_row, row_floats);
        }
        float* out = y + row * g.pooled_w * g.out_c;
        if (avx512_)
          avx512::PoolAcross(g, pooled_down, out);
        else
          avx2::PoolAcross(g, pooled_down, out);
      }
    }
  }

  // Columns [ox_begin, ox_end) of output row oy of image n into out_row (out_w pixels of out_c channels).
  void ComputeRow(const float* x, const float* bias, int64_t n, int64_t oy, float* out_row, int64_t ox_begin,
                  int64_t ox_end) const {
    const OwnConvGeometry& g = rows_.g;
    RowGeometry r;
    r.ox_begin = ox_begin;
    r.ox_end = ox_end;
    r.iy0 = oy * g.stride_h - g.pad_top;
    r.ky_begin = std::max<int64_t>(0, -r.iy0);
    r.ky_end = std::min(g.kernel_h, g.in_h - r.iy0);
    r.n = n;
    // Output columns whose whole window lies inside the row: [inside_begin, inside_end).
    r.inside_begin = std::min(g.out_w, (g.pad_left + g.stride_w - 1) / g.stride_w);
    const int64_t last = g.in_w - g.kernel_w + g.pad_left;  // ox * stride <= last
    r.inside_end = last < 0 ? r.inside_begin : std::max(r.inside_begin, std::min(g.out_w, last / g.stride_w + 1));
    // The row's taps inside the image (rows ky_begin..ky_end of the window) as one list: their input offsets from
    // the image's column x0 of row 0 and their weights (one loop over taps, not three short nested ones).
    thread_local std::vector<int64_t> in_off, w_off;
    in_off.clear();
    w_off.clear();
    for (int64_t c = 0; c < g.in_c; ++c)
      for (int64_t ky = r.ky_begin; ky < r.ky_end; ++ky)
        for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
          in_off.push_back(c * rows_.channel + (r.iy0 + ky) * rows_.row + kx * rows_.pixel);
          w_off.push_back(((c * g.kernel_h + ky) * g.kernel_w + kx) * rows_.padded_c);
        }
    r.in_off = in_off.data();
    r.w_off = w_off.data();
    r.taps = static_cast<int64_t>(in_off.size());
    if (avx512_)
      avx512::RowBlocks(rows_, x, bias, r, out_row);
    else
      avx2::RowBlocks(rows_, x, bias, r, out_row);
    if (!ActivatesInRegisters(g.activation.kind))
      g.activation.Apply(out_row + ox_begin * g.out_c, (ox_end - ox_begin) * g.out_c);
  }

  StemRows rows_;
  bool avx512_ = false;      // else AVX2 + FMA
  bool nhwc_input_ = false;  // the image channels-last (a TensorFlow export's NHWC input) instead of plain NCHW
  int threads_ = 1;
};

}  // namespace

bool StemConvApplies(const OwnConvGeometry& g) {
  const int64_t max_w = g.kernel_h == 1 ? kMaxRowWindow : kMaxWindow;
  return (HasAvx512() || HasAvx2()) && g.batch > 0 && g.in_c >= 1 && g.in_c <= 4 && g.in_h > 0 && g.in_w > 0 &&
         g.out_c >= 8 && g.out_c <= kMaxOutC && g.out_h > 0 && g.out_w > 0 && g.kernel_h >= 1 &&
         g.kernel_h <= kMaxWindow && g.kernel_w >= 1 && g.kernel_w <= max_w && g.stride_h >= 1 && g.stride_w >= 1 &&
         g.stride_h <= kMaxWindow && g.stride_w <= max_w && g.pad_top >= 0 && g.pad_left >= 0 &&
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
