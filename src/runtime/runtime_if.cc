// An If whose condition depends on input data (docs/architecture.md, "If"): plans are compiled for concrete input
// shapes, so both branches are compiled when the model is (for the shapes of the outer values they read), and the
// condition picks which plan runs. Silero VAD's `sr == 16000` branch is the common case.
#include <cstring>
#include <string>
#include <utility>

#include "ops/control_flow.h"
#include "runtime/inline_if.h"
#include "runtime/inline_loop.h"

namespace osprey {
namespace {

constexpr const char* kBranchNames[2] = {"then_branch", "else_branch"};

// Branch `branch` as a graph of its own: the outer values known when compiling become its constants, the others
// (node inputs `runtime_inputs`) stay its inputs.
Graph StandaloneBranch(const CompileState& st, const Node& node, const Graph& branch) {
  Graph g = branch;
  g.opset = st.opset;
  g.inputs.clear();
  g.input_infos.clear();
  for (size_t k = 0; k < branch.inputs.size(); ++k) {
    const CompileValue& outer = st.values[node.inputs[k + 1]];
    if (outer.known) {
      g.constants[branch.inputs[k]] = outer.value;
    } else {
      g.inputs.push_back(branch.inputs[k]);
      ValueInfo info;
      info.name = branch.value_names[branch.inputs[k]];
      info.dtype = outer.dtype;
      info.has_dtype = true;
      g.input_infos.push_back(std::move(info));
    }
  }
  return g;
}

class RuntimeIfKernel : public Kernel {
 public:
  explicit RuntimeIfKernel(std::shared_ptr<const RuntimeIf> branches) : b_(std::move(branches)) {}
  const char* Name() const override { return "IfAtRunTime"; }
  void Run(KernelContext& ctx) override {
    const int taken = ConditionValue(ctx.node, ctx.In(0), "the condition") ? 0 : 1;
    const std::shared_ptr<const Plan>& plan = b_->plans[taken];
    if (!plan)
      throw Error(ErrorCode::kUnsupported, b_->node + ": the condition chose " + kBranchNames[taken] +
                                               ", which cannot run for these input shapes: " + b_->refused[taken]);
    std::vector<Tensor> inputs;
    inputs.reserve(b_->runtime_inputs.size());
    for (int k : b_->runtime_inputs) inputs.push_back(ctx.In(k));
    std::vector<Tensor> outputs = plan->Run(inputs);
    OSPREY_CHECK(outputs.size() == ctx.outputs.size());
    for (size_t j = 0; j < outputs.size(); ++j) {
      Tensor& out = ctx.Out(static_cast<int>(j));
      OSPREY_CHECK(outputs[j].nbytes() == out.nbytes() && outputs[j].dtype() == out.dtype());
      if (out.nbytes() > 0) std::memcpy(out.raw(), outputs[j].raw(), out.nbytes());
    }
  }

 private:
  std::shared_ptr<const RuntimeIf> b_;
};

}  // namespace

Node CompileRuntimeIf(CompileState& st, const Node& node) {
  CheckIfNode(node);
  auto branches = std::make_shared<RuntimeIf>();
  branches->node = node.Describe();
  std::vector<TensorSpec> specs;
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": outer value " + std::to_string(i) + " read by the branches has no value");
    const CompileValue& outer = st.values[node.inputs[i]];
    if (outer.known) continue;
    branches->runtime_inputs.push_back(static_cast<int>(i));
    specs.push_back({outer.dtype, outer.shape});
  }
  const Graph* graphs[2] = {node.attrs.at(kBranchNames[0]).g.get(), node.attrs.at(kBranchNames[1]).g.get()};
  const int64_t nodes = CountNodesDeep(*graphs[0]) + CountNodesDeep(*graphs[1]);
  if (st.subgraph_nodes + nodes > kMaxLoopNodes)
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": its branches hold " + std::to_string(nodes) +
                                             " nodes, and " + std::to_string(st.subgraph_nodes) +
                                             " were unrolled or compiled in the model's subgraphs before; osprey "
                                             "compiles at most " + std::to_string(kMaxLoopNodes) + " in all");
  st.subgraph_nodes += nodes;
  for (int b = 0; b < 2; ++b) {
    // Errors that depend on the shapes are raised when the branch is taken; a declared output type the branch does
    // not compute is a defect of the model, refused now (checked here, not in the branch's compile, for that).
    Graph g = StandaloneBranch(st, node, *graphs[b]);
    for (ValueInfo& info : g.output_infos) info.has_dtype = false;
    try {
      branches->plans[b] = CompileSubgraph(g, specs, st.options, st.weights, st.account, &st.subgraph_nodes);
    } catch (const Error& e) {
      branches->refused[b] = e.what();
      continue;
    }
    const std::vector<TensorSpec>& computed = branches->plans[b]->output_specs();
    for (size_t j = 0; j < computed.size() && j < graphs[b]->output_infos.size(); ++j)
      CheckDeclaredType(graphs[b]->output_infos[j], computed[j].dtype, node.Describe() + ": " + kBranchNames[b]);
  }
  if (!branches->plans[0] && !branches->plans[1])
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": neither branch compiles for these input shapes (" +
                                             "then_branch: " + branches->refused[0] +
                                             "; else_branch: " + branches->refused[1] + ")");
  const std::vector<TensorSpec>& out = (branches->plans[0] ? branches->plans[0] : branches->plans[1])->output_specs();
  if (branches->plans[0] && branches->plans[1]) {
    const std::vector<TensorSpec>& other = branches->plans[1]->output_specs();
    for (size_t j = 0; j < out.size(); ++j)
      if (out[j].dtype != other[j].dtype || out[j].shape != other[j].shape)
        throw IfShapesDiffer(node.Describe() + ": output " + std::to_string(j) + " is " + DTypeName(out[j].dtype) +
                                 " " + ShapeToString(out[j].shape) + " from then_branch but " +
                                 DTypeName(other[j].dtype) + " " + ShapeToString(other[j].shape) +
                                 " from else_branch; the condition depends on input data, and a plan's shapes are "
                                 "fixed when it is compiled",
                             node.name);
  }
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    CompileValue& v = st.values[node.outputs[j]];
    v.typed = true;
    v.dtype = out[j].dtype;
    v.shape = out[j].shape;
  }
  Node live = node;
  live.attrs.erase(kBranchNames[0]);
  live.attrs.erase(kBranchNames[1]);
  live.attrs[kRuntimeIfAttr] = Attribute::Int(static_cast<int64_t>(st.runtime_ifs.size()));
  st.runtime_ifs.push_back(std::move(branches));
  return live;
}

std::unique_ptr<Kernel> CreateRuntimeIfKernel(std::shared_ptr<const RuntimeIf> branches) {
  return std::make_unique<RuntimeIfKernel>(std::move(branches));
}

}  // namespace osprey
