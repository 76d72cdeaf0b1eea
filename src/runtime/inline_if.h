#pragma once
// If (docs/architecture.md, "If"): folded at compile time when its condition is known then (the taken branch's nodes
// replace the If node, inline_if.cc); otherwise both branches are compiled as plans of their own and the condition
// picks one at run time (runtime_if.cc).
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/plan_impl.h"

namespace osprey {

/// The nodes that stand for If node `node` in `state`, whose condition must be known (else kUnsupported naming the
/// node): the taken branch's nodes with its values given new ids in `state` (its constants added as constants, the
/// outer values it reads mapped to the node's inputs, its outputs to the node's outputs), plus an Identity node for
/// each branch output that is not computed by a branch node. Nested Ifs come back as If nodes, to be folded in turn.
/// `*taken` (when given) receives the taken branch.
std::vector<Node> InlineIfBranch(CompileState& state, const Node& node, const Graph** taken = nullptr);

/// Whether If node `node`'s condition is known in `state` (a constant, or computed from shapes). A condition with no
/// value at all also counts as known: InlineIfBranch then names the problem.
bool IfConditionKnown(const CompileState& state, const Node& node);

/// The two branches of an If whose condition is known only at run time, compiled for the shapes of the outer values
/// they read: plans[0] for then_branch, plans[1] for else_branch. A branch that cannot be compiled for these shapes
/// (or at all) has no plan and `refused` says why; taking it at run time throws that. `runtime_inputs` are the node
/// inputs the plans take, in order (outer values known at compile time are constants of the plans).
struct RuntimeIf {
  std::string node;  // Node::Describe()
  std::array<std::shared_ptr<const Plan>, 2> plans;
  std::array<std::string, 2> refused;
  std::vector<int> runtime_inputs;
};

/// Attribute of a live If node: its index in CompileState::runtime_ifs.
inline constexpr const char* kRuntimeIfAttr = "_runtime_if";

/// What CompileRuntimeIf throws when the branches give outputs of different types or shapes (ONNX Runtime lets the
/// shape follow the branch; paddle2onnx writes a [] in one branch and a [1] in the other). A plan cannot hold such an
/// If, so the graph runners (segments.h) catch it and run the graph cut at that If instead.
class IfShapesDiffer : public Error {
 public:
  IfShapesDiffer(const std::string& message, std::string node_name)
      : Error(ErrorCode::kUnsupported, message), node_name_(std::move(node_name)) {}
  const std::string& node_name() const { return node_name_; }

 private:
  std::string node_name_;  // Node::name, with the prefix of an unrolled loop's copy where it is one
};

/// Compiles the branches of If node `node` (condition not known when compiling) with `state`'s options, types its
/// outputs in `state` and returns the node to run, tagged with kRuntimeIfAttr. Both branches must give outputs of the
/// same types and shapes (a plan's shapes are fixed when it is compiled), else IfShapesDiffer; at least one must
/// compile, else its error. The branches' nodes count against the model's subgraph node budget (kMaxLoopNodes).
Node CompileRuntimeIf(CompileState& state, const Node& node);

/// The kernel of such a node: evaluates the condition, runs the plan of the branch it picks and copies its outputs.
std::unique_ptr<Kernel> CreateRuntimeIfKernel(std::shared_ptr<const RuntimeIf> branches);

/// The value of a one-element condition tensor of `node` (bool or a number: non-zero is true); `what` names it in
/// errors (kInvalidArgument for a non-scalar or non-numeric one).
bool ConditionValue(const Node& node, const Tensor& cond, const std::string& what);

/// The value of a known one-element condition (bool or a number: non-zero is true) of `node`; `what` names it in
/// errors (kInvalidArgument for a missing, non-scalar or non-numeric one).
bool KnownCondition(const Node& node, const CompileValue& cond, const std::string& what);

/// Throws kInvalidArgument when an output of `graph` declares an element type other than the one computed for it
/// (`ids[j]` in `state`, for output j): "<where> output '<name>' is declared int64 but the graph computes float32
/// (...)". `where` is "graph" for a model's graph, e.g. "If 'x': then_branch" or "Loop 'l': body" for subgraphs.
/// ONNX Runtime refuses such models; serving one would report one type and return another.
void CheckDeclaredOutputTypes(const CompileState& state, const Graph& graph, const std::vector<int>& ids,
                              const std::string& where);

/// The same for one output: its declared type (when it has one) against `computed`.
void CheckDeclaredType(const ValueInfo& declared, DType computed, const std::string& where);

/// Nodes of `graph`, those of its nodes' graphs (If branches, Loop and Scan bodies) included: what compiling or
/// running it may cost, for the subgraph budgets.
int64_t CountNodesDeep(const Graph& graph);

/// The nodes of subgraph `graph` copied into `state` with new value ids: graph input k reads `input_ids[k]`, the
/// graph's constants become constants of `state`, and graph output j, where a graph node computes it and
/// `output_ids[j]` >= 0, is written straight into `output_ids[j]`. `*outputs` receives each graph output's id in
/// `state`. Names get `prefix`. Shared by If and Loop (inline_loop.cc).
std::vector<Node> CopySubgraph(CompileState& state, const Graph& graph, const std::vector<int>& input_ids,
                               const std::vector<int>& output_ids, const std::string& prefix,
                               std::vector<int>* outputs);

}  // namespace osprey
