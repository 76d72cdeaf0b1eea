// Fast uint8 WarpPerspective for axis-aligned matrices (m1 = m3 = 0, last row 0, 0, 1): pure scale + translate,
// negative scales (flips) included. That is every resize, crop, RandomResizedCrop, LongestMaxSize, PadIfNeeded and
// flip, and most warps of a detection pipeline. The general kernel is in augment_kernels.cc; the reference kernel
// (src/kernels/reference/augment.cc) is the oracle, and this kernel is bit-identical to it:
//
// - Positions: output column x reads source position qx = round((m0 * 32) * x + m2 * 32) in 1/32 pixels and output row
//   y reads qy = round((m4 * y + m5) * 32) — the general kernel's affine expressions (with m1 = m3 = 0 the other
//   term is an exact 0), which equal the reference's. They depend on x alone and on y alone, so they are computed
//   once per kernel.
// - Bilinear weights are products of the 5-bit fractions ax = qx & 31, ay = qy & 31, so the 2-D sum separates exactly:
//   h = (32 - ax) * a + ax * b per source row (at most 32 * 255, int16), v = (32 - ay) * h0 + ay * h1 (int32), and the
//   reference's double value is exactly v / 1024, which it rounds half up: (v + 512) >> 10.
// - Borders: a tap outside the image reads the cv::borderInterpolate pixel, or the border value (constant). A source
//   row outside the image with a constant border is a row of border values (h = 32 * border value). A tap with
//   weight 0 (fraction 0) contributes nothing, so a position exactly on the last column or row needs no border (the
//   SIMD pass still loads the byte after it, from inside the buffer, and multiplies it by 0).
//
// Each needed source row is filtered horizontally once into an int16 row (two cached rows: consecutive output rows
// mostly share source rows), then each output row is a vertical blend of two filtered rows. Columns whose two taps are
// adjacent pixels inside the image form one contiguous run (the position is monotonic in x) and are filtered with
// AVX2 when the CPU has it; the other columns (borders) take a scalar path with border-interpolated indices. Nearest,
// and bilinear rows on whole pixels (every fraction 0: crops, pads, flips), are gathers of source pixels instead.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OSPREY_WARP_AXIS_AVX2 1
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/image_common.h"
#include "ops/op_registry.h"

namespace osprey {

namespace {

using namespace image_kernels;

// The general kernel's uint8 border value: the attribute saturated and rounded half up.
uint8_t BorderValueU8(float v) {
  if (!(v > 0.f)) return 0;
  if (v >= 255.f) return 255;
  return static_cast<uint8_t>(static_cast<int>(v + 0.5f));
}

// Round to nearest, ties to even, after clamping to int (the general kernel's RoundToInt, the reference's
// nearbyint(clamp(v))).
int32_t RoundToInt(double v) {
  v = std::min(std::max(v, static_cast<double>(INT_MIN)), static_cast<double>(INT_MAX));
  return static_cast<int32_t>(std::nearbyint(v));
}

// ---------------------------------------------------------------- row primitives

// Extra bytes a horizontal pass may read past the last pixel of a row (8-byte pair loads, 4-byte gathers); the
// image's last row is copied into a buffer with this much slack.
constexpr int64_t kRowReadSlack = 16;
// Extra int16 elements a horizontal pass may write past a row's end (overlapping 32-byte stores).
constexpr int64_t kRowWriteSlack = 32;

// Per-column data of the run of inside columns, in the layouts the SIMD passes load directly.
struct DirectColumns {
  int64_t begin = 0, end = 0;   // output columns [begin, end)
  std::vector<int32_t> offset;  // byte offset of the left tap in the source row
  std::vector<uint8_t> frac;    // ax
  // pmaddubsw weights: C = 1: 4 bytes per column (32 - ax, ax, 0, 0); C = 3: 16 bytes per column pair
  // ((32 - ax, ax) x 3 for each column, then 4 zeros); C = 4: 8 bytes per column ((32 - ax, ax) x 4).
  std::vector<uint8_t> weights;
};

template <int kC>
void HorizontalDirectScalar(const uint8_t* row, const DirectColumns& cols, int64_t from, int16_t* out) {
  for (int64_t k = from; k < cols.end - cols.begin; ++k) {
    const uint8_t* p = row + cols.offset[k];
    const int ax = cols.frac[k];
    int16_t* o = out + (cols.begin + k) * kC;
    for (int ch = 0; ch < kC; ++ch) o[ch] = static_cast<int16_t>((32 - ax) * p[ch] + ax * p[kC + ch]);
  }
}

void VerticalScalar(const int16_t* h0, const int16_t* h1, int ay, int64_t from, int64_t n, uint8_t* out) {
  for (int64_t i = from; i < n; ++i) out[i] = static_cast<uint8_t>(((32 - ay) * h0[i] + ay * h1[i] + 512) >> 10);
}

#ifdef OSPREY_WARP_AXIS_AVX2
// Two 8-byte loads per 128-bit lane: lane 0 holds the taps of columns k, k + 1, lane 1 those of k + 2, k + 3.
__attribute__((target("avx2"))) inline __m256i LoadPairs4(const uint8_t* row, const int32_t* offset) {
  const __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + offset[0])),
                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + offset[1])));
  const __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + offset[2])),
                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + offset[3])));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Returns the number of direct columns done (a multiple of the step); the scalar pass does the rest.
