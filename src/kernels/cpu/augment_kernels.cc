// Fast kernels of the augmentation op GaussianBlur and the dispatch of the augmentation ops (docs/augment.md) to their
// fast kernels: WarpPerspective in augment_warp_axis.cc (uint8, axis-aligned matrices: resize, crop, flip, pad, a
// separable blend) and augment_warp_general.cc (other matrices), the uint8 colour ops and LookupTable in
// augment_color_kernels.cc. The reference kernels in src/kernels/reference/augment.cc are the oracle and state the
// arithmetic. GaussianBlur uint8 (taps in 1/256, as OpenCV) is exact integer arithmetic (AVX2 when the CPU has it);
// float images and BoxBlur accumulate in float where the reference uses double. Augmentation
// runs one image per thread, so the kernels are single-threaded; per-call buffers come from the thread's scratch block.
#pragma GCC optimize("no-trapping-math")  // clamps vectorise as compare-and-select (nothing reads FP flags)
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/image_common.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

using namespace image_kernels;

// ---------------------------------------------------------------- GaussianBlur

// Separable, BORDER_REFLECT_101, float accumulation. Horizontally filtered rows live in a ring of ksize_y rows (slot =
// row % ksize_y): the rows one output row needs lie within ksize_y consecutive rows (or the image is shorter than
// the ring), so each source row is filtered once. Both passes pair the symmetric taps (k[i] == k[n-1-i] exactly).
template <class T>
class GaussianBlurKernel final : public Kernel {
 public:
  explicit GaussianBlurKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    d_ = DimsOf(in_shape_);
    const GaussianBlurTaps taps = GaussianBlurKernels(ctx.node, std::is_same_v<T, uint8_t>);
    kx_.assign(taps.x.begin(), taps.x.end());
    ky_.assign(taps.y.begin(), taps.y.end());
    rx_ = static_cast<int64_t>(kx_.size()) / 2;
    ry_ = static_cast<int64_t>(ky_.size()) / 2;
    // Source column of every position of the border-extended row.
    for (int64_t xe = 0; xe < d_.w + 2 * rx_; ++xe)
      ext_cols_.push_back(BorderIndex(xe - rx_, d_.w, Border::kReflect101));
  }
  const char* Name() const override {
    return std::is_same_v<T, uint8_t> ? "GaussianBlurU8Separable" : "GaussianBlurF32Separable";
  }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    const int64_t c = d_.c, row = d_.w * c, ext_len = (d_.w + 2 * rx_) * c;
    const int64_t ring = static_cast<int64_t>(ky_.size());
    const size_t ext_bytes = cpu::ThreadScratch::Align(ext_len * sizeof(float));
    const size_t row_bytes = cpu::ThreadScratch::Align(row * sizeof(float));
    const size_t rows_bytes = (ring + 1) * row_bytes, index_bytes = cpu::ThreadScratch::Align(ring * sizeof(int64_t));
    char* scratch = cpu::ThreadScratch::Reserve(ext_bytes + rows_bytes + 2 * index_bytes);
    float* ext = reinterpret_cast<float*>(scratch);
    float* acc = reinterpret_cast<float*>(scratch + ext_bytes);
    auto slot = [&](int64_t r) { return reinterpret_cast<float*>(scratch + ext_bytes + (1 + r % ring) * row_bytes); };
    int64_t* slot_row = reinterpret_cast<int64_t*>(scratch + ext_bytes + rows_bytes);  // source row held by a slot
    const float** rows = reinterpret_cast<const float**>(scratch + ext_bytes + rows_bytes + index_bytes);
    for (int64_t b = 0; b < d_.n; ++b) {
      const T* src = ctx.In(0).data<T>() + b * d_.h * row;
      T* dst = ctx.Out(0).data<T>() + b * d_.h * row;
      std::fill(slot_row, slot_row + ring, int64_t{-1});
      for (int64_t y = 0; y < d_.h; ++y) {
        for (int64_t k = 0; k < ring; ++k) {
          const int64_t r = BorderIndex(y + k - ry_, d_.h, Border::kReflect101);
          if (slot_row[r % ring] != r) {
            HorizontalRow(src + r * row, ext, slot(r));
            slot_row[r % ring] = r;
          }
          rows[k] = slot(r);
        }
        VerticalRow(rows, acc, dst + y * row);
      }
    }
  }

 private:
  void HorizontalRow(const T* s, float* ext, float* out) const {
    const int64_t c = d_.c, row = d_.w * c;
    for (int64_t xe = 0; xe < static_cast<int64_t>(ext_cols_.size()); ++xe) {
      const T* p = s + ext_cols_[xe] * c;
      for (int64_t ch = 0; ch < c; ++ch) ext[xe * c + ch] = static_cast<float>(p[ch]);
    }
    const int64_t r = rx_;
    const float center = kx_[r];
    const float* mid = ext + r * c;
#pragma omp simd
    for (int64_t i = 0; i < row; ++i) out[i] = center * mid[i];
    for (int64_t k = 0; k < r; ++k) {
      const float wk = kx_[k];
      const float* a = ext + k * c;
      const float* z = ext + (2 * r - k) * c;
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) out[i] += wk * (a[i] + z[i]);
    }
  }

  void VerticalRow(const float* const* rows, float* acc, T* d) const {
    const int64_t row = d_.w * d_.c, r = ry_;
    const float center = ky_[r];
    const float* mid = rows[r];
#pragma omp simd
    for (int64_t i = 0; i < row; ++i) acc[i] = center * mid[i];
    for (int64_t k = 0; k < r; ++k) {
      const float wk = ky_[k];
      const float* a = rows[k];
      const float* z = rows[2 * r - k];
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) acc[i] += wk * (a[i] + z[i]);
    }
    if constexpr (std::is_same_v<T, uint8_t>) {
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) {
        float v = acc[i];  // clamped by value: std::min/max's references keep the loop scalar
        v = v > 0.f ? v : 0.f;
        v = v < 255.f ? v : 255.f;
        d[i] = static_cast<uint8_t>(static_cast<int>(v + 0.5f));
      }
    } else {
      std::memcpy(d, acc, row * sizeof(float));
    }
  }

  Shape in_shape_, out_shape_;
  ImageDims d_{};
  std::vector<float> kx_, ky_;
  int64_t rx_ = 0, ry_ = 0;
  std::vector<int64_t> ext_cols_;
};

