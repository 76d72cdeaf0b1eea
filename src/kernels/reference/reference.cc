#include "kernels/reference/reference.h"

#include <algorithm>

#include "ops/activation.h"

namespace osprey {

ReferenceKernel FindReferenceKernel(const std::string& op_type) {
  static const ReferenceKernelTable table = [] {
    ReferenceKernelTable t;
    AddElementwiseReferenceKernels(t);
    AddNnReferenceKernels(t);
    AddReductionReferenceKernels(t);
    AddShapeReferenceKernels(t);
    AddImageReferenceKernels(t);
    AddAugmentReferenceKernels(t);
    AddInternalReferenceKernels(t);
    AddRecurrentReferenceKernels(t);
    AddQuantizeReferenceKernels(t);
    AddSignalReferenceKernels(t);
    AddFoldReferenceKernels(t);
    AddLinalgReferenceKernels(t);
    AddDeformConvReferenceKernels(t);
    std::sort(t.entries.begin(), t.entries.end());
    return t;
  }();
  auto it = std::lower_bound(table.entries.begin(), table.entries.end(), op_type,
                             [](const auto& e, const std::string& name) { return e.first < name; });
  if (it == table.entries.end() || it->first != op_type) return nullptr;
  return it->second;
}

void ApplyFusedActivation(const Node& node, float* data, int64_t n) {
  Activation act;
  if (!Activation::FromFusedNode(node, &act))
    throw Error(ErrorCode::kInternal,
                node.Describe() + ": unknown fused activation '" + node.GetString("_activation", "") + "'");
  act.Apply(data, n);
}

}  // namespace osprey