__attribute__((target("avx2"))) int64_t HorizontalDirectC1Avx2(const uint8_t* row, const DirectColumns& cols,
                                                               int16_t* out) {
  const int64_t n = cols.end - cols.begin;
  int16_t* o = out + cols.begin;
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    // 4 bytes from each left tap: (left, right, junk, junk) against weights (32 - ax, ax, 0, 0).
    const __m256i t0 = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row),
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.offset[k])), 1);
    const __m256i t1 =
        _mm256_i32gather_epi32(reinterpret_cast<const int*>(row),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.offset[k + 8])), 1);
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.weights[k * 4]));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.weights[k * 4 + 32]));
    const __m256i h0 = _mm256_maddubs_epi16(t0, w0), h1 = _mm256_maddubs_epi16(t1, w1);  // 32-bit lanes (h, 0)
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h0, h1), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k), packed);
  }
  return k;
}

__attribute__((target("avx2"))) int64_t HorizontalDirectC3Avx2(const uint8_t* row, const DirectColumns& cols,
                                                               int16_t* out) {
  const int64_t n = cols.end - cols.begin;
  int16_t* o = out + cols.begin * 3;
  // Per lane: (a0, b0, a1, b1, a2, b2) of the first column at bytes 0..5, of the second at 6..11.
  const __m256i pair_cols = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, 8, 11, 9, 12, 10, 13, -1, -1, -1, -1,  //
                                             0, 3, 1, 4, 2, 5, 8, 11, 9, 12, 10, 13, -1, -1, -1, -1);
  const __m256i compact = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    const __m256i pairs = _mm256_shuffle_epi8(LoadPairs4(row, &cols.offset[k]), pair_cols);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.weights[k / 2 * 16]));
    // 6 values per lane, then the 12 of the 4 columns moved together; the 4 junk values past them are overwritten by
    // the next store or the scalar passes.
    const __m256i h = _mm256_permutevar8x32_epi32(_mm256_maddubs_epi16(pairs, w), compact);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k * 3), h);
  }
  return k;
}

__attribute__((target("avx2"))) int64_t HorizontalDirectC4Avx2(const uint8_t* row, const DirectColumns& cols,
                                                               int16_t* out) {
  const int64_t n = cols.end - cols.begin;
  int16_t* o = out + cols.begin * 4;
  const __m256i pair_cols = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15,  //
                                             0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    const __m256i pairs = _mm256_shuffle_epi8(LoadPairs4(row, &cols.offset[k]), pair_cols);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cols.weights[k * 8]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k * 4), _mm256_maddubs_epi16(pairs, w));
  }
  return k;
}

// Eight direct columns of an RGB row (C = 3) for HorizontalDirectC3Vbmi: their taps lie in the `mask` bytes from
// `base`, and `index` picks (a0, b0, a1, b1, a2, b2) of each column from them, against `weights` (32 - ax, ax) x 3.
struct VbmiColumns8 {
  alignas(64) uint8_t index[64];
  alignas(64) uint8_t weights[64];
  int32_t base = 0;
  uint64_t mask = 0;
};

