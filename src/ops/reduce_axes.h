#pragma once
// Which axes a Reduce* node reduces: shared by the schema (src/ops/reduction.cc, which also validates them), the
// reference kernels (src/kernels/reference/reduction.cc) and the fast ones (src/kernels/cpu/reduce_kernel.cc).
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey {

/// The opset from which a Reduce op takes its axes as input 1 instead of an attribute.
inline int ReduceAxesInputOpset(const std::string& op_type) { return op_type == "ReduceSum" ? 13 : 18; }

/// Reduced-axis mask of a Reduce* node over an input of rank `rank`: axes from the attribute before
/// ReduceAxesInputOpset, else from `axes_input` (null when absent). No axes means every axis, or none with
/// noop_with_empty_axes = 1 (an all-false mask). Throws kInvalidArgument naming the node for an axis out of range.
inline std::vector<bool> ReduceAxesMask(const Node& node, int opset, int64_t rank, const Tensor* axes_input) {
  std::vector<int64_t> axes;
  if (opset < ReduceAxesInputOpset(node.op_type))
    axes = node.GetInts("axes");
  else if (axes_input != nullptr)
    axes = axes_input->ToInt64Vector();
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) == 0) mask.assign(static_cast<size_t>(rank), true);
    return mask;
  }
  for (int64_t a : axes) {
    const int64_t norm = a < 0 ? a + rank : a;
    if (norm < 0 || norm >= rank)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": axis " + std::to_string(a) +
                                                   " is out of range for rank " + std::to_string(rank));
    mask[norm] = true;
  }
  return mask;
}

}  // namespace osprey
