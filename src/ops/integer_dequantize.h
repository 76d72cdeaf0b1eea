#pragma once
// The `_dequantize` epilogue of ConvInteger / MatMulInteger: what ONNX Runtime's quantize_dynamic writes after each of
// them, ConvInteger -> Add(int32 bias) -> Cast(float) -> Mul(scale) (MatMulInteger: no Add), is one node after
// FuseIntegerDequantize (src/runtime/fusion_qdq.cc): attribute `_dequantize` = 1, the int32 bias as input 4 (absent:
// -1) and the float32 scale as input 5, each one value or one per channel of the result (ConvInteger: axis 1, output
// channels; MatMulInteger: the last axis, columns). The result is float32:
//     y = float(acc + bias[c]) * scale[c]
// bit for bit the three ops it replaces (the int32 sum wraps as the Add's does). Shared by the reference kernels
// (src/kernels/reference/quantize.cc) and the fast ones (src/kernels/cpu/integer_kernels.cc).
#include <cstdint>
#include <string>

#include "osprey/graph.h"
#include "osprey/tensor.h"

// The vectorising hint where OpenMP is on (the fast kernels); the ops library includes this file for the constants.
#if defined(_OPENMP)
#define OSPREY_DEQUANTIZE_SIMD _Pragma("omp simd")
#else
#define OSPREY_DEQUANTIZE_SIMD
#endif

namespace osprey {

inline constexpr int kDequantizeBiasInput = 4;
inline constexpr int kDequantizeScaleInput = 5;

/// Throws kInvalidArgument naming the node unless the bias (may be null) and the scale hold 1 or `channels` values (the
/// schema checks their shapes at compile time; this guards the kernels against a run-time surprise).
inline void CheckDequantizeOperands(const Node& node, const Tensor* bias, const Tensor& scale, int64_t channels) {
  for (const Tensor* t : {bias, &scale})
    if (t != nullptr && t->numel() != 1 && t->numel() != channels)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": a fused bias or scale of " +
                                                   std::to_string(t->numel()) + " values for " +
                                                   std::to_string(channels) + " channels");
}

inline float DequantizeValue(int32_t acc, int32_t bias, float scale) {
  return static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(bias))) * scale;
}

/// The epilogue over an int32 result laid out [outer, channels, inner] (ConvInteger: [N, M, H*W]; MatMulInteger:
/// [rows, N, 1]). `bias` (may be null) and `scale` hold `bias_count` / `scale_count` values: 1 or `channels`.
inline void DequantizeRows(const int32_t* acc, int64_t outer, int64_t channels, int64_t inner, const int32_t* bias,
                           int64_t bias_count, const float* scale, int64_t scale_count, float* out) {
  for (int64_t o = 0; o < outer; ++o) {
    if (inner == 1) {  // channels innermost
      const int32_t* a = acc + o * channels;
      float* y = out + o * channels;
      if (scale_count == channels && bias == nullptr) {
OSPREY_DEQUANTIZE_SIMD
        for (int64_t c = 0; c < channels; ++c) y[c] = DequantizeValue(a[c], 0, scale[c]);
        continue;
      }
      if (scale_count == channels && bias_count == channels) {
OSPREY_DEQUANTIZE_SIMD
        for (int64_t c = 0; c < channels; ++c) y[c] = DequantizeValue(a[c], bias[c], scale[c]);
        continue;
      }
      for (int64_t c = 0; c < channels; ++c)
        y[c] = DequantizeValue(a[c], bias ? bias[bias_count == 1 ? 0 : c] : 0, scale[scale_count == 1 ? 0 : c]);
      continue;
    }
    for (int64_t c = 0; c < channels; ++c) {
      const int32_t b = bias ? bias[bias_count == 1 ? 0 : c] : 0;
      const float s = scale[scale_count == 1 ? 0 : c];
      const int32_t* a = acc + (o * channels + c) * inner;
      float* y = out + (o * channels + c) * inner;
OSPREY_DEQUANTIZE_SIMD
      for (int64_t p = 0; p < inner; ++p) y[p] = DequantizeValue(a[p], b, s);
    }
  }
}

}  // namespace osprey
