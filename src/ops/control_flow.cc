// Schema of If. Osprey compiles a plan for concrete input shapes, so an If whose condition is known then (a constant,
// or computed from shapes, as exporters emit for "if batch == 1") is replaced by the nodes of the branch it takes
// (src/runtime/inline_if.cc); one whose condition depends on input data is refused.
//
// If(cond, captured_0, ..., captured_{k-1}) -> outputs, attributes then_branch / else_branch (graphs)
//   The importer lists the outer-scope values either branch reads as extra inputs after `cond`, in the same order
//   as each branch graph's inputs (so they are ordinary dependencies for sorting and liveness); ONNX's If has only
//   `cond`. Each branch graph has one output per If output.
#include "ops/control_flow.h"

#include <string>

#include "ops/op_registry.h"

namespace osprey {
namespace {

constexpr int kManyValues = 1 << 20;

void InferIf(InferContext& ctx) { throw Error(ErrorCode::kUnsupported, IfConditionUnknownMessage(ctx.node)); }

}  // namespace

std::string IfConditionUnknownMessage(const Node& node) {
  return node.Describe() +
         ": condition depends on input data; osprey folds If only when its condition is known when the model is "
         "compiled";
}

void CheckIfNode(const Node& node) {
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto it = node.attrs.find(branch);
    if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph || !it->second.g)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": attribute '" + branch + "' (a graph) is required");
    const Graph& g = *it->second.g;
    if (g.outputs.size() != node.outputs.size())
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + branch + " has " +
                                                   std::to_string(g.outputs.size()) + " outputs, expected " +
                                                   std::to_string(node.outputs.size()) + " (one per If output)");
    if (g.inputs.size() + 1 != node.inputs.size())
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": " + branch + " reads " + std::to_string(g.inputs.size()) +
                      " outer values, but the node has " + std::to_string(node.inputs.size() - 1) +
                      " inputs after the condition");
  }
}

void RegisterControlFlowOps(OpRegistry& r) {
  r.Add("If", 1, kManyValues, 1, kManyValues, InferIf);
}

}  // namespace osprey