// HorizontalDirectC3Avx2 with AVX-512 VBMI: one masked load, one byte permute and one multiply-add per 8 columns
// (24 values); the 8 junk values past them are overwritten by the next store or the scalar passes. (GCC 12's VBMI
// intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined: a known false positive.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t HorizontalDirectC3Vbmi(
    const uint8_t* row, const std::vector<VbmiColumns8>& groups, int64_t begin, int16_t* out) {
  int16_t* o = out + begin * 3;
  for (const VbmiColumns8& g : groups) {
    const __m512i taps = _mm512_permutexvar_epi8(_mm512_load_si512(g.index), _mm512_maskz_loadu_epi8(g.mask, row + g.base));
    _mm512_storeu_si512(o, _mm512_maddubs_epi16(taps, _mm512_load_si512(g.weights)));
    o += 24;
  }
  return static_cast<int64_t>(groups.size()) * 8;
}
#pragma GCC diagnostic pop

// 16 blended values (int16, in order) of h0[0..15] and h1[0..15]: (h0, h1) pairs against w = (32 - ay, ay) with
// pmaddwd, + 512, >> 10.
__attribute__((target("avx2"))) inline __m256i Blend16(const int16_t* h0, const int16_t* h1, __m256i w) {
  const __m256i round = _mm256_set1_epi32(512);
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h0));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h1));
  const __m256i lo = _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w), round), 10);
  const __m256i hi = _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w), round), 10);
  return _mm256_packs_epi32(lo, hi);
}

// 32 outputs per step, packed to bytes.
__attribute__((target("avx2"))) int64_t VerticalAvx2(const int16_t* h0, const int16_t* h1, int ay, int64_t n,
                                                     uint8_t* out) {
  const __m256i w = _mm256_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(ay) << 16) | (32 - ay)));
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i packed = _mm256_packus_epi16(Blend16(h0 + i, h1 + i, w), Blend16(h0 + i + 16, h1 + i + 16, w));
    const __m256i bytes = _mm256_permute4x64_epi64(packed, 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
  }
  return i;
}

// VerticalAvx2 with AVX-512 (BW): 64 outputs per step. (GCC 12's -Wmaybe-uninitialized false positive, as above.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512bw"))) int64_t VerticalAvx512(const int16_t* h0, const int16_t* h1, int ay,
                                                                   int64_t n, uint8_t* out) {
  const __m512i w = _mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(ay) << 16) | (32 - ay)));
  const __m512i round = _mm512_set1_epi32(512);
  // 32 blended values in order (each 128-bit lane's unpacks and pack keep its 8 values in place).
  auto blend32 = [&](int64_t i) __attribute__((target("avx512f,avx512bw"), always_inline)) {
    const __m512i a = _mm512_loadu_si512(h0 + i), b = _mm512_loadu_si512(h1 + i);
    const __m512i lo = _mm512_srai_epi32(_mm512_add_epi32(_mm512_madd_epi16(_mm512_unpacklo_epi16(a, b), w), round), 10);
    const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(_mm512_madd_epi16(_mm512_unpackhi_epi16(a, b), w), round), 10);
    return _mm512_packs_epi32(lo, hi);
  };
  // packus interleaves the two halves by 128-bit lane (qwords A0 B0 A1 B1 ...): put A's four first.
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(out + i, _mm512_permutexvar_epi64(order, _mm512_packus_epi16(blend32(i), blend32(i + 32))));
  return i;
}
#pragma GCC diagnostic pop
#endif

// ---------------------------------------------------------------- kernel

