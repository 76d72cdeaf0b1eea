#pragma once
// Reference kernels, one per op. Looked up by op type.
#include "kernels/kernel.h"

namespace osprey {

/// The reference kernel for `op_type`, or nullptr.
ReferenceKernel FindReferenceKernel(const std::string& op_type);

/// Registration table filled by the per-family Add*ReferenceKernels functions.
struct ReferenceKernelTable {
  std::vector<std::pair<std::string, ReferenceKernel>> entries;
  void Add(const std::string& op_type, ReferenceKernel fn) { entries.emplace_back(op_type, fn); }
};
void AddElementwiseReferenceKernels(ReferenceKernelTable& t);
void AddNnReferenceKernels(ReferenceKernelTable& t);
void AddReductionReferenceKernels(ReferenceKernelTable& t);
void AddShapeReferenceKernels(ReferenceKernelTable& t);
void AddImageReferenceKernels(ReferenceKernelTable& t);
void AddAugmentReferenceKernels(ReferenceKernelTable& t);
void AddInternalReferenceKernels(ReferenceKernelTable& t);  // internal.cc: ops made by fusion (_ChannelShuffle)
void AddRecurrentReferenceKernels(ReferenceKernelTable& t);  // recurrent.cc: RNN, GRU, LSTM

/// Applies the fused activation described by a node's internal attributes (_activation, _alpha, _beta) in place.
/// Used by the reference Conv/Gemm/MatMul when the fusion pass has folded an activation into them.
void ApplyFusedActivation(const Node& node, float* data, int64_t n);

}  // namespace osprey
