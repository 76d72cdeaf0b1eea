#pragma once
// Fast CPU kernels (oneDNN and hand-written). A factory returns nullptr when it does not handle the case, and the
// runtime falls back to the reference kernel.
#include <memory>

#include "kernels/kernel.h"

namespace osprey {

/// A prepared fast kernel for the node, or nullptr.
std::unique_ptr<Kernel> CreateCpuKernel(const KernelBuildContext& ctx);

/// Fast kernels for osprey-domain image ops (image_kernels.cc), or nullptr.
std::unique_ptr<Kernel> CreateImageKernel(const KernelBuildContext& ctx);

/// True when CreateCpuKernel for this node (dtypes/shapes/values as in `ctx`; layouts ignored) will build a kernel
/// that accepts kNhwc on input 0 (and input 3, a fused residual), and produces kNhwc on output 0, in any combination
/// the runtime asks for. The runtime's layout pass keeps channels-last activations between such nodes.
bool CpuKernelSupportsNhwc(const KernelBuildContext& ctx);

/// A kernel converting a float32 rank-4 tensor of logical shape `shape` between kPlain and kNhwc (input 0 -> output
/// 0). Inserted by the runtime's layout pass where a channels-last value meets a node that needs plain input.
std::unique_ptr<Kernel> CreateLayoutReorderKernel(const Shape& shape, Layout from, Layout to, int num_threads);

}  // namespace osprey
