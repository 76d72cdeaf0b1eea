#include "ops/fused_depthwise.h"

#include <algorithm>

namespace osprey {
namespace {

constexpr const char* kActivationAttrs[] = {"_activation", "_alpha", "_beta"};
constexpr const char* kDwActivationAttrs[] = {"_dw_activation", "_dw_alpha", "_dw_beta"};

}  // namespace

bool HasFusedDepthwise(const Node& conv) { return conv.op_type == "Conv" && conv.Has("_dw_strides"); }

Node FusedPointwisePart(const Node& fused) {
  Node part = fused;
  part.inputs.resize(std::min<size_t>(fused.inputs.size(), 3));
  part.attrs.erase("_dw_strides");
  for (const char* name : kDwActivationAttrs) part.attrs.erase(name);
  return part;
}

Node FusedDepthwisePart(const Node& fused, int64_t channels) {
  Node part;
  part.op_type = "Conv";
  part.name = fused.name + "/depthwise";
  auto input = [&](size_t i) { return i < fused.inputs.size() ? fused.inputs[i] : -1; };
  part.inputs = {input(0), input(kDwWeightInput), input(kDwBiasInput)};
  part.outputs = fused.outputs;
  part.attrs["group"] = Attribute::Int(channels);
  part.attrs["kernel_shape"] = Attribute::Ints({3, 3});
  part.attrs["pads"] = Attribute::Ints(fused.GetInts("_dw_pads", {1, 1, 1, 1}));
  part.attrs["strides"] = Attribute::Ints(fused.GetInts("_dw_strides"));
  for (int i = 0; i < 3; ++i) {
    auto it = fused.attrs.find(kDwActivationAttrs[i]);
    if (it != fused.attrs.end()) part.attrs[kActivationAttrs[i]] = it->second;
  }
  return part;
}

Node FuseDepthwiseInto(const Node& pointwise, const Node& depthwise, const std::vector<int64_t>& depthwise_pads) {
  Node fused = pointwise;
  fused.name = pointwise.name + "+" + depthwise.name;
  fused.inputs.resize(6, -1);
  fused.inputs[kDwWeightInput] = depthwise.inputs[1];
  fused.inputs[kDwBiasInput] = depthwise.inputs.size() > 2 ? depthwise.inputs[2] : -1;
  fused.outputs = depthwise.outputs;
  fused.attrs["_dw_strides"] = Attribute::Ints(depthwise.GetInts("strides", {1, 1}));
  fused.attrs["_dw_pads"] = Attribute::Ints(depthwise_pads);
  for (int i = 0; i < 3; ++i) {
    auto it = depthwise.attrs.find(kActivationAttrs[i]);
    if (it != depthwise.attrs.end()) fused.attrs[kDwActivationAttrs[i]] = it->second;
  }
  return fused;
}

}  // namespace osprey