// uint8 taps that are all multiples of 1/256 (every uint8 GaussianBlur: FixedPointTaps256, as OpenCV). Then the
// reference's double sums are exact: the horizontal pass is an integer in 1/256 (at most 255 * 256, so uint16), the
// vertical one an integer in 1/65536 (uint32), and the reference's round-half-up is (v + 32768) >> 16. This kernel
// computes those integers, so it is bit-identical to the reference (and to OpenCV's bit-exact fixed point).
bool FixedPointTaps(const std::vector<double>& taps, std::vector<uint32_t>& out) {
  uint32_t sum = 0;
  out.clear();
  for (double t : taps) {
    const double scaled = t * 256.0;
    if (!(scaled >= 0.0) || scaled > 256.0 || scaled != std::floor(scaled)) return false;
    out.push_back(static_cast<uint32_t>(scaled));
    sum += out.back();
  }
  return sum == 256;
}

#if defined(__x86_64__) || defined(__i386__)
#define OSPREY_BLUR_AVX2 1
// The row functions take the tap count as the template argument kTaps (sizes up to 9, unrolled) or, with kTaps 0, as
// the run-time argument `taps`; the SIMD ones start at element i and return where they stopped.
constexpr int TapCount(int k_taps, int taps) { return k_taps > 0 ? k_taps : taps; }

