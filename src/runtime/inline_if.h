#pragma once
// Folding If at compile time (docs/architecture.md, "If"): the taken branch's nodes replace the If node.
#include <string>
#include <vector>

#include "runtime/plan_impl.h"

namespace osprey {

/// The nodes that stand for If node `node` in `state`, whose condition must be known (else kUnsupported naming the
/// node): the taken branch's nodes with its values given new ids in `state` (its constants added as constants, the
/// outer values it reads mapped to the node's inputs, its outputs to the node's outputs), plus an Identity node for
/// each branch output that is not computed by a branch node. Nested Ifs come back as If nodes, to be folded in turn.
std::vector<Node> InlineIfBranch(CompileState& state, const Node& node);

/// The value of a known one-element condition (bool or a number: non-zero is true) of `node`; `what` names it in
/// errors (kInvalidArgument for a missing, non-scalar or non-numeric one).
bool KnownCondition(const Node& node, const CompileValue& cond, const std::string& what);

/// The nodes of subgraph `graph` copied into `state` with new value ids: graph input k reads `input_ids[k]`, the
/// graph's constants become constants of `state`, and graph output j, where a graph node computes it and
/// `output_ids[j]` >= 0, is written straight into `output_ids[j]`. `*outputs` receives each graph output's id in
/// `state`. Names get `prefix`. Shared by If and Loop (inline_loop.cc).
std::vector<Node> CopySubgraph(CompileState& state, const Graph& graph, const std::vector<int>& input_ids,
                               const std::vector<int>& output_ids, const std::string& prefix,
                               std::vector<int>* outputs);

}  // namespace osprey
