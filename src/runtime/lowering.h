#pragma once
// Building the default-domain nodes an op is lowered to when a model is compiled (contrib_ops.cc: ONNX Runtime's
// com.microsoft ops; function_ops.cc: ONNX's function ops of opsets 23-28). Each made value is typed by inference
// when the caller passes the nodes to InferAndFoldNode in order.
#include <string>
#include <utility>
#include <vector>

#include "runtime/plan_impl.h"

namespace osprey {

class NodeBuilder {
 public:
  NodeBuilder(CompileState& st, const Node& node) : st_(st), node_(node) {}

  /// Throws kUnsupported "<node>: <what>".
  [[noreturn]] void Fail(const std::string& what) const {
    throw Error(ErrorCode::kUnsupported, node_.Describe() + ": " + what);
  }
  /// A new value, typed when its producer is inferred.
  int Temp() { return st_.AddValue(DType::kF32, {}); }
  int Ints(std::vector<int64_t> v) {
    return st_.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  int Float(float v) { return st_.AddConstant(Tensor::Scalar<float>(v)); }
  /// Appends a node `op` named after the lowered node plus `suffix`; returns its output (`output`, or a new value).
  int Add(const char* op, const std::string& suffix, std::vector<int> inputs, int output = -1) {
    if (output < 0) output = Temp();
    nodes_.push_back(MakeNode(op, node_.name + suffix, std::move(inputs), {output}));
    return output;
  }
  /// The node Add appended last (to set its attributes).
  Node& Last() { return nodes_.back(); }
  std::vector<Node> Take() { return std::move(nodes_); }

 protected:
  CompileState& st_;
  const Node& node_;
  std::vector<Node> nodes_;
};

}  // namespace osprey
