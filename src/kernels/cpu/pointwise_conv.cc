// A 1x1, stride-1 convolution on channels-last (NHWC) float32 tensors with bias and activation: the product of the
// [pixels, C] input and the [C, K] weights, for the SiLU layers of EfficientNet and YOLO models. oneDNN's kernel takes
// SiLU only as a slow post-op, so the plan applied SiLU in a second pass over the output; for the expansion layers of
// an EfficientNet block that output no longer fits the cache (16 -> 96 channels on 112x112: 4.8 MB), and ONNX Runtime,
// which also runs SiLU as a pass, was faster there (docs/performance.md, "Thirty-sixth session").
//
// Also weight-heavy layers of any window (no more output pixels than output channels: ResNet-50's 7x7 layers at batch
// 1, 3x3 and strided ones included), whose weights oneDNN's kernels read several times: each output pixel's window is
// gathered into a row first (im2col, Gather; those rows take no more memory than the weights), and the product's rows
// are then (tap, channel) pairs.
//
// The output channels go in groups of up to 4 vectors (64 channels), split evenly, each group's weights packed as one
// contiguous [rows][group] block (zeros past the channels); the pixels in chunks. The work is (chunk, group) pairs
// split over the threads in contiguous ranges: chunk by chunk where the weights are small (a chunk of 24 pixels' input
// stays in the cache for all its groups), group by group where they are large (each thread streams its groups'
// weights once; a chunk takes as many pixels as 1 MB of input rows, all 49 of a 7x7 layer, so each weight is read once
// for all of them). The rows go in blocks whose weights (a tile) stay in the first-level cache while every block of P
// pixels passes over them, P x V accumulators in registers (per row V weight vectors and one broadcast input value
// per pixel), the partial sums kept in the output between tiles; the next tile is prefetched on the way. Bias and the
// activation are applied in registers (activation_avx512.h); a residual joins the bias where the first tile starts its
// sums (so it may lie in the output's own buffer). A fused input scale (ops/conv_input_scale.h: a squeeze-and-
// excitation gate) multiplies a copy of the packed weights where the layer has fewer output channels than an image
// has pixels, else each chunk's input, into a thread's scratch before its groups read it (Execute). So are a fused
// concatenation's parts and a normalisation's affine and ReLU (`_input_parts`, `_input_affine`: runtime/fusion.cc
// FuseConvInputs): each chunk's rows formed once for all its groups (FormRows).
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
constexpr int64_t kMaxWindow = 16;  // window sides the kernel gathers for
// Chunk by chunk, pixels per work item: a multiple of every block size of that order (PixelsFor).
constexpr int64_t kChunk = 24;
// Group by group, a work item's input rows (pixels x C floats) stay in the second-level cache while its group's
// weights pass over them: up to this many bytes of them.
constexpr int64_t kChunkInputBytes = int64_t{1} << 20;
// Weights above this many bytes go group by group (see the top of the file).
constexpr int64_t kGroupMajorBytes = int64_t{1} << 20;
// A group's weights for one block of input channels: half of a 48 KB first-level cache.
constexpr int64_t kWeightTileBytes = int64_t{24} << 10;
// Group by group, a fused input's rows (`_input_parts`, `_input_affine`) formed all at once up to this many bytes.
constexpr int64_t kMaxFormedBytes = int64_t{8} << 20;

// Pixels per block for V vectors of output channels: 24 accumulators (12 for one vector); group by group (`heavy`),
// 28 for four vectors: with their weights all 32 registers (the FMA broadcasts the input value from memory). Chunk by
// chunk, 7 pixels a block ran EfficientNet-B0's layers slower (its SiLU needs registers of its own).
template <int V, bool heavy>
constexpr int PixelsFor() {
  return V == 4 ? (heavy ? 7 : 6) : V == 3 ? 8 : 12;
}
int PixelsForVectors(int64_t v, bool heavy) {
  return v == 4   ? (heavy ? PixelsFor<4, true>() : PixelsFor<4, false>())
         : v == 3 ? PixelsFor<3, false>()
                  : PixelsFor<1, false>();
}

