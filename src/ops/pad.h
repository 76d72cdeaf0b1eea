#pragma once
// ONNX Pad's pads, in one place: read from the attribute before opset 11, else from inputs 1 (pads) and 3 (axes), and
// spread over the input's axes. Used by the reference kernel and the fast CPU kernel, so they cannot drift.
#include <cstdint>
#include <functional>
#include <string>
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

/// The input index in [0, n) that position i of a padded axis reads (i relative to the input's first element:
/// negative before it, >= n after it) in mode "edge" (clamped), "wrap" or "reflect" (mirrored about the edge element
/// without repeating it, again and again when a pad exceeds the axis, as numpy.pad does); n >= 1.
int64_t PadSourceIndex(const std::string& mode, int64_t i, int64_t n);

/// Per output position of an axis of n elements padded by `begin` and `end` elements (negative: cropped) in `mode`:
/// the input index it reads, or -1 for the fill value (mode "constant"). Negative pads crop first; the remaining pads
/// then extend the cropped region. Empty where the pads crop more than the axis holds, or pad an axis left empty in a
/// mode that reads the input (errors; the caller names the node).
std::vector<int64_t> PadSourceTable(const std::string& mode, int64_t n, int64_t begin, int64_t end);

}  // namespace osprey
