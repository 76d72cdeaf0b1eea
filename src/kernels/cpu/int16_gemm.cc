#include "kernels/cpu/int16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace osprey::cpu {
namespace {

// Rows x 16 columns of C over `kp` of K (even): 2 x `kRows` accumulators of 8 int32, started from C when `add` (a
// later slice of K), else from zero.
template <int kRows>
__attribute__((target("avx2"))) void Block(const int16_t* a, int64_t lda, int64_t kp, const int16_t* panel, int32_t* c,
                                           int64_t ldc, int64_t cols, bool add) {
  __m256i acc[kRows][2];
  alignas(32) int32_t tmp[kInt16PanelCols] = {};
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    if (!add) {
      acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      continue;
    }
    const int32_t* row = c + r * ldc;
    if (cols < kInt16PanelCols) row = static_cast<const int32_t*>(std::memcpy(tmp, row, cols * sizeof(int32_t)));
    acc[r][0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    acc[r][1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 8));
  }
  for (int64_t k = 0; k < kp; k += 2) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * kInt16PanelCols));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * kInt16PanelCols + 16));
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + k, sizeof(pair));
      const __m256i av = _mm256_set1_epi32(pair);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(av, b0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(av, b1));
    }
  }
  for (int r = 0; r < kRows; ++r) {
    int32_t* row = c + r * ldc;
    if (cols == kInt16PanelCols) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), acc[r][0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 8), acc[r][1]);
    } else {
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[r][0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8), acc[r][1]);
      std::memcpy(row, tmp, static_cast<size_t>(cols) * sizeof(int32_t));
    }
  }
}

using BlockFn = void (*)(const int16_t*, int64_t, int64_t, const int16_t*, int32_t*, int64_t, int64_t, bool);
// 4 rows: 8 accumulators, 2 panel vectors, a broadcast and a product in registers (6 rows spilled to the stack: 44
// against 58 GMAC/s on one Zen 3 thread).
constexpr int kMaxRows = 4;
constexpr BlockFn kBlocks[kMaxRows + 1] = {nullptr, Block<1>, Block<2>, Block<3>, Block<4>};

}  // namespace

bool Int16GemmAvailable() {
  static const bool available = __builtin_cpu_supports("avx2");
  return available;
}

namespace {

// 16 values of a row as int16, less `zero` (8-bit rows) or as they are (int16 rows).
struct LoadInt16 {
  __attribute__((target("avx2"))) __m256i operator()(const int16_t* p) const {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
};
struct LoadU8 {
  __m256i zero;
  __attribute__((target("avx2"))) __m256i operator()(const uint8_t* p) const {
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), zero);
  }
};
struct LoadS8 {
  __m256i zero;
  __attribute__((target("avx2"))) __m256i operator()(const int8_t* p) const {
    return _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), zero);
  }
};

template <typename T, typename Load>
__attribute__((target("avx2"))) void PackRows(const T* rows, int64_t ld, int64_t k_count, int64_t cols, Load load,
                                              int16_t* out) {
  const int64_t kp = Int16PairedK(k_count), panels = (cols + kInt16PanelCols - 1) / kInt16PanelCols;
  alignas(32) T pad0[kInt16PanelCols], pad1[kInt16PanelCols];
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t c0 = p * kInt16PanelCols, n = std::min(kInt16PanelCols, cols - c0);
    int16_t* panel = out + p * kp * kInt16PanelCols;
    for (int64_t k = 0; k < kp; k += 2) {
      const T* r0 = rows + k * ld + c0;
      const T* r1 = k + 1 < k_count ? rows + (k + 1) * ld + c0 : nullptr;
      __m256i a, b;
      if (n < kInt16PanelCols) {  // a short last panel: the columns past `cols` are zero after the load
        std::fill(pad0, pad0 + kInt16PanelCols, T{0});
        std::fill(pad1, pad1 + kInt16PanelCols, T{0});
        std::copy(r0, r0 + n, pad0);
        if (r1) std::copy(r1, r1 + n, pad1);
        const __m256i keep =
            _mm256_cmpgt_epi16(_mm256_set1_epi16(static_cast<int16_t>(n)),
                               _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        a = _mm256_and_si256(load(pad0), keep);
        b = r1 ? _mm256_and_si256(load(pad1), keep) : _mm256_setzero_si256();
      } else {
        a = load(r0);
        b = r1 ? load(r1) : _mm256_setzero_si256();  // the zero row past an odd K
      }
      // unpack works within 128-bit halves: lo = columns 0-3 | 8-11, hi = 4-7 | 12-15, each as (a, b) pairs.
      const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + k * kInt16PanelCols),
                          _mm256_permute2x128_si256(lo, hi, 0x20));  // columns 0-7
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + k * kInt16PanelCols + 16),
                          _mm256_permute2x128_si256(lo, hi, 0x31));  // columns 8-15
    }
  }
}

}  // namespace