// One run's tensors.
struct Inputs {
  const float* x;
  const float* bias;      // null: none
  const float* residual;  // null: none
  const float* scale;     // the input scale (null: none), per image when scale_per_image
  bool scale_per_image;
  const float* weights;  // packed as PointwiseConv::packed_ (or a scaled copy)
  const float* const* parts = nullptr;  // the input's parts (OwnConvGeometry::input_parts; null: x is the input)
  const float* affine_a = nullptr;      // the input affine (null: none): x * a + b per channel
  const float* affine_b = nullptr;
  // The chunk's input rows are formed in a scratch first (FormRows).
  bool Transformed() const { return scale || parts || affine_a; }
};

// dst[0, n) = src[0, n) times s (when not null), times a plus b (when a is not null), then max(., 0) when `relu`.
__attribute__((target("avx512f"))) void TransformRow(const float* src, float* dst, int64_t n, const float* s,
                                                     const float* a, const float* b, bool relu) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = c + 16 <= n ? 0xffff : static_cast<__mmask16>((1u << (n - c)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, src + c);
    if (s) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, s + c));
    if (a) v = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c));
    if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
    _mm512_mask_storeu_ps(dst + c, m, v);
  }
}

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
    taps_ = g.kernel_h * g.kernel_w;
    depth_ = taps_ * g.in_c;
    gathered_ = taps_ > 1 || g.stride_h != 1 || g.stride_w != 1 || g.pad_top != 0 || g.pad_left != 0;
    packed_floats_ = groups_ * depth_ * width;
    const Tensor& weights = *ctx.input_values[1];
    auto fill = [&](void* data) {  // row (tap, c) of the product: weights [K, C, KH, KW] at [k, c, tap]
      float* packed = static_cast<float*>(data);
      std::fill(packed, packed + packed_floats_, 0.f);
      const float* src = weights.data<float>();
      for (int64_t k = 0; k < g.out_c; ++k)
        for (int64_t c = 0; c < g.in_c; ++c)
          for (int64_t t = 0; t < taps_; ++t)
            packed[(k / width * depth_ + t * g.in_c + c) * width + k % width] = src[(k * g.in_c + c) * taps_ + t];
    };
    const size_t bytes = static_cast<size_t>(packed_floats_) * sizeof(float);
    // Shared with every plan packing the same weights the same way (tenants of one backbone, other batch sizes), and
    // counted with the model's bytes.
    if (ctx.derive_weight && weights.buffer()) {
      packed_buffer_ = ctx.derive_weight(weights,
                                         "pointwise:" + std::to_string(g.in_c) + "x" + std::to_string(g.out_c) + "x" +
                                             std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) + "/" +
                                             std::to_string(width),
                                         bytes, fill);
    } else {
      packed_buffer_ = Allocator::Host().Allocate(bytes);
      fill(packed_buffer_->data());
    }
    packed_ = static_cast<const float*>(packed_buffer_->data());
    group_major_ = static_cast<int64_t>(bytes) > kGroupMajorBytes;
    k_block_ = std::max<int64_t>(16, kWeightTileBytes / (width * static_cast<int64_t>(sizeof(float))));
    // Pixels per work item: kChunk where the work goes chunk by chunk; where it goes group by group, a multiple of the
    // block, as many as the second-level cache holds the input rows of (ResNet-50's 7x7 layers: all 49, so
    // each tile of weights is read once for all of them), but enough items for every thread.
    const int64_t block = PixelsForVectors(group_vectors_, group_major_), pixels = g.batch * g.out_h * g.out_w;
    chunk_ = kChunk;
    if (group_major_) {
      int64_t blocks = std::min((pixels + block - 1) / block,
                                std::max<int64_t>(1, kChunkInputBytes / (depth_ * int64_t{sizeof(float)}) / block));
      if (groups_ < threads_) {
        const int64_t parts = (threads_ + groups_ - 1) / groups_;  // chunks per group for every thread to have one
        blocks = std::min(blocks, std::max<int64_t>(1, ((pixels + parts - 1) / parts + block - 1) / block));
      }
      chunk_ = block * blocks;
    }
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), g_, Layout::kNhwc);
    const float* bias = g_.bias ? ctx.In(2).data<float>() : nullptr;
    const float* residual = g_.residual ? ctx.In(3).data<float>() : nullptr;
    if (g_.input_affine || !g_.input_parts.empty()) {  // formed chunk by chunk where the rows are read (FormRows)
      std::vector<const float*> parts(g_.input_parts.size());
      for (size_t i = 0; i < parts.size(); ++i) parts[i] = ctx.In(InputPartIndex(static_cast<int>(i))).data<float>();
      Inputs in{ctx.In(0).data<float>(), bias, residual, nullptr, false, packed_};
      if (!parts.empty()) in.parts = parts.data();
      if (g_.input_affine) {
        in.affine_a = ctx.In(kInputAffineScale).data<float>();
        in.affine_b = ctx.In(kInputAffineShift).data<float>();
      }
      const int64_t pixels = g_.batch * g_.out_h * g_.out_w;
      // Every group reads every row: all rows formed once first, split over the threads, where they take at most
      // kMaxFormedBytes (the thread's scratch keeps its size; larger ones are formed per work item, as chunk by chunk).
      if (group_major_ && pixels * g_.in_c * int64_t{sizeof(float)} <= kMaxFormedBytes) {
        float* rows = reinterpret_cast<float*>(ThreadScratch::Reserve(pixels * g_.in_c * sizeof(float)));
        const int64_t blocks = (pixels + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t b = 0; b < blocks; ++b)
          FormRows(in, b * kChunk, std::min(pixels, (b + 1) * kChunk), rows + b * kChunk * g_.in_c);
        in = Inputs{rows, bias, residual, nullptr, false, packed_};
      }
      ExecutePixels(in, ctx.Out(0).data<float>(), 0, pixels);
      return;
    }
    const Tensor* scale = g_.input_scale ? &ctx.In(kInputScaleInput) : nullptr;
    Execute(ctx.In(0).data<float>(), bias, ctx.Out(0).data<float>(), residual, scale ? scale->data<float>() : nullptr,
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
    const int64_t image_pixels = g_.out_h * g_.out_w, pixels = g_.batch * image_pixels;
    if (gathered_) {  // the rows in the calling thread's scratch (no larger than the weights; Chunk reserves none)
      float* rows = reinterpret_cast<float*>(ThreadScratch::Reserve(pixels * depth_ * sizeof(float)));
      Gather(x, rows);
      ExecutePixels(Inputs{rows, bias, residual, nullptr, false, packed_}, y, 0, pixels);
      return;
    }
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

  // rows = the product's input: per output pixel its window's input pixels (tap by tap, C channels each; zeros
  // outside the image), split over the threads.
  void Gather(const float* x, float* rows) const {
    const int64_t c = g_.in_c, out_pixels = g_.batch * g_.out_h * g_.out_w;
#pragma omp parallel for num_threads(threads_) schedule(static) if (out_pixels * depth_ >= (int64_t{1} << 14))
    for (int64_t p = 0; p < out_pixels; ++p) {
      const int64_t n = p / (g_.out_h * g_.out_w), oy = p / g_.out_w % g_.out_h, ox = p % g_.out_w;
      float* row = rows + p * depth_;
      for (int64_t ky = 0; ky < g_.kernel_h; ++ky) {
        const int64_t iy = oy * g_.stride_h - g_.pad_top + ky;
        for (int64_t kx = 0; kx < g_.kernel_w; ++kx, row += c) {
          const int64_t ix = ox * g_.stride_w - g_.pad_left + kx;
          if (iy < 0 || iy >= g_.in_h || ix < 0 || ix >= g_.in_w)
            std::fill(row, row + c, 0.f);
          else
            std::copy_n(x + ((n * g_.in_h + iy) * g_.in_w + ix) * c, c, row);
        }
      }
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

  // Pixels [q0, q1) of the output. Input rows formed in a scratch (Inputs::Transformed) are formed once per chunk:
  // chunk by chunk, a work item is a chunk and all its groups.
  void ExecutePixels(const Inputs& in, float* y, int64_t q0, int64_t q1) const {
    const int64_t chunks = (q1 - q0 + chunk_ - 1) / chunk_;
    if (in.Transformed() && !group_major_) {
#pragma omp parallel for num_threads(threads_) schedule(static)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t p0 = q0 + chunk * chunk_, p1 = std::min(q1, p0 + chunk_);
        const float* rows = FormRows(in, p0, p1);
        for (int64_t group = 0; group < groups_; ++group) ChunkOfGroup(in, rows, p0, y, p0, p1, group);
      }
      return;
    }
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t item = 0; item < chunks * groups_; ++item) {
      const int64_t chunk = group_major_ ? item % chunks : item / groups_;
      const int64_t group = group_major_ ? item / chunks : item % groups_;
      const int64_t p0 = q0 + chunk * chunk_, p1 = std::min(q1, p0 + chunk_);
      if (in.Transformed())
        ChunkOfGroup(in, FormRows(in, p0, p1), p0, y, p0, p1, group);
      else
        ChunkOfGroup(in, in.x, 0, y, p0, p1, group);
    }
  }

  // Chunk for the group's vector count; `x` holds the input rows from pixel `x_base` on.
  void ChunkOfGroup(const Inputs& in, const float* x, int64_t x_base, float* y, int64_t p0, int64_t p1,
                    int64_t group) const {
    switch (std::min(group_vectors_, vectors_ - group * group_vectors_)) {
      case 1:
        Chunk<1, PixelsFor<1, false>()>(in, x, x_base, y, p0, p1, group);
        break;
      case 2:
        Chunk<2, PixelsFor<2, false>()>(in, x, x_base, y, p0, p1, group);
        break;
      case 3:
        Chunk<3, PixelsFor<3, false>()>(in, x, x_base, y, p0, p1, group);
        break;
      default:
        if (group_major_)
          Chunk<4, PixelsFor<4, true>()>(in, x, x_base, y, p0, p1, group);
        else
          Chunk<4, PixelsFor<4, false>()>(in, x, x_base, y, p0, p1, group);
        break;
    }
  }

  // The input rows of pixels [p0, p1) formed in the calling thread's scratch: scaled, joined from the parts, with the
  // affine and its ReLU applied.
  // `formed`: where to put them (null: the scratch).
  const float* FormRows(const Inputs& in, int64_t p0, int64_t p1, float* formed = nullptr) const {
    if (!formed) formed = reinterpret_cast<float*>(ThreadScratch::Reserve((p1 - p0) * g_.in_c * sizeof(float)));
    const int64_t image_pixels = g_.in_h * g_.in_w;
    const bool relu = g_.input_relu;
    for (int64_t p = p0; p < p1; ++p) {
      float* out = formed + (p - p0) * g_.in_c;
      if (in.parts) {
        int64_t first = 0;
        for (size_t i = 0; i < g_.input_parts.size(); ++i) {
          const int64_t c = g_.input_parts[i];
          TransformRow(in.parts[i] + p * c, out + first, c, nullptr, in.affine_a ? in.affine_a + first : nullptr,
                       in.affine_a ? in.affine_b + first : nullptr, relu);
          first += c;
        }
      } else {
        const float* s = in.scale ? in.scale + (in.scale_per_image ? p / image_pixels * g_.in_c : 0) : nullptr;
        TransformRow(in.x + p * g_.in_c, out, g_.in_c, s, in.affine_a, in.affine_b, relu);
      }
    }
    return formed;
  }

  // Pixels [p0, p1), output channel vectors [v0, v0 + V) of group `group`: the input channels in blocks whose weights
  // stay in the first-level cache while every pixel block passes over them, the partial sums kept in the output.
  // `x`: the input rows from pixel `x_base` on (the input's own, or formed by FormRows).
  template <int V, int P>
  __attribute__((target("avx512f"))) void Chunk(const Inputs& in, const float* x, int64_t x_base, float* y, int64_t p0,
                                                int64_t p1, int64_t group) const {
    const float* bias = in.bias;
    const int64_t v0 = group * group_vectors_;
    const __mmask16 last = v0 + V == vectors_ ? last_mask_ : static_cast<__mmask16>(0xffff);
    __m512 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      b[v] = bias ? _mm512_maskz_loadu_ps(v == V - 1 ? last : 0xffff, bias + (v0 + v) * 16) : _mm512_setzero_ps();
    const int64_t width = group_vectors_ * 16;
    const float* w = in.weights + group * depth_ * width;
    const int64_t offset = v0 * 16;  // of the group's first output channel in a pixel
    const char* const packed_end = reinterpret_cast<const char*>(in.weights + packed_floats_);
    const int64_t blocks = (p1 - p0 + P - 1) / P;
    for (int64_t k0 = 0; k0 < depth_; k0 += k_block_) {
      const int64_t k1 = std::min(depth_, k0 + k_block_);
      // The next tile of weights (this group's next block of channels, or the next group's first) is fetched into the
      // cache while the pixel blocks pass over this one, each block a share of its lines: the hardware prefetcher
      // alone left every tile's first pass waiting on memory (1.4x the time alone in ResNet-50's 7x7 layers).
      const char* next = reinterpret_cast<const char*>(w + k1 * width);
      const int64_t tile_bytes = std::min<int64_t>((k1 - k0) * width * sizeof(float), packed_end - next);
      for (int64_t i = 0, p = p0; p < p1; ++i, p += P) {
        const char* pf = next + tile_bytes * i / blocks / 64 * 64;
        const char* pf_end = next + tile_bytes * (i + 1) / blocks;
        Block<V, P>(x + (p - x_base) * depth_, w + k0 * width, k0, k1, b, y + p * g_.out_c + offset,
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
    const int64_t c = depth_, width = group_vectors_ * 16, k_out = g_.out_c;
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
  int64_t k_block_ = 1;           // rows of the product per block (their weights: kWeightTileBytes)
  int64_t chunk_ = 1;             // pixels per work item (see Build)
  int64_t taps_ = 1;              // window positions
  int64_t depth_ = 0;             // the product's inner dimension: taps_ x C
  bool gathered_ = false;         // not a 1x1 stride-1 unpadded window: the input is gathered first (Gather)
  __mmask16 last_mask_ = 0xffff;  // the lanes of the last vector that are output channels
  std::shared_ptr<Buffer> packed_buffer_;  // [group][depth_][group_vectors_ * 16], zeros past the output channels
  const float* packed_ = nullptr;          // its data
  int64_t packed_floats_ = 0;
};

}  // namespace

bool PointwiseConvApplies(const OwnConvGeometry& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 || g.pool_kh > 0 || g.batch <= 0 || g.in_c < 1 || g.in_c > kMaxInputChannels || g.out_c < 16 ||
      g.in_h <= 0 || g.in_w <= 0 || g.out_h <= 0 || g.out_w <= 0 || !ActivatesInRegisters(g.activation.kind))
    return false;
  const bool plain_window =
      g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0;
  // A fused affine or parts (formed where the rows are read): the plain 1x1 form only, without an input scale.
  if (g.input_affine || !g.input_parts.empty()) {
    int64_t joined = 0;
    for (int64_t c : g.input_parts) joined += c;
    if (!plain_window || g.input_scale || (!g.input_parts.empty() && joined != g.in_c)) return false;
  }
  if (plain_window) return g.out_h == g.in_h && g.out_w == g.in_w;
  // Other windows gather each output pixel's window into a row first: only where those rows (pixels x taps x C) take
  // no more memory than the weights (K x taps x C), and without an input scale (a gate comes before 1x1 layers).
  return g.kernel_h >= 1 && g.kernel_w >= 1 && g.kernel_h <= kMaxWindow && g.kernel_w <= kMaxWindow &&
         g.stride_h >= 1 && g.stride_w >= 1 && g.pad_top >= 0 && g.pad_left >= 0 && !g.input_scale &&
         PointwiseConvWeightHeavy(g);
}

bool PointwiseConvWeightHeavy(const OwnConvGeometry& g) { return g.batch * g.out_h * g.out_w <= g.out_c; }

std::unique_ptr<OwnConvKernel> CreatePointwiseConv(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
  if (!PointwiseConvApplies(g) || ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr ||
      ctx.input_values[1]->raw() == nullptr ||
      ctx.input_values[1]->numel() != g.out_c * g.in_c * g.kernel_h * g.kernel_w)
    return nullptr;
  auto kernel = std::make_unique<PointwiseConv>();
  kernel->Build(ctx, g);
  return kernel;
}

}  // namespace osprey::cpu
