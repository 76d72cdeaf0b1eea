#include "runtime/inline_if.h"

#include <string>
#include <unordered_map>

#include "ops/control_flow.h"

namespace osprey {

std::vector<Node> InlineIfBranch(CompileState& st, const Node& node) {
  CheckIfNode(node);
  if (node.inputs.empty() || node.inputs[0] < 0)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input 0 (the condition) is required");
  const CompileValue& cond = st.values[node.inputs[0]];
  if (!cond.typed) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the condition has no value");
  if (!cond.known) throw Error(ErrorCode::kUnsupported, IfConditionUnknownMessage(node));
  if (cond.value.numel() != 1)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the condition must hold one value, got shape " +
                                                 ShapeToString(cond.value.shape()));
  bool taken = false;
  switch (cond.value.dtype()) {
    case DType::kBool:
      taken = cond.value.data<bool>()[0];
      break;
    case DType::kF32:
      taken = cond.value.data<float>()[0] != 0.f;
      break;
    case DType::kI32:
      taken = cond.value.data<int32_t>()[0] != 0;
      break;
    case DType::kI64:
      taken = cond.value.data<int64_t>()[0] != 0;
      break;
    case DType::kI8:
      taken = cond.value.data<int8_t>()[0] != 0;
      break;
    case DType::kU8:
      taken = cond.value.data<uint8_t>()[0] != 0;
      break;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": the condition must be bool, got " + DTypeName(cond.value.dtype()));
  }
  const char* branch_name = taken ? "then_branch" : "else_branch";
  const Graph& branch = *node.attrs.at(branch_name).g;
  for (size_t i = 1; i < node.inputs.size(); ++i)
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": outer value " + std::to_string(i) + " read by the branches has no value");

  // Branch value id -> id in `st`. Outer values first, then constants, then node outputs (new values).
  std::unordered_map<int, int> id_of;
  for (size_t k = 0; k < branch.inputs.size(); ++k) id_of[branch.inputs[k]] = node.inputs[k + 1];
  for (const auto& [id, t] : branch.constants) id_of[id] = st.AddConstant(t);
  // A branch output computed by a branch node is written straight into the If output (each If output once).
  std::unordered_map<int, int> produced;
  for (const Node& n : branch.nodes)
    for (int v : n.outputs) produced[v] = 1;
  std::vector<char> output_taken(node.outputs.size(), 0);
  for (size_t j = 0; j < branch.outputs.size(); ++j) {
    const int v = branch.outputs[j];
    if (produced.count(v) && !id_of.count(v)) {
      id_of[v] = node.outputs[j];
      output_taken[j] = 1;
    }
  }
  auto map_value = [&](int v) {
    if (v < 0) return -1;
    auto it = id_of.find(v);
    if (it != id_of.end()) return it->second;
    st.values.emplace_back();
    st.is_graph_output.push_back(0);
    const int id = static_cast<int>(st.values.size()) - 1;
    id_of[v] = id;
    return id;
  };

  std::vector<Node> nodes;
  nodes.reserve(branch.nodes.size() + branch.outputs.size());
  const std::string prefix = node.name + "/" + branch_name + "/";
  for (const Node& n : branch.nodes) {
    Node copy = n;
    copy.name = prefix + n.name;
    for (int& v : copy.inputs) v = map_value(v);
    for (int& v : copy.outputs) v = map_value(v);
    nodes.push_back(std::move(copy));
  }
  for (size_t j = 0; j < branch.outputs.size(); ++j) {
    if (output_taken[j]) continue;
    Node identity;
    identity.op_type = "Identity";
    identity.name = prefix + "output_" + std::to_string(j);
    identity.inputs = {map_value(branch.outputs[j])};
    identity.outputs = {node.outputs[j]};
    nodes.push_back(std::move(identity));
  }
  return nodes;
}

}  // namespace osprey
