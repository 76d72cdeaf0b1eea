#pragma once
// Half-precision models (float16, bfloat16) computed in float32 (docs/architecture.md, "Half-precision models").
#include "osprey/graph.h"

namespace osprey {

/// Rewrites `g` so that every float16 and bfloat16 value is float32: constants and tensor attributes converted, the
/// data-type attributes of Cast, EyeLike, the random ops ("to", "dtype") retargeted, subgraphs and their declared
/// types likewise. The graph's own inputs and declared outputs keep their types: a Cast to float32 follows each half
/// input and a Cast back precedes each half output. Returns whether anything changed.
bool PromoteHalfFloats(Graph& g);

}  // namespace osprey
