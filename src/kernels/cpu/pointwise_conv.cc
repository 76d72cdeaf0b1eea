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
// activation are applied in registers (activation_vector.h); a residual joins the bias where the first tile starts its
// sums (so it may lie in the output's own buffer). A fused input scale (ops/conv_input_scale.h: a squeeze-and-
// excitation gate) multiplies a copy of the packed weights where the layer has fewer output channels than an image
// has pixels, else each chunk's input, into a thread's scratch before its groups read it (Execute). So are a fused
// concatenation's parts and a normalisation's affine and ReLU (`_input_parts`, `_input_affine`: runtime/fusion.cc
// FuseConvInputs): each chunk's rows formed once for all its groups (FormRows).
#include "kernels/cpu/pointwise_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/activation_vector.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/simd_lanes.h"
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

// What the loops (pointwise_rows.inc) read of the layer.
struct Layer {
  int64_t out_c = 0;
  int64_t depth = 0;          // the product's inner dimension: taps x C
  int64_t vectors = 0;        // output channel vectors of kLanes
  int64_t group_vectors = 1;  // vectors per group (the last group may have fewer)
  int64_t k_block = 1;        // rows of the product per block (their weights: kWeightTileBytes)
  int64_t packed_floats = 0;
  int last_lanes = 0;        // the lanes of the last vector that are output channels
  bool group_major = false;  // the work goes group by group (large weights), else chunk by chunk
  Activation activation;
};

// ---- The loops for each instruction set (pointwise_rows.inc).
// AVX-512: 16 lanes; pixels per block for V vectors of output channels: 24 accumulators (12 for one vector); group by
// group (`heavy`), 28 for four vectors: with their weights all 32 registers (the FMA broadcasts the input value from
// memory). Chunk by chunk, 7 pixels a block ran EfficientNet-B0's layers slower (its SiLU needs registers of its own).
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using namespace simd::avx512;
constexpr int kMaxVectors = 4;
template <int V, bool heavy>
constexpr int PixelsFor() {
  return V == 4 ? (heavy ? 7 : 6) : V == 3 ? 8 : 12;
}
inline __mmask16 First(int n) { return static_cast<__mmask16>((1u << n) - 1); }
inline V LoadFirst(const float* p, int n) { return _mm512_maskz_loadu_ps(First(n), p); }
inline void StoreFirst(float* p, V v, int n) { _mm512_mask_storeu_ps(p, First(n), v); }
#include "kernels/cpu/pointwise_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

