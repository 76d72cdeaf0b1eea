#pragma once
// How a QuantizeLinear / DequantizeLinear scale (and zero point) maps onto x: shared by the schema
// (src/ops/quantize.cc), the reference kernels and the QDQ fusion pass.
#include <cstdint>

#include "osprey/graph.h"

namespace osprey {

/// Per-tensor, per-axis (one value per x[axis]) or blocked (opset 21: `block_size` consecutive values along `axis`
/// share one) quantisation parameters of an x of a given shape.
struct QuantParams {
  enum class Kind { kPerTensor, kPerAxis, kBlocked };
  Kind kind = Kind::kPerTensor;
  int64_t axis = 0;
  int64_t axis_dim = 1;  // x[axis]
  int64_t inner = 1;     // product of x's dims after axis
  int64_t block_size = 0;
  /// Index into the (flattened) scale / zero point of x's flat element i.
  int64_t Index(int64_t i) const;
};

/// Checks the node's scale shape against x (axis, block_size, opset) and says how it applies. Throws
/// kInvalidArgument naming the node when they do not fit.
QuantParams ResolveQuantParams(const Node& node, int opset, const Shape& x, const Shape& scale);

}  // namespace osprey
