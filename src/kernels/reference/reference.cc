#include "kernels/reference/reference.h"

#include <algorithm>
#include <cmath>

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
    std::sort(t.entries.begin(), t.entries.end());
    return t;
  }();
  auto it = std::lower_bound(table.entries.begin(), table.entries.end(), op_type,
                             [](const auto& e, const std::string& name) { return e.first < name; });
  if (it == table.entries.end() || it->first != op_type) return nullptr;
  return it->second;
}

void ApplyFusedActivation(const Node& node, float* data, int64_t n) {
  std::string act = node.GetString("_activation", "");
  if (act.empty()) return;
  float alpha = node.GetFloat("_alpha", 0.f);
  float beta = node.GetFloat("_beta", 0.f);
  if (act == "Relu") {
    for (int64_t i = 0; i < n; ++i) data[i] = std::max(data[i], 0.f);
  } else if (act == "LeakyRelu") {
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] >= 0 ? data[i] : data[i] * alpha;
  } else if (act == "Clip") {
    for (int64_t i = 0; i < n; ++i) data[i] = std::min(std::max(data[i], alpha), beta);
  } else if (act == "Sigmoid") {
    for (int64_t i = 0; i < n; ++i) data[i] = 1.f / (1.f + std::exp(-data[i]));
  } else if (act == "Tanh") {
    for (int64_t i = 0; i < n; ++i) data[i] = std::tanh(data[i]);
  } else if (act == "HardSigmoid") {
    for (int64_t i = 0; i < n; ++i) data[i] = std::min(std::max(alpha * data[i] + beta, 0.f), 1.f);
  } else if (act == "HardSwish") {
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] * std::min(std::max(data[i] / 6.f + 0.5f, 0.f), 1.f);
  } else if (act == "Silu") {  // x * sigmoid(x): Mul(x, Sigmoid(x)) fused
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] / (1.f + std::exp(-data[i]));
  } else if (act == "Gelu") {
    for (int64_t i = 0; i < n; ++i) data[i] = 0.5f * data[i] * (1.f + std::erf(data[i] * 0.70710678118654752f));
  } else {
    throw Error(ErrorCode::kInternal, node.Describe() + ": unknown fused activation '" + act + "'");
  }
}

}  // namespace osprey
