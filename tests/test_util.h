#pragma once
// Helpers for op and kernel tests: run one node through its schema (shape function) and reference kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/reference/reference.h"
#include "ops/op_registry.h"
#include "osprey/graph.h"

namespace osprey::testing {

/// A node with inputs 0..num_inputs-1 and outputs after them. Pass -1 in `omitted` positions via SetOmitted.
inline Node MakeNode(const std::string& op_type, int num_inputs, int num_outputs, AttributeMap attrs = {}) {
  Node n;
  n.op_type = op_type;
  n.name = "test_" + op_type;
  for (int i = 0; i < num_inputs; ++i) n.inputs.push_back(i);
  for (int i = 0; i < num_outputs; ++i) n.outputs.push_back(num_inputs + i);
  n.attrs = std::move(attrs);
  return n;
}

/// Runs `node` with its schema's infer function and its reference kernel. An undefined Tensor() in `inputs` is an
/// omitted optional input. Every input value is known to infer (as for constants).
inline std::vector<Tensor> RunReferenceNode(const Node& node, const std::vector<Tensor>& inputs, int opset = 17) {
  const OpSchema* schema = OpRegistry::Get().Find(node.op_type);
  if (!schema) throw Error(ErrorCode::kUnsupported, "no schema for " + node.op_type);
  InferContext ic{node, opset};
  for (const Tensor& t : inputs) {
    bool present = t.buffer() != nullptr || (t.numel() == 0 && !t.shape().empty());
    ic.present.push_back(present);
    ic.input_dtypes.push_back(t.dtype());
    ic.input_shapes.push_back(t.shape());
    ic.input_values.push_back(present ? &t : nullptr);
  }
  schema->infer(ic);
  std::vector<Tensor> outs;
  for (size_t i = 0; i < ic.output_shapes.size(); ++i) outs.emplace_back(ic.output_dtypes[i], ic.output_shapes[i]);
  ReferenceKernel kernel = FindReferenceKernel(node.op_type);
  if (!kernel) throw Error(ErrorCode::kUnsupported, "no reference kernel for " + node.op_type);
  KernelContext kc{node, opset};
  for (size_t i = 0; i < inputs.size(); ++i) kc.inputs.push_back(ic.present[i] ? &inputs[i] : nullptr);
  for (Tensor& t : outs) kc.outputs.push_back(&t);
  kernel(kc);
  return outs;
}

/// Elementwise |a - e| <= atol + rtol * |e| after converting both to float; shapes and dtypes must match.
inline void ExpectTensorNear(const Tensor& actual, const Tensor& expected, float rtol = 1e-5f, float atol = 1e-6f) {
  ASSERT_EQ(actual.dtype(), expected.dtype());
  ASSERT_EQ(ShapeToString(actual.shape()), ShapeToString(expected.shape()));
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.GetAsDouble(i), e = expected.GetAsDouble(i);
    if (a == e) continue;  // also covers equal infinities
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << "at " << i;
      continue;
    }
    ASSERT_LE(std::fabs(a - e), atol + rtol * std::fabs(e)) << "at flat index " << i << ": got " << a << ", want " << e;
  }
}

/// Deterministic pseudo-random floats in [lo, hi).
inline Tensor RandomTensor(Shape shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kF32, std::move(shape));
  uint32_t s = seed * 2654435761u + 12345u;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    p[i] = lo + (hi - lo) * static_cast<float>(s & 0xffffff) / 16777216.f;
  }
  return t;
}

// An environment variable set (or unset: nullptr) for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace osprey::testing