class WarpAxisAlignedU8Kernel final : public Kernel {
 public:
  WarpAxisAlignedU8Kernel(const KernelBuildContext& ctx, const double* m)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    nearest_ = ctx.node.GetString("mode", "bilinear") == "nearest";
    border_ = BorderOf(ctx.node.GetString("border_mode", "constant"));
    border_value_ = BorderValueU8(ctx.node.GetFloat("border_value", 0.f));
    name_ = std::string("WarpPerspectiveU8") + (nearest_ ? "Nearest" : "Bilinear") + "AxisAligned";
#ifdef OSPREY_WARP_AXIS_AVX2
    simd_ = AugmentSimdLevel();
    avx2_ = simd_ >= kSimdAvx2;
#endif
    const double unit = nearest_ ? 1.0 : 32.0;
    const double sx = m[0] * unit, bxs = m[2] * unit;
    for (int64_t x = 0; x < out_.w; ++x) {
      const int32_t q = RoundToInt(sx * static_cast<double>(x) + bxs);
      if (nearest_) {
        const int64_t sxi = BorderIndex(q, in_.w, border_);
        col_offset_.push_back(sxi < 0 ? -1 : static_cast<int32_t>(sxi * in_.c));
      } else {
        AddBilinearColumn(x, q);
      }
    }
    for (int64_t y = 0; y < out_.h; ++y) {
      const int32_t q = RoundToInt((m[4] * static_cast<double>(y) + m[5]) * unit);
      if (nearest_) {
        rows_.push_back({BorderIndex(q, in_.h, border_), -1, 0});
      } else {
        const int64_t y0 = q >> 5;
        const int ay = q & 31;
        const int64_t r0 = BorderIndex(y0, in_.h, border_);
        rows_.push_back({r0, ay == 0 ? r0 : BorderIndex(y0 + 1, in_.h, border_), ay});
      }
    }
    if (!nearest_) BuildDirectWeights();
    if (nearest_ || integer_cols_) BuildGatherRuns();
  }
  const char* Name() const override { return name_.c_str(); }

  void Run(KernelContext& ctx) override {
    if (ctx.In(0).shape() != in_shape_ || ctx.Out(0).shape() != out_shape_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + " was built for " +
                                            ShapeToString(in_shape_) + " -> " + ShapeToString(out_shape_) + ", got " +
                                            ShapeToString(ctx.In(0).shape()) + " -> " +
                                            ShapeToString(ctx.Out(0).shape()));
    const int64_t in_row = in_.w * in_.c, out_row = out_.w * out_.c;
    const size_t h_bytes = cpu::ThreadScratch::Align((out_row + kRowWriteSlack) * sizeof(int16_t));
    const size_t last_bytes = cpu::ThreadScratch::Align(in_row + kRowReadSlack);
    char* scratch = cpu::ThreadScratch::Reserve(2 * h_bytes + last_bytes);
    int16_t* slots[2] = {reinterpret_cast<int16_t*>(scratch), reinterpret_cast<int16_t*>(scratch + h_bytes)};
    uint8_t* last_row = reinterpret_cast<uint8_t*>(scratch + 2 * h_bytes);
    for (int64_t b = 0; b < out_.n; ++b) {
      const uint8_t* image = ctx.In(0).data<uint8_t>() + b * in_.h * in_row;
      uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * out_.h * out_row;
      // The row passes read a few bytes past a row's last pixel: inside the image except on its last row, which is
      // read from a copy with slack.
      std::memcpy(last_row, image + (in_.h - 1) * in_row, in_row);
      std::memset(last_row + in_row, 0, kRowReadSlack);
      auto source_row = [&](int64_t r) { return r == in_.h - 1 ? last_row : image + r * in_row; };
      int64_t held[2] = {kNoRow, kNoRow};  // source row filtered into each slot
      int64_t gathered = kNoRow;           // source row the previous output row is a gather of
      auto find = [&](int64_t r) { return held[0] == r ? 0 : held[1] == r ? 1 : -1; };
      auto fill = [&](int s, int64_t r) {
        held[s] = r;
        if (r < 0) {
          std::fill(slots[s], slots[s] + out_row, static_cast<int16_t>(32 * border_value_));
        } else {
          Horizontal(source_row(r), slots[s]);
        }
      };
      for (int64_t y = 0; y < out_.h; ++y) {
        const RowTaps& t = rows_[y];
        uint8_t* d = dst + y * out_row;
        if (t.r0 < 0 && t.r1 < 0) {  // both source rows are border-value rows
          std::memset(d, border_value_, out_row);
          gathered = kNoRow;
          continue;
        }
        // Nearest, or bilinear on whole pixels (fractions 0: the left / top tap alone): a gather of source pixels;
        // an output row that reads the same source row as the previous one is a copy of it.
        if (nearest_ || (integer_cols_ && t.ay == 0)) {
          if (t.r0 == gathered) {
            std::memcpy(d, d - out_row, out_row);
          } else {
            GatherRow(source_row(t.r0), d);
            gathered = t.r0;
          }
          continue;
        }
        gathered = kNoRow;
        int s0 = find(t.r0), s1 = t.r1 == t.r0 ? s0 : find(t.r1);
        if (s0 < 0) {
          s0 = s1 == 0 ? 1 : 0;
          fill(s0, t.r0);
        }
        if (s1 < 0) {
          s1 = 1 - s0;
          fill(s1, t.r1);
        }
        int64_t done = 0;
#ifdef OSPREY_WARP_AXIS_AVX2
        if (simd_ >= kSimdAvx512) done = VerticalAvx512(slots[s0], slots[s1], t.ay, out_row, d);
        if (avx2_) done += VerticalAvx2(slots[s0] + done, slots[s1] + done, t.ay, out_row - done, d + done);
#endif
        VerticalScalar(slots[s0], slots[s1], t.ay, done, out_row, d);
      }
    }
  }

 private:
  static constexpr int64_t kNoRow = INT64_MIN;

  // Source rows of an output row: r0, r1 (bilinear; -1: border-value row) and the fraction ay; nearest: r0 only.
  struct RowTaps {
    int64_t r0, r1;
    int ay;
  };
  struct GatherRun {
    int64_t begin, end;  // output columns
    int32_t offset;      // byte offset of the first source pixel, -1: border value
    int32_t step;        // bytes from one source pixel to the next: c, or -c (a mirrored run: flips); 0 when one pixel
  };
  // A column outside the direct run: its two source pixel indices (-1: border value) and fraction.
  struct BorderColumn {
    int64_t x, i0, i1;
    int ax;
  };

  void AddBilinearColumn(int64_t x, int32_t q) {
    const int64_t x0 = q >> 5;
    const int ax = q & 31;
    // Inside: both taps in the image, or the right tap has weight 0 (ax = 0) and the left one is inside.
    const bool inside = x0 >= 0 && (x0 + 1 < in_.w || (ax == 0 && x0 < in_.w));
    const bool extends_run = direct_.offset.empty() || direct_.end == x;
    const int64_t left = BorderIndex(x0, in_.w, border_);
    col_offset_.push_back(left < 0 ? -1 : static_cast<int32_t>(left * in_.c));
    integer_cols_ = integer_cols_ && ax == 0;
    if (inside && extends_run) {
      if (direct_.offset.empty()) direct_.begin = x;
      direct_.end = x + 1;
      direct_.offset.push_back(static_cast<int32_t>(x0 * in_.c));
      direct_.frac.push_back(static_cast<uint8_t>(ax));
      return;
    }
    const int64_t i0 = BorderIndex(x0, in_.w, border_);
    border_cols_.push_back({x, i0, ax == 0 ? i0 : BorderIndex(x0 + 1, in_.w, border_), ax});
  }

  void BuildDirectWeights() {
    const int64_t n = direct_.end - direct_.begin, c = in_.c;
    direct_.weights.assign(static_cast<size_t>(n * 8 + 64), 0);
    for (int64_t k = 0; k < n; ++k) {
      const uint8_t a = direct_.frac[k], na = static_cast<uint8_t>(32 - a);
      // C = 3: columns 2j and 2j + 1 share a 16-byte block; C = 1 and 4: 4 or 8 bytes per column.
      uint8_t* w = c == 3 ? &direct_.weights[k / 2 * 16 + (k % 2) * 6] : &direct_.weights[k * (c == 1 ? 4 : 8)];
      for (int64_t ch = 0; ch < c; ++ch) w[2 * ch] = na, w[2 * ch + 1] = a;
    }
#ifdef OSPREY_WARP_AXIS_AVX2
    // RGB with VBMI: groups of 8 columns whose taps span at most 64 bytes (any scale down to 1/2.4); else AVX2.
    if (c != 3 || AugmentSimdLevel() < kSimdAvx512) return;
    for (int64_t k = 0; k + 8 <= n; k += 8) {
      VbmiColumns8 g;
      // Offsets rise along the run, or fall (flips).
      g.base = std::min(direct_.offset[k], direct_.offset[k + 7]);
      const int64_t span = std::max(direct_.offset[k], direct_.offset[k + 7]) + 6 - g.base;
      if (span > 64) {
        vbmi_columns_.clear();
        return;
      }
      g.mask = span == 64 ? ~uint64_t{0} : (uint64_t{1} << span) - 1;
      for (int j = 0; j < 8; ++j) {
        const int32_t o = direct_.offset[k + j] - g.base;
        const uint8_t a = direct_.frac[k + j], na = static_cast<uint8_t>(32 - a);
        for (int ch = 0; ch < 3; ++ch) {
          g.index[6 * j + 2 * ch] = static_cast<uint8_t>(o + ch), g.index[6 * j + 2 * ch + 1] = static_cast<uint8_t>(o + 3 + ch);
          g.weights[6 * j + 2 * ch] = na, g.weights[6 * j + 2 * ch + 1] = a;
        }
      }
      std::fill(g.index + 48, g.index + 64, uint8_t{0});
      std::fill(g.weights + 48, g.weights + 64, uint8_t{0});
      vbmi_columns_.push_back(g);
    }
#endif
  }

  void Horizontal(const uint8_t* row, int16_t* out) const {
    int64_t done = 0;
    switch (in_.c) {
      case 1:
#ifdef OSPREY_WARP_AXIS_AVX2
        if (avx2_) done = HorizontalDirectC1Avx2(row, direct_, out);
#endif
        HorizontalDirectScalar<1>(row, direct_, done, out);
        break;
      case 3:
#ifdef OSPREY_WARP_AXIS_AVX2
        if (!vbmi_columns_.empty())
          done = HorizontalDirectC3Vbmi(row, vbmi_columns_, direct_.begin, out);
        else if (avx2_)
          done = HorizontalDirectC3Avx2(row, direct_, out);
#endif
        HorizontalDirectScalar<3>(row, direct_, done, out);
        break;
      default:
#ifdef OSPREY_WARP_AXIS_AVX2
        if (avx2_) done = HorizontalDirectC4Avx2(row, direct_, out);
#endif
        HorizontalDirectScalar<4>(row, direct_, done, out);
        break;
    }
    const int64_t c = in_.c;
    const int bv = border_value_;
    for (const BorderColumn& col : border_cols_) {
      int16_t* o = out + col.x * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        const int a = col.i0 < 0 ? bv : row[col.i0 * c + ch], b = col.i1 < 0 ? bv : row[col.i1 * c + ch];
        o[ch] = static_cast<int16_t>((32 - col.ax) * a + col.ax * b);
      }
    }
  }

  // Column runs of a gather: a border-value run, or source pixels copied in order (a crop or pad is a few runs).
  void BuildGatherRuns() {
    const int64_t c = in_.c;
    for (int64_t x = 0; x < out_.w; ++x) {
      const int32_t o = col_offset_[x];
      if (!gather_runs_.empty()) {
        GatherRun& last = gather_runs_.back();
        if (o < 0 && last.offset < 0) {
          last.end = x + 1;
          continue;
        }
        if (o >= 0 && last.offset >= 0) {
          if (last.step == 0 && (o == last.offset + c || o == last.offset - c))
            last.step = o - last.offset;  // a run's second pixel sets its direction
          if (last.step != 0 && o == last.offset + (x - last.begin) * last.step) {
            last.end = x + 1;
            continue;
          }
        }
      }
      gather_runs_.push_back({x, x + 1, o, 0});
    }
    // Short runs (resizes) gather pixel by pixel instead.
    if (static_cast<int64_t>(gather_runs_.size()) * 16 > out_.w) gather_runs_.clear();
  }

  // n pixels from `last` backwards (last, last - 1 pixel, ...) to d forwards.
  void MirrorCopy(const uint8_t* last, int64_t n, uint8_t* d) const {
    switch (in_.c) {
      case 1:
        for (int64_t k = 0; k < n; ++k) d[k] = last[-k];
        return;
      case 3: {
        int64_t k = 0;
#ifdef __SSSE3__
        // Five pixels per step: the 16 bytes ending one byte past `last`'s pixel (the row has slack past its end)
        // with the pixel order reversed; the 16th byte stored is overwritten by the next step (while 6 pixels remain).
        const __m128i mirror = _mm_setr_epi8(12, 13, 14, 9, 10, 11, 6, 7, 8, 3, 4, 5, 0, 1, 2, -1);
        for (; k + 6 <= n; k += 5, d += 15, last -= 15)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d),
                           _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(last - 12)), mirror));