void PackInt16Rows(const int16_t* rows, int64_t ld, int64_t k_count, int64_t cols, int16_t* out) {
  PackRows(rows, ld, k_count, cols, LoadInt16{}, out);
}

__attribute__((target("avx2"))) void PackInt16Rows(const uint8_t* rows, int64_t ld, int64_t k_count, int64_t cols,
                                                   int32_t zero, int16_t* out) {
  PackRows(rows, ld, k_count, cols, LoadU8{_mm256_set1_epi16(static_cast<int16_t>(zero))}, out);
}

__attribute__((target("avx2"))) void PackInt16Rows(const int8_t* rows, int64_t ld, int64_t k_count, int64_t cols,
                                                   int32_t zero, int16_t* out) {
  PackRows(rows, ld, k_count, cols, LoadS8{_mm256_set1_epi16(static_cast<int16_t>(zero))}, out);
}

namespace {

template <typename T, typename Load>
__attribute__((target("avx2"))) void Shift(const T* src, int64_t n, int32_t zero, Load load, int16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), load(src + i));
  for (; i < n; ++i) dst[i] = static_cast<int16_t>(src[i] - zero);
}

}  // namespace

__attribute__((target("avx2"))) void ShiftInt16(const uint8_t* src, int64_t n, int32_t zero, int16_t* dst) {
  Shift(src, n, zero, LoadU8{_mm256_set1_epi16(static_cast<int16_t>(zero))}, dst);
}

__attribute__((target("avx2"))) void ShiftInt16(const int8_t* src, int64_t n, int32_t zero, int16_t* dst) {
  Shift(src, n, zero, LoadS8{_mm256_set1_epi16(static_cast<int16_t>(zero))}, dst);
}

void Int16Gemm(const int16_t* a, int64_t lda, int64_t m_count, int64_t kp, const int16_t* b, int32_t* c, int64_t ldc,
               int64_t n0, int64_t n1) {
  // K in slices of at most 768 (a 4-row block of A in L1: 6 KiB); per slice, blocks of panels that fit L2 together
  // (~192 KiB), and in each every row block of A runs against each panel, so each slice of A is read once per panel
  // block and the panels from L2. Later slices add to C (large K: a 3x3 convolution of 512 channels is K 4608, whose
  // weight, 4.7 MB, was read again for every 16 pixels without the slices).
  constexpr int64_t kSlice = 768;
  for (int64_t k0 = 0; k0 < kp; k0 += kSlice) {
    const int64_t kc = std::min(kSlice, kp - k0);
    const int64_t block_cols = std::max<int64_t>(1, (int64_t{96} << 10) / (kc * kInt16PanelCols)) * kInt16PanelCols;
    for (int64_t nb = n0; nb < n1; nb += block_cols) {
      const int64_t ne = std::min(n1, nb + block_cols);
      for (int64_t m = 0; m < m_count; m += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m_count - m));
        for (int64_t n = nb; n < ne; n += kInt16PanelCols)
          kBlocks[rows](a + m * lda + k0, lda, kc,
                        b + n / kInt16PanelCols * kp * kInt16PanelCols + k0 * kInt16PanelCols, c + m * ldc + n, ldc,
                        std::min(kInt16PanelCols, ne - n), k0 > 0);
      }
    }
  }
}

void Int16GemmThreaded(const int16_t* a, int64_t m_count, int64_t kp, const int16_t* b, int32_t* c, int64_t n_count,
                       int threads, int64_t min_work) {
  const int64_t panels = (n_count + kInt16PanelCols - 1) / kInt16PanelCols;
  const int parts = m_count * kp * n_count < min_work ? 1 : static_cast<int>(std::clamp<int64_t>(threads, 1, panels));
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
  for (int part = 0; part < parts; ++part) {
    const int64_t n0 = panels * part / parts * kInt16PanelCols;
    const int64_t n1 = std::min(n_count, panels * (part + 1) / parts * kInt16PanelCols);
    if (n0 < n1) Int16Gemm(a, kp, m_count, kp, b, c, n_count, n0, n1);
  }
}

}  // namespace osprey::cpu
