#pragma once
// The window of Conv, ConvTranspose and the pools, in one place: how auto_pad (NOTSET / SAME_UPPER / SAME_LOWER /
// VALID), pads, strides, dilations and the kernel (with ConvTranspose's output_padding and output_shape, and the pools'
// ceil_mode) become per-spatial-axis begin/end pads and output sizes. Used by the shape rules (ops/nn.cc, and through
// them QLinearConv / ConvInteger), the reference kernels, the oneDNN kernels and the cuDNN kernels, so they cannot
// drift.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// Window attributes are bounded so that (k - 1) * d + 1, in + pads and (out - 1) * s + dk cannot overflow int64.
constexpr int64_t kMaxWindowAttr = int64_t{1} << 31;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

/// A window resolved against its input's spatial sizes; every vector has one value per spatial axis.
///
/// Conv and the pools: input position of output o, tap t is o * strides - pad_begin + t * dilations; SAME_* pads
/// total = max(0, (out - 1) * s + dk - in) with the odd unit at the end (SAME_UPPER) or the start (SAME_LOWER); VALID
/// pads nothing. ConvTranspose: the full result s * (in - 1) + dk + output_padding is cropped by pad_begin at the
/// start and pad_end at the end (either may be negative with SAME_* or output_shape); with SAME_* the total crop is
/// split with floor division, SAME_UPPER taking the smaller half first.
struct ConvWindow {
  AutoPad auto_pad = AutoPad::kNotSet;
  std::vector<int64_t> in, kernel, strides, dilations, pad_begin, pad_end, out;
  /// The dilated kernel extent (k - 1) * d + 1 of axis i.
  int64_t EffectiveKernel(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

/// The taps [*lo, *hi) of a window along one axis, starting at `start` with k taps at dilation `d`, that land in
/// [0, limit): the input (limit = its size), so a pool walks only those (a window may be far longer than the input: a
/// kernel of 2^30 with ceil_mode, or pads as large), or the input and its end padding (limit = size + pad_end:
/// AveragePool's count_include_pad divisor, *hi). Shared by the reference pools and the CPU's plain pools.
inline void WindowTapsWithin(int64_t start, int64_t k, int64_t d, int64_t limit, int64_t* lo, int64_t* hi) {
  *lo = start >= 0 ? 0 : std::min(k, (-start + d - 1) / d);
  *hi = limit - start <= 0 ? 0 : std::min(k, (limit - start + d - 1) / d);
}

/// The auto_pad attribute of `node` (default NOTSET). Throws kInvalidArgument naming `node` for any other value.
AutoPad ReadAutoPad(const Node& node);

/// A per-spatial-axis ints attribute of length `n` (`fallback` repeated when absent), values in [lo, kMaxWindowAttr].
/// Throws kInvalidArgument naming `node` otherwise.
std::vector<int64_t> ReadWindowInts(const Node& node, const std::string& name, size_t n, int64_t fallback, int64_t lo);

/// Conv and the pools. `x` is [N, C, D1, ..., Dn]; `kernel` has n values in [1, kMaxWindowAttr] (W's spatial dims or
/// kernel_shape). `ceil_mode` only changes `out` (a window starting inside the end padding is dropped). Throws
/// kInvalidArgument naming `node` for bad attributes or a window that does not fit.
ConvWindow ResolveConvWindow(const Node& node, const Shape& x, const std::vector<int64_t>& kernel, bool ceil_mode);

/// ConvTranspose, `x` and `kernel` as above. `out` is output_shape (its spatial part) when given, in * strides with
/// SAME_*, else s * (in - 1) + output_padding + dk - pads. Throws kInvalidArgument naming `node` for bad attributes or
/// an empty output.
ConvWindow ResolveConvTransposeWindow(const Node& node, const Shape& x, const std::vector<int64_t>& kernel);

}  // namespace osprey
