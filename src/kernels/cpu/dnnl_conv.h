#pragma once
// The oneDNN Conv kernel's layout choice, exposed for tests and measurements.
#include <memory>

#include "kernels/kernel.h"

namespace osprey::cpu {

/// Layout of the activations the convolution primitive itself reads and writes. osprey tensors are always plain
/// NCHW; any other choice adds a reorder of the input before and of the output after the primitive.
enum class ConvLayout {
  kPlain,         // the primitive works on NCHW directly
  kChannelsLast,  // reorder to NHWC and back
  kPreferred,     // reorder to the layout oneDNN prefers (blocked nChw16c on AVX-512) and back
};

/// A Conv kernel using `layout`, or nullptr. CreateDnnlConv(ctx) picks the layout measured fastest.
std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx, ConvLayout layout);

}  // namespace osprey::cpu
