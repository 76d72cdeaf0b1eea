#pragma once
// Helpers shared by the fast image kernels (image_kernels.cc, augment_kernels.cc, augment_warp_general.cc,
// augment_warp_axis.cc): image dimensions, the shape check, uint8 saturation and OpenCV's border rules. The reference
// kernels keep their own copies on purpose: they are the oracle these kernels are tested against.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/kernel.h"
#include "osprey/error.h"

namespace osprey::image_kernels {

/// [N, H, W, C] of an HWC (rank 3) or NHWC (rank 4) image shape.
struct ImageDims {
  int64_t n, h, w, c;
};

inline ImageDims DimsOf(const Shape& s) {
  if (s.size() == 4) return {s[0], s[1], s[2], s[3]};
  return {1, s[0], s[1], s[2]};
}

/// The kernel was built for in -> out; anything else is a runtime bug.
inline void CheckShapes(const KernelContext& ctx, const Shape& in, const Shape& out, const char* name) {
  if (ctx.In(0).shape() != in || ctx.Out(0).shape() != out)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for " + ShapeToString(in) +
                                          " -> " + ShapeToString(out) + ", got " + ShapeToString(ctx.In(0).shape()) +
                                          " -> " + ShapeToString(ctx.Out(0).shape()));
}

/// float -> uint8 rounding half up, saturating (NaN -> 0).
inline uint8_t SaturateU8(float v) {
  if (!(v > 0.f)) return 0;
  if (v >= 255.f) return 255;
  return static_cast<uint8_t>(static_cast<int>(v + 0.5f));
}

/// A float result stored as T (uint8: SaturateU8).
template <class T>
inline T StoreAs(float v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return SaturateU8(v);
  } else {
    return v;
  }
}

enum class Border { kConstant, kReplicate, kReflect, kReflect101 };

/// The op's border_mode attribute ("constant", "replicate", "reflect", "reflect101"; validated by the schema).
inline Border BorderOf(const std::string& name) {
  if (name == "replicate") return Border::kReplicate;
  if (name == "reflect") return Border::kReflect;
  if (name == "reflect101") return Border::kReflect101;
  return Border::kConstant;
}

/// cv::borderInterpolate: source index of position i on an axis of n, or -1 (constant border, outside).
inline int64_t BorderIndex(int64_t i, int64_t n, Border border) {
  if (i >= 0 && i < n) return i;
  switch (border) {
    case Border::kConstant:
      return -1;
    case Border::kReplicate:
      return i < 0 ? 0 : n - 1;
    case Border::kReflect: {
      const int64_t period = 2 * n;
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - 1 - m;
    }
    case Border::kReflect101: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - m;
    }
  }
  return -1;
}

}  // namespace osprey::image_kernels
