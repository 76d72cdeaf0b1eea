#include "runtime/inline_loop.h"

#include <string>
#include <vector>

#include "ops/control_flow.h"
#include "runtime/inline_if.h"

namespace osprey {

namespace {

Node MakeNode(const std::string& op, const std::string& name, std::vector<int> inputs, std::vector<int> outputs) {
  Node n;
  n.op_type = op;
  n.name = name;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

}  // namespace

void InlineLoop(CompileState& st, const Node& node, const std::function<void(const Node&)>& fold) {
  CheckLoopNode(node);
  const Graph& body = *node.attrs.at("body").g;
  const size_t carried = static_cast<size_t>(node.attrs.at(kLoopCarriedAttr).i);
  const size_t scans = node.outputs.size() - carried;
  for (size_t i = 2; i < node.inputs.size(); ++i)
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input " + std::to_string(i) + " has no value");

  // Trip count M (absent: bounded by the condition alone).
  bool bounded = false;
  int64_t trips = 0;
  if (node.inputs[0] >= 0) {
    const CompileValue& m = st.values[node.inputs[0]];
    if (!m.typed) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the trip count has no value");
    if (!m.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": input 0 must be known when the model is compiled "
                                                             "(osprey unrolls Loop then; its trip count must not "
                                                             "depend on input data)");
    if (m.value.numel() != 1 || m.value.dtype() != DType::kI64)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the trip count must be one int64");
    bounded = true;
    trips = m.value.data<int64_t>()[0];
  }
  bool cond = true;
  int cond_id = -1;
  if (node.inputs[1] >= 0) {
    const CompileValue& c = st.values[node.inputs[1]];
    if (c.typed && !c.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": input 1 must be known when the model is compiled "
                                                             "(osprey unrolls Loop then; its condition must not "
                                                             "depend on input data)");
    cond = KnownCondition(node, c, "the condition");
    cond_id = node.inputs[1];
  }
  if (!bounded && node.inputs[1] < 0)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": neither a trip count nor a condition: the loop "
                                                               "would never end");

  std::vector<int> values(node.inputs.begin() + 2, node.inputs.begin() + 2 + static_cast<long>(carried));
  const std::vector<int> captured(node.inputs.begin() + 2 + static_cast<long>(carried), node.inputs.end());
  std::vector<std::vector<int>> stacked(scans);
  for (int64_t i = 0; (!bounded || i < trips) && cond; ++i) {
    if (i >= kMaxLoopIterations || st.loop_nodes + static_cast<int64_t>(body.nodes.size()) > kMaxLoopNodes)
      throw Error(ErrorCode::kUnsupported,
                  node.Describe() + ": runs more than " + std::to_string(i) + " iterations (" +
                      std::to_string(st.loop_nodes) + " nodes unrolled in the model); osprey unrolls Loop when the "
                      "model is compiled, up to " + std::to_string(kMaxLoopIterations) + " iterations per loop and " +
                      std::to_string(kMaxLoopNodes) + " nodes in all");
    std::vector<int> inputs{st.AddConstant(Tensor::Scalar<int64_t>(i)),
                            cond_id >= 0 ? cond_id : st.AddConstant(Tensor::Scalar<bool>(true))};
    inputs.insert(inputs.end(), values.begin(), values.end());
    inputs.insert(inputs.end(), captured.begin(), captured.end());
    std::vector<int> outputs;
    const std::vector<Node> nodes = CopySubgraph(st, body, inputs, std::vector<int>(body.outputs.size(), -1),
                                                 node.name + "/iteration_" + std::to_string(i) + "/", &outputs);
    st.loop_nodes += static_cast<int64_t>(nodes.size());
    for (const Node& n : nodes) fold(n);
    const CompileValue& c = st.values[outputs[0]];
    if (c.typed && !c.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": osprey unrolls Loop when the model is compiled, so "
                                                             "the condition its body computes must not depend on "
                                                             "input data");
    cond = KnownCondition(node, c, "the body's condition output");
    cond_id = outputs[0];
    values.assign(outputs.begin() + 1, outputs.begin() + 1 + static_cast<long>(carried));
    for (size_t k = 0; k < scans; ++k) stacked[k].push_back(outputs[1 + carried + k]);
  }

  for (size_t j = 0; j < carried; ++j)
    fold(MakeNode("Identity", node.name + "/final_" + std::to_string(j), {values[j]}, {node.outputs[j]}));
  for (size_t k = 0; k < scans; ++k) {
    if (stacked[k].empty())
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": runs no iteration, so its scan output " +
                                               std::to_string(k) + " has no element shape (not supported)");
    const std::string prefix = node.name + "/scan_" + std::to_string(k) + "/";
    std::vector<int> parts;
    for (size_t i = 0; i < stacked[k].size(); ++i) {
      const Shape item_shape = st.values[stacked[k][i]].shape;  // (copies: AddConstant may move st.values)
      const DType item_dtype = st.values[stacked[k][i]].dtype;
      if (i > 0 && item_shape != st.values[stacked[k][0]].shape)
        throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": scan output " + std::to_string(k) +
                                                     " changes shape between iterations (" +
                                                     ShapeToString(st.values[stacked[k][0]].shape) + ", then " +
                                                     ShapeToString(item_shape) + ")");
      std::vector<int64_t> dims{1};
      dims.insert(dims.end(), item_shape.begin(), item_shape.end());
      const int shape = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
      const int out = stacked[k].size() == 1 ? node.outputs[carried + k] : st.AddValue(item_dtype, {});
      fold(MakeNode("Reshape", prefix + "item_" + std::to_string(i), {stacked[k][i], shape}, {out}));
      parts.push_back(out);
    }
    if (parts.size() > 1) {
      Node concat = MakeNode("Concat", prefix + "stack", parts, {node.outputs[carried + k]});
      concat.attrs["axis"] = Attribute::Int(0);
      fold(concat);
    }
  }
}

}  // namespace osprey
