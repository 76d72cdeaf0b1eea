// A 1x1, stride-1 convolution on channels-last (NHWC) float32 tensors with bias and activation: the product of the
// [pixels, C] input and the [C, K] weights, for the SiLU layers of EfficientNet and YOLO models. oneDNN's kernel takes
// SiLU only as a slow post-op, so the plan applied SiLU in a second pass over the output; for the expansion layers of
// an EfficientNet block that output no longer fits the cache (16 -> 96 channels on 112x112: 4.8 MB), and ONNX Runtime,
// which also runs SiLU as a pass, was faster there (docs/performance.md, "Thirty-sixth session").
//
// The output channels go in groups of up to 4 vectors (64 channels), split evenly, each group's weights packed as one
// contiguous [C][group] block (zeros past the channels); the pixels in chunks of 24. The work is (chunk, group) pairs
// split over the threads in contiguous ranges: chunk by chunk where the weights are small (a chunk's input stays in
// the cache for all its groups), group by group where they are large (each thread streams its groups' weights once).
// The input channels go in blocks whose weights (a tile) stay in the first-level cache while every block of P pixels
// passes over them, P x V accumulators in registers (per channel V weight vectors and one broadcast input value per
// pixel), the partial sums kept in the output between tiles; the next tile is prefetched on the way. Bias and the
// activation are applied in registers (activation_avx512.h); a residual joins the bias where the first tile starts its
// sums (so it may lie in the output's own buffer). A fused input scale (ops/conv_input_scale.h: a squeeze-and-
// excitation gate) multiplies a copy of the packed weights where the layer has fewer output channels than an image
// has pixels, else each chunk's input, into a thread's scratch before its groups read it (Execute).
#include "kernels/cpu/pointwise_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/activation_avx512.h"
#include "kernels/cpu/dnnl_common.h"
#include "ops/conv_input_scale.h"

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive, as in winograd_conv.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxInputChannels = 4096;
constexpr int64_t kChunk = 24;  // pixels per work item: a multiple of every block size below
// Weights above this many bytes go group by group (see the top of the file).
constexpr int64_t kGroupMajorBytes = int64_t{1} << 20;
// A group's weights for one block of input channels: half of a 48 KB first-level cache.
constexpr int64_t kWeightTileBytes = int64_t{24} << 10;

// Pixels per block for V vectors of output channels: 24 accumulators (12 for one vector).
template <int V>
constexpr int PixelsFor() {
  return V == 4 ? 6 : V == 3 ? 8 : 12;
}

// One run's tensors.
struct Inputs {
  const float* x;
  const float* bias;      // null: none
  const float* residual;  // null: none
  const float* scale;     // the input scale (null: none), per image when scale_per_image
  bool scale_per_image;
  const float* weights;  // packed as PointwiseConv::packed_ (or a scaled copy)
};

class PointwiseConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Pointwise"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    vectors_ = (g.out_c + 15) / 16;
    const int64_t groups = (vectors_ + 3) / 4;
    group_vectors_ = (vectors_ + groups - 1) / groups;
    groups_ = (vectors_ + group_vectors_ - 1) / group_vectors_;
    last_mask_ = static_cast<__mmask16>(g.out_c % 16 == 0 ? 0xffff : (1u << (g.out_c % 16)) - 1);
    const int64_t width = group_vectors_ * 16;  // a packed row
    packed_floats_ = groups_ * g.in_c * width;
    const Tensor& weights = *ctx.input_values[1];
    auto fill = [&](void* data) {
      float* packed = static_cast<float*>(data);
      std::fill(packed, packed + packed_floats_, 0.f);
      const float* src = weights.data<float>();
      for (int64_t k = 0; k < g.out_c; ++k)
        for (int64_t c = 0; c < g.in_c; ++c) packed[(k / width * g.in_c + c) * width + k % width] = src[k * g.in_c + c];
    };
    const size_t bytes = static_cast<size_t>(packed_floats_) * sizeof(float);
    // Shared with every plan packing the same weights the same way (tenants of one backbone, other batch sizes), and
    // counted with the model's bytes.
    if (ctx.derive_weight && weights.buffer()) {
      packed_buffer_ = ctx.derive_weight(
          weights, "pointwise:" + std::to_string(g.in_c) + "x" + std::to_string(g.out_c) + "/" + std::to_string(width),
          bytes, fill);
    } else {
      packed_buffer_ = Allocator::Host().Allocate(bytes);
      fill(packed_buffer_->data());
    }
    packed_ = static_cast<const float*>(packed_buffer_->data());
    group_major_ = static_cast<int64_t>(bytes) > kGroupMajorBytes;
    k_block_ = std::max<int64_t>(16, kWeightTileBytes / (width * static_cast<int64_t>(sizeof(float))));
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), g_, Layout::kNhwc);
    const Tensor* scale = g_.input_scale ? &ctx.In(kInputScaleInput) : nullptr;
    Execute(ctx.In(0).data<float>(), g_.bias ? ctx.In(2).data<float>() : nullptr, ctx.Out(0).data<float>(),
            g_.residual ? ctx.In(3).data<float>() : nullptr, scale ? scale->data<float>() : nullptr,
            scale && scale->dim(0) > 1);
  }

  // The residual's buffer may become the output's: the first tile reads it before writing its partial sums there.
  bool MayOverwriteInput(int i) const override { return i == 3 && g_.residual; }

  // As in a model (and as oneDNN's kernel is timed against it): the activations in the caches, the weights not.
  double TimeMs(int runs) override {
    OwnConvTimingBuffers t(g_);
    return BestRunMs(
        runs,
        [&] {
          Execute(t.x.data(), t.bias.data(), t.y.data(), g_.residual ? t.residual.data() : nullptr,
                  g_.input_scale ? t.scale.data() : nullptr, false);
        },
        [&] { EvictFromCaches(packed_, static_cast<size_t>(packed_floats_) * sizeof(float)); });
  }

 private:
  // `scale`: the input scale's factors, per image when `scale_per_image` (else one row for all); null when none. Where
  // an image has more pixels than the layer output channels, its scaled weights (C x K values) are fewer than its
  // scaled input (pixels x C): the factors then go into a copy of the packed weights, one image at a time when they
  // differ per image; else into each chunk's input (Chunk).
  void Execute(const float* x, const float* bias, float* y, const float* residual, const float* scale,
               bool scale_per_image) const {
    const int64_t image_pixels = g_.in_h * g_.in_w, pixels = g_.batch * image_pixels;
    if (!scale || g_.out_c >= image_pixels) {
      ExecutePixels(Inputs{x, bias, residual, scale, scale_per_image, packed_}, y, 0, pixels);
      return;
    }
    float* scaled = reinterpret_cast<float*>(ThreadScratch::Reserve(packed_floats_ * sizeof(float)));
    for (int64_t n = 0; n < (scale_per_image ? g_.batch : 1); ++n) {
      ScaleWeights(scale + n * g_.in_c, scaled);
      const int64_t p0 = scale_per_image ? n * image_pixels : 0, p1 = scale_per_image ? p0 + image_pixels : pixels;
      ExecutePixels(Inputs{x, bias, residual, nullptr, false, scaled}, y, p0, p1);
    }
  }

  // scaled = packed_ with each input channel's rows times s[channel] (a packed row is group_vectors_ vectors), split
  // over the threads: on the run's path, C x K products a run.
  __attribute__((target("avx512f"))) void ScaleWeights(const float* s, float* scaled) const {
    const int64_t rows = groups_ * g_.in_c, width = group_vectors_ * 16;
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * width >= (int64_t{1} << 14))
    for (int64_t row = 0; row < rows; ++row) {
      const __m512 f = _mm512_set1_ps(s[row % g_.in_c]);
      for (int64_t j = 0; j < width; j += 16)
        _mm512_storeu_ps(scaled + row * width + j, _mm512_mul_ps(_mm512_loadu_ps(packed_ + row * width + j), f));
    }
  }

  // Pixels [q0, q1) of the output.
  void ExecutePixels(const Inputs& in, float* y, int64_t q0, int64_t q1) const {
    const int64_t chunks = (q1 - q0 + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t item = 0; item < chunks * groups_; ++item) {
      const int64_t chunk = group_major_ ? item % chunks : item / groups_;
      const int64_t group = group_major_ ? item / chunks : item % groups_;
      const int64_t p0 = q0 + chunk * kChunk, p1 = std::min(q1, p0 + kChunk);
      switch (std::min(group_vectors_, vectors_ - group * group_vectors_)) {
        case 1:
          Chunk<1>(in, y, p0, p1, group);
          break;
        case 2:
          Chunk<2>(in, y, p0, p1, group);
          break;
        case 3:
          Chunk<3>(in, y, p0, p1, group);
          break;
        default:
          Chunk<4>(in, y, p0, p1, group);
          break;
      }
    }
  }

  // Pixels [p0, p1), output channel vectors [v0, v0 + V) of group `group`: the input channels in blocks whose weights
  // stay in the first-level cache while every pixel block passes over them, the partial sums kept in the output.
  template <int V>
  __attribute__((target("avx512f"))) void Chunk(const Inputs& in, float* y, int64_t p0, int64_t p1,
                                                int64_t group) const {
    constexpr int P = PixelsFor<V>();
    const float* bias = in.bias;
    // The chunk's input rows: the input's own, or their scaled copy (first row at pixel p0).
    const float* x = in.x;
    int64_t x_base = 0;
    if (in.scale) {
      float* scaled = reinterpret_cast<float*>(ThreadScratch::Reserve((p1 - p0) * g_.in_c * sizeof(float)));
      const int64_t image_pixels = g_.in_h * g_.in_w;
      for (int64_t p = p0; p < p1; ++p) {
        const float* s = in.scale + (in.scale_per_image ? p / image_pixels * g_.in_c : 0);
        const float* row = in.x + p * g_.in_c;
        float* out = scaled + (p - p0) * g_.in_c;
        for (int64_t c = 0; c < g_.in_c; c += 16) {
          const __mmask16 m = c + 16 <= g_.in_c ? 0xffff : static_cast<__mmask16>((1u << (g_.in_c - c)) - 1);
          _mm512_mask_storeu_ps(out + c, m,
                                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + c), _mm512_maskz_loadu_ps(m, s + c)));
        }
      }
      x = scaled;
      x_base = p0;
    }
    const int64_t v0 = group * group_vectors_;
    const __mmask16 last = v0 + V == vectors_ ? last_mask_ : static_cast<__mmask16>(0xffff);
    __m512 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      b[v] = bias ? _mm512_maskz_loadu_ps(v == V - 1 ? last : 0xffff, bias + (v0 + v) * 16) : _mm512_setzero_ps();
    const int64_t width = group_vectors_ * 16;
    const float* w = in.weights + group * g_.in_c * width;
    const int64_t offset = v0 * 16;  // of the group's first output channel in a pixel
    const char* const packed_end = reinterpret_cast<const char*>(in.weights + packed_floats_);
    const int64_t blocks = (p1 - p0 + P - 1) / P;
    for (int64_t k0 = 0; k0 < g_.in_c; k0 += k_block_) {
      const int64_t k1 = std::min(g_.in_c, k0 + k_block_);
      // The next tile of weights (this group's next block of channels, or the next group's first) is fetched into the
      // cache while the pixel blocks pass over this one, each block a share of its lines: the hardware prefetcher
      // alone left every tile's first pass waiting on memory (1.4x the time alone in ResNet-50's 7x7 layers).
      const char* next = reinterpret_cast<const char*>(w + k1 * width);
      const int64_t tile_bytes = std::min<int64_t>((k1 - k0) * width * sizeof(float), packed_end - next);
      for (int64_t i = 0, p = p0; p < p1; ++i, p += P) {
        const char* pf = next + tile_bytes * i / blocks / 64 * 64;
        const char* pf_end = next + tile_bytes * (i + 1) / blocks;
        Block<V, P>(x + (p - x_base) * g_.in_c, w + k0 * width, k0, k1, b, y + p * g_.out_c + offset,
                    in.residual ? in.residual + p * g_.out_c + offset : nullptr, std::min<int64_t>(P, p1 - p), last, pf,
                    pf_end);
      }
    }
  }

  // `count` <= P pixels from `in` (their input channels), input channels [k0, k1) (weights from `w`), V output vectors
  // at `out`, the last one's lanes `last`; the lines [pf, pf_end) are prefetched on the way. The first block of
  // channels starts from the bias (plus the residual at `res`, laid out as `out`, when not null), a later one from the
  // partial sums in `out`; the last applies the activation.
  // Pixels past `count` repeat the last one and are not stored.
  template <int V, int P>
  __attribute__((target("avx512f"))) void Block(const float* in, const float* w, int64_t k0, int64_t k1,
                                                const __m512* b, float* out, const float* res, int64_t count,
                                                __mmask16 last, const char* pf, const char* pf_end) const {
    const int64_t c = g_.in_c, width = group_vectors_ * 16, k_out = g_.out_c;
    const bool first = k0 == 0, final = k1 == c;
    // Fully unrolled, so the accumulators stay in registers.
    __m512 acc[P][V];
#pragma GCC unroll 12
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const __mmask16 lanes = p < count ? (v == V - 1 ? last : static_cast<__mmask16>(0xffff)) : 0;
        acc[p][v] = !first ? _mm512_maskz_loadu_ps(lanes, out + p * k_out + v * 16)
                    : res  ? _mm512_add_ps(b[v], _mm512_maskz_loadu_ps(lanes, res + p * k_out + v * 16))
                           : b[v];
      }
    if (count == P) {
      for (int64_t k = k0; k < k1; ++k, w += width) {
        if (pf < pf_end) {  // one line of the next tile per step (see Chunk)
          _mm_prefetch(pf, _MM_HINT_T0);
          pf += 64;
        }
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
    } else {
      const float* pixel[P];
#pragma GCC unroll 12
      for (int p = 0; p < P; ++p) pixel[p] = in + std::min<int64_t>(p, count - 1) * c;
      for (int64_t k = k0; k < k1; ++k, w += width) {
        __m512 wv[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + v * 16);
#pragma GCC unroll 12
        for (int p = 0; p < P; ++p) {
          const __m512 xv = _mm512_set1_ps(pixel[p][k]);
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
        }
      }
    }
#pragma GCC unroll 12
    for (int p = 0; p < P; ++p) {
      if (p >= count) break;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const __mmask16 lanes = v == V - 1 ? last : static_cast<__mmask16>(0xffff);
        _mm512_mask_storeu_ps(out + p * k_out + v * 16, lanes,
                              final ? ActivateVector(acc[p][v], g_.activation) : acc[p][v]);
      }
    }
  }

  OwnConvGeometry g_;
  int threads_ = 1;
  int64_t vectors_ = 0;        // output channel vectors of 16
  int64_t group_vectors_ = 1;  // vectors per group (the last group may have fewer)
  int64_t groups_ = 1;
  bool group_major_ = false;      // the work goes group by group (large weights), else chunk by chunk
  int64_t k_block_ = 1;           // input channels per block (their weights: kWeightTileBytes)
  __mmask16 last_mask_ = 0xffff;  // the lanes of the last vector that are output channels
  std::shared_ptr<Buffer> packed_buffer_;  // [group][C][group_vectors_ * 16], zeros past the output channels
  const float* packed_ = nullptr;          // its data
  int64_t packed_floats_ = 0;
};

}  // namespace

bool PointwiseConvApplies(const OwnConvGeometry& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && g.batch > 0 && g.in_c >= 1 && g.in_c <= kMaxInputChannels && g.out_c >= 16 && g.in_h > 0 &&
         g.in_w > 0 && g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 &&
         g.pad_left == 0 && g.out_h == g.in_h && g.out_w == g.in_w && ActivatesInRegisters(g.activation.kind);
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
