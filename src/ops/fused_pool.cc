#include "ops/fused_pool.h"

#include "ops/activation.h"
#include "ops/conv_input_scale.h"
#include "ops/conv_window.h"
#include "ops/fused_depthwise.h"

namespace osprey {
namespace {

constexpr const char* kPoolAttrs[] = {"_pool_kernel", "_pool_strides", "_pool_pads", "_pool_ceil"};

}  // namespace

bool HasFusedPool(const Node& conv) { return conv.op_type == "Conv" && conv.Has("_pool_kernel"); }

bool CarriesAnotherFusedPart(const Node& conv) {
  return HasFusedDepthwise(conv) || HasFusedPRelu(conv) || conv.GetInt("_int8", 0) != 0 ||
         conv.GetInt("_residual", 0) != 0 || HasInputScale(conv) || HasInputAffine(conv) || HasInputParts(conv);
}

Shape FusedConvOutputShape(const Node& fused, const Shape& x, const Shape& w) {
  const std::vector<int64_t> kernel(w.begin() + 2, w.end());
  Shape y = {x[0], w[0]};
  for (int64_t d : ResolveConvWindow(FusedConvPart(fused), x, kernel, /*ceil_mode=*/false).out) y.push_back(d);
  return y;
}

Node FusedConvPart(const Node& fused) {
  Node part = fused;
  for (const char* name : kPoolAttrs) part.attrs.erase(name);
  return part;
}

Node FusedPoolPart(const Node& fused) {
  Node part;
  part.op_type = "MaxPool";
  part.name = fused.name + "/pool";
  part.inputs = {fused.inputs.empty() ? -1 : fused.inputs[0]};
  part.outputs = fused.outputs;
  part.attrs["kernel_shape"] = Attribute::Ints(fused.GetInts("_pool_kernel"));
  part.attrs["strides"] = Attribute::Ints(fused.GetInts("_pool_strides", {1, 1}));
  part.attrs["pads"] = Attribute::Ints(fused.GetInts("_pool_pads", {0, 0, 0, 0}));
  part.attrs["ceil_mode"] = Attribute::Int(fused.GetInt("_pool_ceil", 0));
  return part;
}

Node FusePoolInto(const Node& conv, const Node& pool, const std::vector<int64_t>& pool_pads) {
  Node fused = conv;
  fused.name = conv.name + "+" + pool.name;
  fused.outputs = {pool.outputs[0]};
  fused.attrs["_pool_kernel"] = Attribute::Ints(pool.GetInts("kernel_shape"));
  fused.attrs["_pool_strides"] = Attribute::Ints(pool.GetInts("strides", {1, 1}));
  fused.attrs["_pool_pads"] = Attribute::Ints(pool_pads);
  fused.attrs["_pool_ceil"] = Attribute::Int(pool.GetInt("ceil_mode", 0));
  return fused;
}

}  // namespace osprey