#endif
        for (; k < n; ++k, d += 3, last -= 3) d[0] = last[0], d[1] = last[1], d[2] = last[2];
        return;
      }
      case 4:
        for (int64_t k = 0; k < n; ++k) std::memcpy(d + 4 * k, last - 4 * k, 4);
        return;
      default:
        for (int64_t k = 0; k < n; ++k) std::memcpy(d + k * in_.c, last - k * in_.c, in_.c);
    }
  }

  void GatherRow(const uint8_t* s, uint8_t* d) const {
    const int64_t c = in_.c;
    if (!gather_runs_.empty()) {
      for (const GatherRun& run : gather_runs_) {
        if (run.offset < 0) {
          std::memset(d + run.begin * c, border_value_, (run.end - run.begin) * c);
        } else if (run.step >= 0) {
          std::memcpy(d + run.begin * c, s + run.offset, (run.end - run.begin) * c);
        } else {
          MirrorCopy(s + run.offset, run.end - run.begin, d + run.begin * c);
        }
      }
      return;
    }
    const int32_t* offset = col_offset_.data();
    const int64_t w = out_.w;
    const uint32_t fill = 0x01010101u * border_value_;
    switch (c) {
      case 1:
        for (int64_t x = 0; x < w; ++x) d[x] = offset[x] < 0 ? border_value_ : s[offset[x]];
        break;
      case 3:
        // 4-byte copies whose 4th byte the next pixel overwrites (the source row has slack past its end).
        for (int64_t x = 0; x + 1 < w; ++x) {
          uint32_t v = fill;
          if (offset[x] >= 0) std::memcpy(&v, s + offset[x], 4);
          std::memcpy(d + x * 3, &v, 4);
        }
        if (w > 0) {
          if (offset[w - 1] < 0) {
            std::memset(d + (w - 1) * 3, border_value_, 3);
          } else {
            std::memcpy(d + (w - 1) * 3, s + offset[w - 1], 3);
          }
        }
        break;
      default:
        for (int64_t x = 0; x < w; ++x) {
          uint32_t v = fill;
          if (offset[x] >= 0) std::memcpy(&v, s + offset[x], 4);
          std::memcpy(d + x * 4, &v, 4);
        }
        break;
    }
  }

  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  bool nearest_ = false, avx2_ = false;
  int simd_ = 0;  // AugmentSimdLevel()
  Border border_ = Border::kConstant;
  uint8_t border_value_ = 0;
  std::string name_;
  std::vector<RowTaps> rows_;
  DirectColumns direct_;                   // bilinear
  std::vector<BorderColumn> border_cols_;  // bilinear
  std::vector<VbmiColumns8> vbmi_columns_;  // bilinear RGB with VBMI: the direct run's whole groups of 8 columns
  // Gathers (nearest, or bilinear whose columns all have fraction 0): byte offset of each column's source pixel
  // (-1: border value), and its runs.
  bool integer_cols_ = true;
  std::vector<int32_t> col_offset_;
  std::vector<GatherRun> gather_runs_;
};

}  // namespace

/// The axis-aligned uint8 WarpPerspective kernel, or nullptr when the node is not one (then the general kernel runs).
/// `m` is the node's matrix as doubles.
std::unique_ptr<Kernel> CreateWarpAxisAlignedU8Kernel(const KernelBuildContext& ctx, const double* m) {
  if (ctx.input_dtypes[0] != DType::kU8) return nullptr;
  if (!(m[1] == 0.0 && m[3] == 0.0 && m[6] == 0.0 && m[7] == 0.0 && m[8] == 1.0)) return nullptr;
  // Non-finite entries would make the positions NaN, whose clamping differs between the scalar and SIMD forms of the
  // general kernel: leave them to it.
  for (int i = 0; i < 9; ++i)
    if (!std::isfinite(m[i])) return nullptr;
  const ImageDims in = DimsOf(ctx.input_shapes[0]), out = DimsOf(ctx.output_shapes[0]);
  if (in.c != 1 && in.c != 3 && in.c != 4) return nullptr;
  if (in.h < 1 || in.w < 1 || in.n != out.n || in.w * in.c > INT32_MAX / 2) return nullptr;
  return std::make_unique<WarpAxisAlignedU8Kernel>(ctx, m);
}

}  // namespace osprey