// 16 elements per step: bytes widened to uint16, multiplied by the tap, summed (no overflow: see above).
template <int kTaps>
__attribute__((target("avx2"))) int64_t BlurRowHorizontalAvx2(const uint8_t* ext, int64_t n, int64_t c,
                                                              const uint32_t* k, int taps, uint16_t* out, int64_t i) {
  __m256i w[kTaps > 0 ? kTaps : 1];
  if constexpr (kTaps > 0)
    for (int t = 0; t < kTaps; ++t) w[t] = _mm256_set1_epi16(static_cast<int16_t>(k[t]));
  for (; i + 16 <= n; i += 16) {
    __m256i acc = _mm256_setzero_si256();
    for (int t = 0; t < TapCount(kTaps, taps); ++t) {
      const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ext + i + t * c)));
      const __m256i wt = kTaps > 0 ? w[t] : _mm256_set1_epi16(static_cast<int16_t>(k[t]));
      acc = _mm256_add_epi16(acc, _mm256_mullo_epi16(x, wt));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), acc);
  }
  return i;
}

// 16 elements per step: 32-bit products from the low and high halves of the 16 x 16-bit multiply.
template <int kTaps>
__attribute__((target("avx2"))) int64_t BlurRowVerticalAvx2(const uint16_t* const* rows, int64_t n, const uint32_t* k,
                                                            int taps, uint8_t* out, int64_t i) {
  __m256i w[kTaps > 0 ? kTaps : 1];
  if constexpr (kTaps > 0)
    for (int t = 0; t < kTaps; ++t) w[t] = _mm256_set1_epi16(static_cast<int16_t>(k[t]));
  const __m256i half = _mm256_set1_epi32(1 << 15);
  for (; i + 16 <= n; i += 16) {
    __m256i acc_lo = half, acc_hi = half;
    for (int t = 0; t < TapCount(kTaps, taps); ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[t] + i));
      const __m256i wt = kTaps > 0 ? w[t] : _mm256_set1_epi16(static_cast<int16_t>(k[t]));
      const __m256i lo = _mm256_mullo_epi16(x, wt), hi = _mm256_mulhi_epu16(x, wt);
      acc_lo = _mm256_add_epi32(acc_lo, _mm256_unpacklo_epi16(lo, hi));
      acc_hi = _mm256_add_epi32(acc_hi, _mm256_unpackhi_epi16(lo, hi));
    }
    const __m256i words = _mm256_packus_epi32(_mm256_srli_epi32(acc_lo, 16), _mm256_srli_epi32(acc_hi, 16));
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(bytes));
  }
  return i;
}

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// BlurRowHorizontalAvx2 with AVX-512 (BW): 32 elements per step.
template <int kTaps>
__attribute__((target("avx512f,avx512bw"))) int64_t BlurRowHorizontalAvx512(const uint8_t* ext, int64_t n, int64_t c,
                                                                          const uint32_t* k, int taps, uint16_t* out, int64_t i) {
  __m512i w[kTaps > 0 ? kTaps : 1];
  if constexpr (kTaps > 0)
    for (int t = 0; t < kTaps; ++t) w[t] = _mm512_set1_epi16(static_cast<int16_t>(k[t]));
  for (; i + 32 <= n; i += 32) {
    __m512i acc = _mm512_setzero_si512();
    for (int t = 0; t < TapCount(kTaps, taps); ++t) {
      const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ext + i + t * c)));
      const __m512i wt = kTaps > 0 ? w[t] : _mm512_set1_epi16(static_cast<int16_t>(k[t]));
      acc = _mm512_add_epi16(acc, _mm512_mullo_epi16(x, wt));
    }
    _mm512_storeu_si512(out + i, acc);
  }
  return i;
}

