#pragma once
// Runs a fast CPU kernel and the reference kernel on the same node and inputs and compares them.
//
// Tolerance: the oneDNN kernels sum in a different order than the reference (blocked/vectorised accumulation,
// Winograd-free direct and GEMM convolutions, split reductions), and their activations use polynomial
// approximations of exp/tanh/erf. With inputs in [-1, 1) and reductions of up to a few thousand terms that is a few
// float32 ulps relative to the result, far below 1e-4, while a wrong index or pad gives errors of order 0.1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "test_util.h"

namespace osprey::testing {

constexpr float kFastRtol = 1e-4f;
constexpr float kFastAtol = 1e-4f;

/// The compile-time view of `node` applied to `inputs`: shapes from the schema, values only for inputs flagged
/// constant (weights). `outputs` receives freshly allocated output tensors of the inferred shapes.
inline KernelBuildContext MakeBuildContext(const Node& node, const std::vector<Tensor>& inputs,
                                           const std::vector<bool>& constant, std::vector<Tensor>& outputs,
                                           int opset = 17, int num_threads = 2) {
  const OpSchema* schema = OpRegistry::Get().Find(node.op_type);
  if (!schema) throw Error(ErrorCode::kUnsupported, "no schema for " + node.op_type);
  InferContext ic{node, opset};
  for (const Tensor& t : inputs) {
    bool present = t.buffer() != nullptr;
    ic.present.push_back(present);
    ic.input_dtypes.push_back(t.dtype());
    ic.input_shapes.push_back(t.shape());
    ic.input_values.push_back(present ? &t : nullptr);
  }
  schema->infer(ic);
  KernelBuildContext bc{node, opset};
  bc.present = ic.present;
  bc.input_dtypes = ic.input_dtypes;
  bc.input_shapes = ic.input_shapes;
  for (size_t i = 0; i < inputs.size(); ++i)
    bc.input_values.push_back(ic.present[i] && i < constant.size() && constant[i] ? &inputs[i] : nullptr);
  bc.output_dtypes = ic.output_dtypes;
  bc.output_shapes = ic.output_shapes;
  bc.num_threads = num_threads;
  outputs.clear();
  for (size_t i = 0; i < ic.output_shapes.size(); ++i) {
    outputs.emplace_back(ic.output_dtypes[i], ic.output_shapes[i]);
    if (ic.output_dtypes[i] == DType::kF32) {  // NaN everywhere shows up any element the kernel forgets to write
      float* p = outputs.back().data<float>();
      for (int64_t j = 0; j < outputs.back().numel(); ++j) p[j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return bc;
}

inline void RunKernel(Kernel& kernel, const Node& node, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                      int opset = 17) {
  KernelContext kc{node, opset};
  for (const Tensor& t : inputs) kc.inputs.push_back(t.buffer() ? &t : nullptr);
  for (Tensor& t : outputs) kc.outputs.push_back(&t);
  // A host kernel's workspace (Kernel::WorkspaceBytes), as a plan's arena gives it: here full of NaNs, so a kernel
  // reading a byte of it before writing it shows in its outputs.
  std::shared_ptr<Buffer> workspace;
  if (const size_t bytes = kernel.WorkspaceBytes()) {
    workspace = Allocator::Host().Allocate(bytes);
    std::memset(workspace->data(), 0xFF, bytes);
    kc.workspace = workspace->data();
  }
  kernel.Run(kc);
}

/// Scaled copy (to push pre-activation values across an activation's interesting range).
inline Tensor Scaled(const Tensor& t, float factor) {
  Tensor out = t.Clone();
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] *= factor;
  return out;
}

/// `inputs` for a kernel's second run: new buffers, the float32 run-time ones (not flagged `constant`) with other
/// values (scaled by -0.5), so a kernel reading a buffer of its first run gives a wrong result.
inline std::vector<Tensor> OtherRuntimeInputs(const std::vector<Tensor>& inputs, const std::vector<bool>& constant) {
  std::vector<Tensor> other;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool runtime = inputs[i].buffer() && !(i < constant.size() && constant[i]);
    other.push_back(!runtime                              ? inputs[i]
                    : inputs[i].dtype() == DType::kF32 ? Scaled(inputs[i], -0.5f)
                                                        : inputs[i].Clone());
  }
  return other;
}

/// Creates the fast kernel through CreateCpuKernel (or `factory` when given), checks its name, runs it twice and
/// compares every output with the reference kernel's (within kFastRtol and `atol`). The second run reads other buffers
/// holding other values (the float32 run-time inputs scaled by -0.5) and writes a fresh output, so a kernel that
/// keeps a buffer of its first run (state reused between runs) fails.
inline void ExpectFastMatchesReference(const Node& node, const std::vector<Tensor>& inputs,
                                       const std::vector<bool>& constant, const std::string& expected_name,
                                       int opset = 17,
                                       std::unique_ptr<Kernel> (*factory)(const KernelBuildContext&) = nullptr,
                                       float atol = kFastAtol) {
  std::vector<Tensor> expected = RunReferenceNode(node, inputs, opset);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs, opset);
  std::unique_ptr<Kernel> kernel = factory ? factory(bc) : CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr) << "no fast kernel for " << node.op_type;
  EXPECT_EQ(std::string(kernel->Name()), expected_name);
  // Every output the reference kernel writes (a Split's, an LSTM's), not only the first.
  auto expect_outputs = [&](const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      SCOPED_TRACE("output " + std::to_string(j));
      ExpectTensorNear(got[j], want[j], kFastRtol, atol);
    }
  };
  {
    SCOPED_TRACE("run 0");
    RunKernel(*kernel, node, inputs, outputs, opset);
    expect_outputs(outputs, expected);
  }
  const std::vector<Tensor> second_inputs = OtherRuntimeInputs(inputs, constant);
  std::vector<Tensor> second_expected = RunReferenceNode(node, second_inputs, opset);
  std::vector<Tensor> second_outputs;
  MakeBuildContext(node, second_inputs, constant, second_outputs, opset);  // fresh NaN-filled outputs
  SCOPED_TRACE("run 1, other buffers");
  RunKernel(*kernel, node, second_inputs, second_outputs, opset);
  expect_outputs(second_outputs, second_expected);
}

/// For cases where oneDNN 2.6 offers only its slow reference implementation (so the factory declines) but a later
/// version may not: when a kernel is created it must match the reference. Returns whether one was created.
inline bool ExpectMatchIfOffered(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                                 const std::string& expected_name, int opset = 17) {
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs, opset);
  if (CreateCpuKernel(bc) == nullptr) return false;
  ExpectFastMatchesReference(node, inputs, constant, expected_name, opset);
  return true;
}

/// True when CreateCpuKernel declines the node (so the runtime uses the reference kernel).
inline bool FastKernelDeclines(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                               int opset = 17) {
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs, opset);
  return CreateCpuKernel(bc) == nullptr;
}

/// A per-process file name in the temporary directory, e.g. for OSPREY_TUNE_CACHE.
inline std::string TempCachePath(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(getpid()) + ".tsv"))
      .string();
}

/// The lines of a text file (none when it does not exist).
inline std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace osprey::testing