// AVX2 + FMA: 8 lanes, 16 registers: 12 accumulators, up to 3 weight vectors and the broadcast input value; masked
// loads and stores only where a vector is partly output channels.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using namespace simd::avx2;
constexpr int kMaxVectors = 3;
template <int V, bool heavy>
constexpr int PixelsFor() {
  return V == 3 ? 4 : V == 2 ? 6 : 12;
}
inline __m256i First(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V LoadFirst(const float* p, int n) { return n == kLanes ? Load(p) : _mm256_maskload_ps(p, First(n)); }
inline void StoreFirst(float* p, V v, int n) {
  if (n == kLanes)
    Store(p, v);
  else
    _mm256_maskstore_ps(p, First(n), v);
}
#include "kernels/cpu/pointwise_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

// The loops of one instruction set.
struct Isa {
  int lanes;
  int max_vectors;
  decltype(&avx512::PixelsPerBlock) pixels_per_block;
  decltype(&avx512::TransformRow) transform_row;
  decltype(&avx512::ScaleRows) scale_rows;
  decltype(&avx512::ChunkOfGroup) chunk_of_group;
};
constexpr Isa kAvx512{16, avx512::kMaxVectors, avx512::PixelsPerBlock, avx512::TransformRow, avx512::ScaleRows,
                      avx512::ChunkOfGroup};
constexpr Isa kAvx2{8, avx2::kMaxVectors, avx2::PixelsPerBlock, avx2::TransformRow, avx2::ScaleRows,
                    avx2::ChunkOfGroup};

// This CPU's: AVX-512 where it has it, else AVX2 with FMA, else none (oneDNN's kernels then run every 1x1 layer).
// OSPREY_POINTWISE_ISA=avx2 takes AVX2 on an AVX-512 CPU (tests of that path).
const Isa* IsaHere() {
  static const Isa* isa = []() -> const Isa* {
    const char* e = std::getenv("OSPREY_POINTWISE_ISA");
    if (__builtin_cpu_supports("avx512f") && !(e && std::string(e) == "avx2")) return &kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &kAvx2;
    return nullptr;
  }();
  return isa;
}

class PointwiseConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Pointwise"; }

  void Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    isa_ = IsaHere();
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    const int lanes = isa_->lanes;
    vectors_ = (g.out_c + lanes - 1) / lanes;
    const int64_t groups = (vectors_ + isa_->max_vectors - 1) / isa_->max_vectors;
    group_vectors_ = (vectors_ + groups - 1) / groups;
    groups_ = (vectors_ + group_vectors_ - 1) / group_vectors_;
    const int last_lanes = static_cast<int>(g.out_c % lanes == 0 ? lanes : g.out_c % lanes);
    const int64_t width = group_vectors_ * lanes;  // a packed row
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
    const int64_t block = isa_->pixels_per_block(group_vectors_, group_major_), pixels = g.batch * g.out_h * g.out_w;
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
    layer_ = Layer{g.out_c, depth_, vectors_, group_vectors_, k_block_, packed_floats_, last_lanes, group_major_,
                   g.activation};
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
  void ScaleWeights(const float* s, float* scaled) const {
    isa_->scale_rows(packed_, s, scaled, groups_ * g_.in_c, group_vectors_ * isa_->lanes, g_.in_c, threads_);
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

  // Group `group` of pixels [p0, p1) (pointwise_rows.inc); `x` holds the input rows from pixel `x_base` on.
  void ChunkOfGroup(const Inputs& in, const float* x, int64_t x_base, float* y, int64_t p0, int64_t p1,
                    int64_t group) const {
    isa_->chunk_of_group(layer_, in, x, x_base, y, p0, p1, group);
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
          isa_->transform_row(in.parts[i] + p * c, out + first, c, nullptr, in.affine_a ? in.affine_a + first : nullptr,
                       in.affine_a ? in.affine_b + first : nullptr, relu);
          first += c;
        }
      } else {
        const float* s = in.scale ? in.scale + (in.scale_per_image ? p / image_pixels * g_.in_c : 0) : nullptr;
        isa_->transform_row(in.x + p * g_.in_c, out, g_.in_c, s, in.affine_a, in.affine_b, relu);
      }
    }
    return formed;
  }

  OwnConvGeometry g_;
  const Isa* isa_ = nullptr;  // this CPU's loops
  Layer layer_;               // what they read
  int threads_ = 1;
  int64_t vectors_ = 0;        // output channel vectors (of isa_->lanes floats)
  int64_t group_vectors_ = 1;  // vectors per group (the last group may have fewer)
  int64_t groups_ = 1;
  bool group_major_ = false;      // the work goes group by group (large weights), else chunk by chunk
  int64_t k_block_ = 1;           // rows of the product per block (their weights: kWeightTileBytes)
  int64_t chunk_ = 1;             // pixels per work item (see Build)
  int64_t taps_ = 1;              // window positions
  int64_t depth_ = 0;             // the product's inner dimension: taps_ x C
  bool gathered_ = false;         // not a 1x1 stride-1 unpadded window: the input is gathered first (Gather)
  std::shared_ptr<Buffer> packed_buffer_;  // [group][depth_][group_vectors_ * lanes], zeros past the output channels
  const float* packed_ = nullptr;          // its data
  int64_t packed_floats_ = 0;
};

}  // namespace

bool PointwiseConvApplies(const OwnConvGeometry& g) {
  if (!IsaHere() || g.pool_kh > 0 || g.batch <= 0 || g.in_c < 1 || g.in_c > kMaxInputChannels || g.out_c < 16 ||
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
