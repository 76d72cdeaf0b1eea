#pragma once
// A Conv's fused input scale (runtime/fusion.cc FuseConvInputScale; docs/architecture.md): `_input_scale` = 1 and
// input kInputScaleInput holding one float32 factor per image and input channel, [N, C, 1, 1] or [1, C, 1, 1] for X
// [N, C, H, W]: the convolution reads X times its channel's factor. Squeeze-and-excitation blocks (EfficientNet,
// MobileNetV3, PP-LCNet) multiply their features by such a gate right before the block's 1x1 projection; fused, the
// product is formed where the convolution reads its input instead of in a pass over the whole feature map.
#include <cstdint>
#include <vector>

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

// A Conv's fused input affine (runtime/fusion.cc FuseConvInputs): `_input_affine` = 1 and inputs kInputAffineScale and
// kInputAffineShift holding float32 [C] each: the convolution reads x * a + b per input channel, then max(., 0) where
// `_input_relu` = 1 (a BatchNormalization and its ReLU before a 1x1 Conv: DenseNet's and pre-activation ResNets'
// layers). Its input as concatenated parts: `_input_parts` = [C_0, ..., C_k-1] (k >= 2): X is the channel
// concatenation of input 0 (C_0 channels) and inputs kInputPartsInput, kInputPartsInput + 1, ... (a Concat read only
// by the Conv: DenseNet, SqueezeNet's fire modules, YOLO's C2f/SPPF blocks). Either is formed where osprey's 1x1 kernel
// reads its input, instead of in passes over the whole feature map; the reference kernel forms X first.
inline constexpr int kInputAffineScale = 8;
inline constexpr int kInputAffineShift = 9;
inline constexpr int kInputPartsInput = 10;
inline constexpr int kMaxInputParts = 256;

inline bool HasInputAffine(const Node& node) { return node.GetInt("_input_affine", 0) != 0; }
inline bool HasInputParts(const Node& node) { return node.Has("_input_parts"); }
/// Any of the fused input forms above (scale, affine, parts).
inline bool HasFusedInput(const Node& node) {
  return HasInputScale(node) || HasInputAffine(node) || HasInputParts(node);
}
/// The node input holding part `i` of X (`_input_parts`).
inline int InputPartIndex(int i) { return i == 0 ? 0 : kInputPartsInput + i - 1; }
/// X's shape for a Conv whose input shapes are `in`: input 0's, its channels the parts' sum with `_input_parts`.
inline Shape JoinedInputShape(const Node& node, const std::vector<Shape>& in) {
  Shape x = in.empty() ? Shape{} : in[0];
  if (!HasInputParts(node) || x.size() < 2) return x;
  x[1] = 0;
  for (int64_t c : node.GetInts("_input_parts")) x[1] += c;
  return x;
}

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
