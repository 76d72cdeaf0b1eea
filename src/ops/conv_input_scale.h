#pragma once
// A Conv's fused input scale (runtime/fusion.cc FuseConvInputScale; docs/architecture.md): `_input_scale` = 1 and
// input kInputScaleInput holding one float32 factor per image and input channel, [N, C, 1, 1] or [1, C, 1, 1] for X
// [N, C, H, W]: the convolution reads X times its channel's factor. Squeeze-and-excitation blocks (EfficientNet,
// MobileNetV3, PP-LCNet) multiply their features by such a gate right before the block's 1x1 projection; fused, the
// product is formed where the convolution reads its input instead of in a pass over the whole feature map.
#include <cstdint>

#include "osprey/graph.h"

// The vectorising hint where OpenMP is on (the fast kernels; GCC -O2 leaves these loops scalar otherwise); the ops
// library includes this file for the constant.
#if defined(_OPENMP)
#define OSPREY_INPUT_SCALE_SIMD _Pragma("omp simd")
#else
#define OSPREY_INPUT_SCALE_SIMD
#endif

namespace osprey {

inline constexpr int kInputScaleInput = 7;

inline bool HasInputScale(const Node& node) { return node.GetInt("_input_scale", 0) != 0; }

/// y = x times the factor of its (image, channel): x holds `batch` images of `channels` x `spatial` values,
/// channels-last when `nhwc`; `scale` holds `scale_batch` rows (1: shared by all images, or `batch`) of `channels`.
/// Rows [row_begin, row_end) of InputScaleRows() only, for callers that split the work over threads (-1: to the end).
inline int64_t InputScaleRows(int64_t batch, int64_t channels, int64_t spatial, bool nhwc) {
  return batch * (nhwc ? spatial : channels);
}
inline void ScaleInputChannels(const float* x, const float* scale, float* y, int64_t batch, int64_t channels,
                               int64_t spatial, bool nhwc, int64_t scale_batch, int64_t row_begin = 0,
                               int64_t row_end = -1) {
  if (row_end < 0) row_end = InputScaleRows(batch, channels, spatial, nhwc);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / (nhwc ? spatial : channels);
    const float* s = scale + (scale_batch == 1 ? 0 : n) * channels;
    if (nhwc) {
      const float* xr = x + row * channels;
      float* yr = y + row * channels;
      OSPREY_INPUT_SCALE_SIMD
      for (int64_t c = 0; c < channels; ++c) yr[c] = xr[c] * s[c];
    } else {
      const float f = s[row % channels];
      const float* xr = x + row * spatial;
      float* yr = y + row * spatial;
      OSPREY_INPUT_SCALE_SIMD
      for (int64_t i = 0; i < spatial; ++i) yr[i] = xr[i] * f;
    }
  }
}

}  // namespace osprey
