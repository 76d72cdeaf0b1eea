// The com.microsoft ops of ONNX Runtime's transformer optimiser (ops/contrib.cc) as default-domain ops, made when a
// model is compiled; each lowered node is then inferred and folded like any other (and fused: a Gelu after a MatMul,
// a LayerNormalization). The arithmetic is the contrib kernels': FastGelu's tanh form is ONNX Gelu's "tanh"
// approximation, SkipLayerNormalization's epsilon defaults to 1e-12 as ONNX Runtime's does.
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

Node MakeNode(const Node& from, const char* op, const char* suffix, std::vector<int> inputs, int output) {
  Node n;
  n.op_type = op;
  n.name = from.name + suffix;
  n.inputs = std::move(inputs);
  n.outputs = {output};
  return n;
}

int Input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }

}  // namespace

bool IsLoweredContribOp(const Node& node) {
  return node.domain == kMicrosoftDomain &&
         (node.op_type == "Gelu" || node.op_type == "FastGelu" || node.op_type == "BiasGelu" ||
          node.op_type == "QuickGelu" || node.op_type == "SkipLayerNormalization");
}

std::vector<Node> LowerContribOp(CompileState& st, const Node& node) {
  const std::string& op = node.op_type;
  const int out = node.outputs.empty() ? -1 : node.outputs[0];
  if (out < 0) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": output 0 is required");
  auto temp = [&st]() { return st.AddValue(DType::kF32, {}); };  // typed by inference
  if (op == "Gelu") {
    Node g = node;
    g.domain.clear();
    g.attrs.clear();
    return {g};
  }
  if (op == "QuickGelu") {
    const int scaled = temp(), gate = temp();
    const int alpha = st.AddConstant(Tensor::Scalar<float>(node.GetFloat("alpha", 1.702f)));
    return {MakeNode(node, "Mul", "/scale", {node.inputs[0], alpha}, scaled),
            MakeNode(node, "Sigmoid", "/sigmoid", {scaled}, gate),
            MakeNode(node, "Mul", "/gate", {node.inputs[0], gate}, out)};
  }
  std::vector<Node> nodes;
  if (op == "FastGelu" || op == "BiasGelu") {
    int x = node.inputs[0];
    if (Input(node, 1) >= 0) {
      const int sum = temp();
      nodes.push_back(MakeNode(node, "Add", "/bias", {x, node.inputs[1]}, sum));
      x = sum;
    }
    Node g = MakeNode(node, "Gelu", "", {x}, out);
    if (op == "FastGelu") g.attrs["approximate"] = Attribute::String("tanh");
    nodes.push_back(std::move(g));
    return nodes;
  }
  // SkipLayerNormalization: its mean and inv_std_var outputs are LayerNormalization's ([..., 1], axis -1).
  const int sum_out = node.outputs.size() > 3 ? node.outputs[3] : -1;
  const bool bias = Input(node, 4) >= 0;
  const int skipped = !bias && sum_out >= 0 ? sum_out : temp();
  nodes.push_back(MakeNode(node, "Add", "/skip", {node.inputs[0], node.inputs[1]}, skipped));
  int sum = skipped;
  if (bias) {
    sum = sum_out >= 0 ? sum_out : temp();
    nodes.push_back(MakeNode(node, "Add", "/bias", {skipped, node.inputs[4]}, sum));
  }
  Node ln = MakeNode(node, "LayerNormalization", "", {sum, node.inputs[2]}, out);
  if (Input(node, 3) >= 0) ln.inputs.push_back(node.inputs[3]);
  for (size_t i = 1; i < 3 && i < node.outputs.size(); ++i) ln.outputs.push_back(node.outputs[i]);
  ln.attrs["axis"] = Attribute::Int(-1);
  ln.attrs["epsilon"] = Attribute::Float(node.GetFloat("epsilon", 1e-12f));
  nodes.push_back(std::move(ln));
  return nodes;
}

}  // namespace osprey
