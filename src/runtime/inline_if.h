#pragma once
// Folding If at compile time (docs/architecture.md, "If"): the taken branch's nodes replace the If node.
#include <vector>

#include "runtime/plan_impl.h"

namespace osprey {

/// The nodes that stand for If node `node` in `state`, whose condition must be known (else kUnsupported naming the
/// node): the taken branch's nodes with its values given new ids in `state` (its constants added as constants, the
/// outer values it reads mapped to the node's inputs, its outputs to the node's outputs), plus an Identity node for
/// each branch output that is not computed by a branch node. Nested Ifs come back as If nodes, to be folded in turn.
std::vector<Node> InlineIfBranch(CompileState& state, const Node& node);

}  // namespace osprey
