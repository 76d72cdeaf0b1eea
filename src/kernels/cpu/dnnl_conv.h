#pragma once
// The oneDNN Conv kernel's layout choice, exposed for tests and measurements.
#include <memory>

#include "kernels/kernel.h"

namespace osprey::cpu {

/// Layout of the activations the convolution primitive itself reads and writes. Where the kernel's tensors are in
/// another layout, a reorder of the input before and of the output after the primitive bridges the difference.
enum class ConvLayout {
  kPlain,         // the primitive works on NCHW
  kChannelsLast,  // the primitive works on NHWC
  kPreferred,     // the primitive works in the layout oneDNN prefers (blocked nChw16c on AVX-512)
};

/// A Conv kernel whose primitive works in `layout`, or nullptr. Its own tensors (input 0, residual input 3, output 0)
/// are plain or NHWC as ctx's layouts say; reorders bridge any difference. CreateDnnlConv(ctx) picks the layout
/// measured fastest (kChannelsLast whenever a tensor is NHWC). Asked for NHWC tensors it cannot take (not 2-D, no
/// fast oneDNN kernel), it throws kInternal instead of returning nullptr.
std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx, ConvLayout layout);

/// The oneDNN implementation a kernel from CreateDnnlConv runs (pd.impl_info_str(), e.g. "brgconv:avx512_core"), or
/// "" for any other kernel.
const char* DnnlConvImplementation(const Kernel& kernel);

}  // namespace osprey::cpu
