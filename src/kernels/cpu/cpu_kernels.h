#pragma once
// Fast CPU kernels (oneDNN and hand-written). A factory returns nullptr when it does not handle the case, and the
// runtime falls back to the reference kernel.
#include <memory>

#include "kernels/kernel.h"

namespace osprey {

/// A prepared fast kernel for the node, or nullptr.
std::unique_ptr<Kernel> CreateCpuKernel(const KernelBuildContext& ctx);

}  // namespace osprey
