#pragma once
// Unrolling Loop and Scan at compile time (docs/architecture.md, "Loop"): a copy of the body per iteration.
#include <functional>

#include "runtime/plan_impl.h"

namespace osprey {

/// Replaces Loop node `node` in `state` by copies of its body, one per iteration, each passed to `fold` (which infers
/// and folds it, so the next iteration's condition is known) as it is made; then Identity nodes for the final
/// carried values and Reshape + Concat nodes stacking each scan output. The trip count and the conditions must be
/// known when compiling; otherwise, or beyond kMaxLoopIterations iterations of one loop or kMaxLoopNodes nodes copied
/// by all loops of the compile (nested ones multiply: `state.subgraph_nodes` counts them all), kUnsupported naming the
/// node.
void InlineLoop(CompileState& state, const Node& node, const std::function<void(const Node&)>& fold);

/// The same for Scan (opset 9 and newer): one iteration per element of the scan inputs (their dim along
/// scan_input_axes, so always known when compiling), each element a Gather (reversed for scan_input_directions 1),
/// scan outputs stacked along scan_output_axes (reversed for scan_output_directions 1). Same limits as Loop.
void InlineScan(CompileState& state, const Node& node, const std::function<void(const Node&)>& fold);

inline constexpr int64_t kMaxLoopIterations = 10000;
inline constexpr int64_t kMaxLoopNodes = 200000;

}  // namespace osprey
