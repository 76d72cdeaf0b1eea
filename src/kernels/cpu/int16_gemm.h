#pragma once
// Exact products of 8-bit integers on AVX2 without VNNI, for ConvInteger / MatMulInteger (integer_kernels.cc). Both
// operands are widened to int16 with their zero points taken off (values in [-255, 255]), and vpmaddwd multiplies two
// pairs and sums them in 32 bits (2 x 255 x 255 fits: exact; vpmaddubsw, which ONNX Runtime's u8 x s8 kernels use,
// sums in 16 bits and saturates). C[m][n] = sum_k A[m][k] B[k][n] in int32 (wrapping, as the reference's int32 sum).
//
// A is row-major int16 with an even row length Kp (K rounded up, the extra column 0). B is packed in panels of 16
// columns, each [Kp / 2][16][2] (the two k values of a pair side by side), columns past N zero.
#include <cstdint>

namespace osprey::cpu {

constexpr int64_t kInt16PanelCols = 16;

/// Whether this CPU runs the kernels below (AVX2).
bool Int16GemmAvailable();

/// K rounded up to even.
inline int64_t Int16PairedK(int64_t k) { return (k + 1) & ~int64_t{1}; }
/// int16 elements of B packed: panels x Kp x 16.
inline int64_t Int16PackedSize(int64_t k, int64_t n) {
  return (n + kInt16PanelCols - 1) / kInt16PanelCols * Int16PairedK(k) * kInt16PanelCols;
}

/// Packs element (k, n) = b(k, n) for k < K, n < N (a callable giving int16 values) into `out` (Int16PackedSize
/// elements).
template <typename Get>
void PackInt16B(int64_t k_count, int64_t n_count, Get b, int16_t* out) {
  const int64_t kp = Int16PairedK(k_count), panels = (n_count + kInt16PanelCols - 1) / kInt16PanelCols;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k = 0; k < kp; ++k)
      for (int64_t j = 0; j < kInt16PanelCols; ++j) {
        const int64_t n = p * kInt16PanelCols + j;
        out[(p * kp + (k & ~int64_t{1})) * kInt16PanelCols + j * 2 + (k & 1)] =
            k < k_count && n < n_count ? b(k, n) : int16_t{0};
      }
}

/// Packs rows [0, K) x columns [0, cols) of a row-major int16 matrix (row stride ld) as B (panels of 16 columns,
/// columns past `cols` and a last odd row zero); `out` holds Int16PackedSize(K, cols) elements.
void PackInt16Rows(const int16_t* rows, int64_t ld, int64_t k_count, int64_t cols, int16_t* out);
/// The same from 8-bit rows, `zero` taken off each value on the way (a pointwise convolution's input is its own
/// im2col matrix: packed straight from the tensor).
void PackInt16Rows(const uint8_t* rows, int64_t ld, int64_t k_count, int64_t cols, int32_t zero, int16_t* out);
void PackInt16Rows(const int8_t* rows, int64_t ld, int64_t k_count, int64_t cols, int32_t zero, int16_t* out);

/// dst[i] = src[i] - zero for i < n.
void ShiftInt16(const uint8_t* src, int64_t n, int32_t zero, int16_t* dst);
void ShiftInt16(const int8_t* src, int64_t n, int32_t zero, int16_t* dst);

/// C[m][n] for m in [0, M), n in [n0, n1) (n0 a multiple of 16; n1 <= N, the columns C holds): A is M x Kp at `a`
/// (row stride lda), `b` the packed B (panel n0 / 16 first: pass the whole packing), C row stride ldc.
void Int16Gemm(const int16_t* a, int64_t lda, int64_t m_count, int64_t kp, const int16_t* b, int32_t* c, int64_t ldc,
               int64_t n0, int64_t n1);

/// All of C [M, N] (row stride N), A packed as above with row stride kp, the columns split over up to `threads`
/// threads in whole panels (one thread below `min_work` multiply-adds).
void Int16GemmThreaded(const int16_t* a, int64_t m_count, int64_t kp, const int16_t* b, int32_t* c, int64_t n_count,
                       int threads, int64_t min_work = 0);

}  // namespace osprey::cpu
