#pragma once
// If, Loop and Scan (src/ops/control_flow.cc): checks shared by the importer and the compile step that folds them.
#include <string>

#include "osprey/graph.h"

namespace osprey {

/// Checks an If node's branches: both present as graphs, one output per If output, one input per captured value
/// (the node's inputs after the condition). Throws kInvalidArgument naming the node and the branch.
void CheckIfNode(const Node& node);

/// Attribute the importer adds to a Loop node: N, the number of loop-carried values (inputs 2..2+N-1).
inline constexpr const char* kLoopCarriedAttr = "_carried";

/// Checks a Loop node: a `body` graph, `_carried` = N, inputs (M, cond, N carried, captured...) one per body input,
/// body outputs (cond, N carried, K scan outputs) one more than the node's (N + K). kInvalidArgument otherwise.
void CheckLoopNode(const Node& node);

/// Checks a Scan node: a `body` graph, `num_scan_inputs` = M >= 1, `_carried` = N, inputs (N states, M scan inputs,
/// captured...) one per body input, body outputs one per node output (N states, K scan outputs), and the axis and
/// direction lists (when given) one per scan input / output. kInvalidArgument otherwise.
void CheckScanNode(const Node& node);

}  // namespace osprey
