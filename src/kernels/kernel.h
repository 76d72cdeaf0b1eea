#pragma once
// The kernel interface shared by reference and fast (oneDNN) kernels.
// Life cycle (after XNNPACK): a factory creates and prepares a kernel for concrete shapes at compile time; Run is
// called per execution with buffers and must not allocate large memory.
#include <memory>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// Buffers for one execution of one node. Outputs are preallocated with the shapes computed at compile time.
struct KernelContext {
  const Node& node;
  int opset = 17;
  std::vector<const Tensor*> inputs;  // nullptr where omitted
  std::vector<Tensor*> outputs;
  const Tensor& In(int i) const { return *inputs[i]; }
  bool HasIn(int i) const { return i < static_cast<int>(inputs.size()) && inputs[i] != nullptr; }
  Tensor& Out(int i) const { return *outputs[i]; }
};

/// A reference kernel: plain, obviously-correct C++. The oracle for every fast kernel.
using ReferenceKernel = void (*)(KernelContext& ctx);

/// What a fast-kernel factory sees at compile time.
struct KernelBuildContext {
  const Node& node;
  int opset = 17;
  std::vector<bool> present;
  std::vector<DType> input_dtypes;
  std::vector<Shape> input_shapes;
  std::vector<const Tensor*> input_values;  // non-null for constants (weights)
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;
  int num_threads = 1;
};

/// A prepared fast kernel.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void Run(KernelContext& ctx) = 0;
  /// Name saying op, dtype and path, e.g. "ConvF32Dnnl".
  virtual const char* Name() const = 0;
};

}  // namespace osprey