// BlurRowVerticalAvx2 with AVX-512 (BW): 32 elements per step; the packs keep the order within each 128-bit lane, so
// the words come out in order and vpmovwb narrows them.
template <int kTaps>
__attribute__((target("avx512f,avx512bw"))) int64_t BlurRowVerticalAvx512(const uint16_t* const* rows, int64_t n,
                                                                        const uint32_t* k, int taps, uint8_t* out, int64_t i) {
  __m512i w[kTaps > 0 ? kTaps : 1];
  if constexpr (kTaps > 0)
    for (int t = 0; t < kTaps; ++t) w[t] = _mm512_set1_epi16(static_cast<int16_t>(k[t]));
  const __m512i half = _mm512_set1_epi32(1 << 15);
  for (; i + 32 <= n; i += 32) {
    __m512i acc_lo = half, acc_hi = half;
    for (int t = 0; t < TapCount(kTaps, taps); ++t) {
      const __m512i x = _mm512_loadu_si512(rows[t] + i);
      const __m512i wt = kTaps > 0 ? w[t] : _mm512_set1_epi16(static_cast<int16_t>(k[t]));
      const __m512i lo = _mm512_mullo_epi16(x, wt), hi = _mm512_mulhi_epu16(x, wt);
      acc_lo = _mm512_add_epi32(acc_lo, _mm512_unpacklo_epi16(lo, hi));
      acc_hi = _mm512_add_epi32(acc_hi, _mm512_unpackhi_epi16(lo, hi));
    }
    const __m512i words = _mm512_packus_epi32(_mm512_srli_epi32(acc_lo, 16), _mm512_srli_epi32(acc_hi, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi16_epi8(words));
  }
  return i;
}
#pragma GCC diagnostic pop
#endif

// kSimd: AugmentSimdLevel's 0 (scalar here), 1 (AVX2) or 2 (AVX-512; AVX2 and scalar for the tail).
template <int kTaps, int kSimd>
void BlurRowHorizontalU16(const uint8_t* ext, int64_t n, int64_t c, const uint32_t* k, int taps, uint16_t* out) {
  int64_t i = 0;
#ifdef OSPREY_BLUR_AVX2
  if constexpr (kSimd >= 2) i = BlurRowHorizontalAvx512<kTaps>(ext, n, c, k, taps, out, i);
  if constexpr (kSimd >= 1) i = BlurRowHorizontalAvx2<kTaps>(ext, n, c, k, taps, out, i);
#endif
  for (; i < n; ++i) {
    uint32_t v = 0;
    for (int t = 0; t < TapCount(kTaps, taps); ++t) v += k[t] * ext[i + t * c];
    out[i] = static_cast<uint16_t>(v);
  }
}

template <int kTaps, int kSimd>
void BlurRowVerticalU8(const uint16_t* const* rows, int64_t n, const uint32_t* k, int taps, uint8_t* out) {
  int64_t i = 0;
#ifdef OSPREY_BLUR_AVX2
  if constexpr (kSimd >= 2) i = BlurRowVerticalAvx512<kTaps>(rows, n, k, taps, out, i);
  if constexpr (kSimd >= 1) i = BlurRowVerticalAvx2<kTaps>(rows, n, k, taps, out, i);
#endif
  for (; i < n; ++i) {
    uint32_t v = 1u << 15;
    for (int t = 0; t < TapCount(kTaps, taps); ++t) v += k[t] * static_cast<uint32_t>(rows[t][i]);
    out[i] = static_cast<uint8_t>(v >> 16);
  }
}

using BlurHorizontalFn = void (*)(const uint8_t*, int64_t, int64_t, const uint32_t*, int, uint16_t*);
using BlurVerticalFn = void (*)(const uint16_t* const*, int64_t, const uint32_t*, int, uint8_t*);

// The unrolled row functions for 1 to 9 taps, else the run-time-count ones.
template <int kTaps>
void PickBlurRows(size_t taps, int simd, BlurHorizontalFn* h, BlurVerticalFn* v) {
  if (taps == kTaps || kTaps == 0) {
    if (h)
      *h = simd >= kSimdAvx512  ? BlurRowHorizontalU16<kTaps, 2>
           : simd == kSimdAvx2 ? BlurRowHorizontalU16<kTaps, 1>
                       : BlurRowHorizontalU16<kTaps, 0>;
    if (v)
      *v = simd >= kSimdAvx512  ? BlurRowVerticalU8<kTaps, 2>
           : simd == kSimdAvx2 ? BlurRowVerticalU8<kTaps, 1>
                               : BlurRowVerticalU8<kTaps, 0>;
    return;
  }
  if constexpr (kTaps > 1) PickBlurRows<kTaps - 2>(taps, simd, h, v);
  else PickBlurRows<0>(taps, simd, h, v);
}

// Same structure as GaussianBlurKernel (ring of horizontally filtered rows), in integers.
class GaussianBlurU8FixedKernel final : public Kernel {
 public:
  GaussianBlurU8FixedKernel(const KernelBuildContext& ctx, std::vector<uint32_t> kx, std::vector<uint32_t> ky)
      : shape_(ctx.input_shapes[0]), kx_(std::move(kx)), ky_(std::move(ky)) {
    d_ = DimsOf(shape_);
    rx_ = static_cast<int64_t>(kx_.size()) / 2;
    ry_ = static_cast<int64_t>(ky_.size()) / 2;
    PickBlurRows<9>(kx_.size(), AugmentSimdLevel(), &horizontal_, nullptr);
    PickBlurRows<9>(ky_.size(), AugmentSimdLevel(), nullptr, &vertical_);
    for (int64_t k = 0; k < rx_; ++k) {
      left_cols_.push_back(BorderIndex(k - rx_, d_.w, Border::kReflect101));
      right_cols_.push_back(BorderIndex(d_.w + k, d_.w, Border::kReflect101));
    }
  }
  const char* Name() const override { return "GaussianBlurU8FixedPoint"; }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, shape_, shape_, Name());
    const int64_t c = d_.c, row = d_.w * c, ext_len = (d_.w + 2 * rx_) * c;
    const int64_t ring = static_cast<int64_t>(ky_.size());
    const size_t ext_bytes = cpu::ThreadScratch::Align(ext_len);
    const size_t row_bytes = cpu::ThreadScratch::Align(row * sizeof(uint16_t));
    const size_t index_bytes = cpu::ThreadScratch::Align(ring * sizeof(int64_t));
    char* scratch = cpu::ThreadScratch::Reserve(ext_bytes + ring * row_bytes + 2 * index_bytes);
    uint8_t* ext = reinterpret_cast<uint8_t*>(scratch);
    auto slot = [&](int64_t r) { return reinterpret_cast<uint16_t*>(scratch + ext_bytes + (r % ring) * row_bytes); };
    int64_t* slot_row = reinterpret_cast<int64_t*>(scratch + ext_bytes + ring * row_bytes);
    const uint16_t** rows = reinterpret_cast<const uint16_t**>(scratch + ext_bytes + ring * row_bytes + index_bytes);
    for (int64_t b = 0; b < d_.n; ++b) {
      const uint8_t* src = ctx.In(0).data<uint8_t>() + b * d_.h * row;
      uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * d_.h * row;
      std::fill(slot_row, slot_row + ring, int64_t{-1});
      for (int64_t y = 0; y < d_.h; ++y) {
        for (int64_t k = 0; k < ring; ++k) {
          const int64_t r = BorderIndex(y + k - ry_, d_.h, Border::kReflect101);
          if (slot_row[r % ring] != r) {
            const uint8_t* s = src + r * row;
            for (int64_t k2 = 0; k2 < rx_; ++k2) {
              std::memcpy(ext + k2 * c, s + left_cols_[k2] * c, c);
              std::memcpy(ext + (rx_ + d_.w + k2) * c, s + right_cols_[k2] * c, c);
            }
            std::memcpy(ext + rx_ * c, s, row);
            horizontal_(ext, row, c, kx_.data(), static_cast<int>(kx_.size()), slot(r));
            slot_row[r % ring] = r;
          }
          rows[k] = slot(r);
        }
        vertical_(rows, row, ky_.data(), static_cast<int>(ky_.size()), dst + y * row);
      }
    }
  }

 private:
  Shape shape_;
  ImageDims d_{};
  std::vector<uint32_t> kx_, ky_;
  int64_t rx_ = 0, ry_ = 0;
  std::vector<int64_t> left_cols_, right_cols_;
  BlurHorizontalFn horizontal_ = nullptr;
  BlurVerticalFn vertical_ = nullptr;
};

