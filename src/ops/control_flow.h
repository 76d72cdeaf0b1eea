#pragma once
// If (src/ops/control_flow.cc): checks shared by the importer and the compile step that folds it.
#include <string>

#include "osprey/graph.h"

namespace osprey {

/// "If 'x': condition depends on input data; ..." — the error for an If whose condition is not known at compile time.
std::string IfConditionUnknownMessage(const Node& node);

/// Checks an If node's branches: both present as graphs, one output per If output, one input per captured value
/// (the node's inputs after the condition). Throws kInvalidArgument naming the node and the branch.
void CheckIfNode(const Node& node);

}  // namespace osprey
