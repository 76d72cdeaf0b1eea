#pragma once
// DynamicQuantizeLinear's arithmetic (ONNX): the range [min(x, 0), max(x, 0)] gives scale = (hi - lo) / 255 and the
// zero point round(-lo / scale) saturated to [0, 255] (0 when the scale is 0); each value becomes round(x / scale) +
// zero point saturated to [0, 255], NaN -> the zero point; rounding half to even. Used by the fast DynamicQuantizeLinear
// kernel (kernels/cpu/integer_kernels.cc) and by the int8 LSTM (kernels/recurrent_cell.h), which quantises its
// activations the same way; the reference DynamicQuantizeLinear kernel (kernels/reference/quantize.cc) is written
// independently, as the oracle. The value function is branch-free (clamps by value) so it vectorises in simd loops.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace osprey {

struct DynamicQuantParams {
  float scale = 0.f;  // 0: the input is all zero (or has no finite range); every value is the zero point
  uint8_t zero = 0;
};

/// Scale and zero point from the running min (<= 0) and max (>= 0) of the input.
inline DynamicQuantParams DynamicQuantParamsOf(float lo, float hi) {
  DynamicQuantParams p;
  p.scale = (hi - lo) / 255.f;
  if (p.scale > 0.f) {
    const float z = -lo / p.scale;
    p.zero = z != z ? 0 : static_cast<uint8_t>(std::min(std::max(std::nearbyint(z), 0.f), 255.f));
  }
  return p;
}

/// One value with scale > 0 and its zero point as a float.
inline uint8_t DynamicQuantizeValue(float x, float scale, float zero) {
  const float v = x / scale;
  float r = v != v ? zero : std::nearbyint(v) + zero;
  r = r > 0.f ? r : 0.f;
  r = r < 255.f ? r : 255.f;
  return static_cast<uint8_t>(static_cast<int32_t>(r));
}

}  // namespace osprey
