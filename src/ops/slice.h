#pragma once
// ONNX Slice, in one place: how its arguments are read (attributes before opset 10, inputs after) and resolved against
// the input's shape (negative indices count from the end, clamping, negative steps). Used by the shape rule, the
// reference kernel, the CUDA kernel and the channel-slice fusion, so they cannot drift.
#include <cstdint>
#include <functional>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

struct SliceArgs {
  std::vector<int64_t> starts, ends, axes, steps;  // axes / steps empty: the defaults (0..n-1 / all 1)
};

/// The arguments of Slice node `node`: its attributes before opset 10, else its inputs 1..4 through `input(i)`
/// (nullptr: absent, or not known at compile time). Returns false when starts or ends are not available.
bool ReadSliceArgs(const Node& node, int opset, const std::function<const Tensor*(int)>& input, SliceArgs* args);

/// A Slice resolved against its input's shape: per input axis the first index, the step and the count (an axis not
/// sliced has 0, 1 and its size), and the output shape.
struct SliceRange {
  std::vector<int64_t> first, step;
  Shape out;
};

/// Resolves `args` for an input of shape `in`. Throws kInvalidArgument naming `node` when the arguments disagree
/// (lengths differ, an axis out of range or repeated, a zero step).
SliceRange ResolveSlice(const Shape& in, const SliceArgs& args, const Node& node);

}  // namespace osprey
