#pragma once
// Unrolling Loop at compile time (docs/architecture.md, "If and Loop"): a copy of the body per iteration.
#include <functional>

#include "runtime/plan_impl.h"

namespace osprey {

/// Replaces Loop node `node` in `state` by copies of its body, one per iteration, each passed to `fold` (which infers
/// and folds it, so the next iteration's condition is known) as it is made; then Identity nodes for the final
/// carried values and Reshape + Concat nodes stacking each scan output. The trip count and the conditions must be
/// known when compiling; otherwise, or beyond kMaxLoopIterations iterations of one loop or kMaxLoopNodes nodes copied
/// by all loops of the compile (nested ones multiply: `state.loop_nodes` counts them all), kUnsupported naming the
/// node.
void InlineLoop(CompileState& state, const Node& node, const std::function<void(const Node&)>& fold);

inline constexpr int64_t kMaxLoopIterations = 10000;
inline constexpr int64_t kMaxLoopNodes = 200000;

}  // namespace osprey