template <template <class> class K>
std::unique_ptr<Kernel> ByDType(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes[0] == DType::kU8) return std::make_unique<K<uint8_t>>(ctx);
  if (ctx.input_dtypes[0] == DType::kF32) return std::make_unique<K<float>>(ctx);
  return nullptr;
}

}  // namespace

// cpu_kernels.h
int AugmentSimdLevel() {
  static const int cpu = [] {
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx2"))
      return kSimdAvx512;
    if (__builtin_cpu_supports("avx2")) return kSimdAvx2;
#endif
    return 0;
  }();
  const char* cap = std::getenv("OSPREY_AUGMENT_SIMD");
  if (!cap) return cpu;
  const std::string name = cap;
  if (name == "sse4") return 0;
  if (name == "avx2") return std::min(cpu, kSimdAvx2);
  return cpu;
}

std::unique_ptr<Kernel> CreateAugmentColorKernel(const KernelBuildContext& ctx);  // augment_color_kernels.cc
std::unique_ptr<Kernel> CreateWarpGeneralKernel(const KernelBuildContext& ctx);   // augment_warp_general.cc
std::unique_ptr<Kernel> CreateWarpAxisAlignedU8Kernel(const KernelBuildContext& ctx,
                                                      const double* m);  // augment_warp_axis.cc

