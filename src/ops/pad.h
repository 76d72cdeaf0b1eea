#pragma once
// ONNX Pad's pads, in one place: read from the attribute before opset 11, else from inputs 1 (pads) and 3 (axes), and
// spread over the input's axes. Used by the reference kernel and the fast CPU kernel, so they cannot drift.
#include <cstdint>
#include <functional>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// Pads per input axis (ONNX order): elements added before and after; negative values crop.
struct PadAmounts {
  std::vector<int64_t> begin, end;
};

/// The pads of Pad node `node` on an input of rank `rank`; `input(i)` gives input i (nullptr: absent, or not known
/// at compile time). Returns false when the pads (or given axes) are not available. Throws kInvalidArgument naming
/// `node` when they disagree (pads not 2 x the axes, an axis out of range or repeated).
bool ReadPadAmounts(const Node& node, int opset, int64_t rank, const std::function<const Tensor*(int)>& input,
                    PadAmounts* pads);

}  // namespace osprey