/// Fast kernels for WarpPerspective, GaussianBlur, LookupTable and the uint8 colour ops, or nullptr (other ops run
/// their reference kernels).
std::unique_ptr<Kernel> CreateAugmentKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (std::unique_ptr<Kernel> k = CreateAugmentColorKernel(ctx)) return k;
  if (op != "WarpPerspective" && op != "GaussianBlur" && op != "BoxBlur") return nullptr;
  if (ctx.input_dtypes.empty() || ctx.input_shapes.empty() || ctx.output_shapes.empty()) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  if (in.size() != 3 && in.size() != 4) return nullptr;
  if (op == "WarpPerspective") {
    const std::vector<float> mf = ctx.node.GetFloats("matrix");
    double m[9];
    for (int i = 0; i < 9; ++i) m[i] = mf[i];
    if (std::unique_ptr<Kernel> k = CreateWarpAxisAlignedU8Kernel(ctx, m)) return k;
    return CreateWarpGeneralKernel(ctx);
  }
  const GaussianBlurTaps taps = GaussianBlurKernels(ctx.node, ctx.input_dtypes[0] == DType::kU8);
  if (ctx.input_dtypes[0] == DType::kU8) {
    std::vector<uint32_t> kx, ky;
    if (FixedPointTaps(taps.x, kx) && FixedPointTaps(taps.y, ky))
      return std::make_unique<GaussianBlurU8FixedKernel>(ctx, std::move(kx), std::move(ky));
  }
  // The float kernel pairs symmetric taps around a centre: odd sizes only. Even BoxBlur sizes (cv2.blur's anchor at
  // size / 2) run the reference kernel.
  if (taps.x.size() % 2 == 0 || taps.y.size() % 2 == 0) return nullptr;
  return ByDType<GaussianBlurKernel>(ctx);
}

}  // namespace osprey
