#include "kernels/cpu/own_conv.h"

#include <string>

#include "kernels/cpu/dnnl_common.h"
#include "ops/conv_input_scale.h"

namespace osprey::cpu {

void CheckOwnConvTensors(const KernelContext& ctx, const char* name, const OwnConvGeometry& g, Layout input_layout) {
  const Shape x_shape{g.batch, g.in_c, g.in_h, g.in_w}, y_shape{g.batch, g.out_c, g.out_h, g.out_w};
  const Shape pooled_shape{g.batch, g.out_c, g.pooled_h, g.pooled_w};
  if (g.input_parts.empty()) {
    CheckActivation(ctx.node, name, "input", ctx.In(0), x_shape, input_layout);
  } else {
    for (size_t i = 0; i < g.input_parts.size(); ++i)
      CheckActivation(ctx.node, name, "input part", ctx.In(InputPartIndex(static_cast<int>(i))),
                      Shape{g.batch, g.input_parts[i], g.in_h, g.in_w}, input_layout);
  }
  if (g.input_affine)
    for (int in : {kInputAffineScale, kInputAffineShift})
      if (ctx.In(in).numel() != g.in_c)
        throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for an input affine of " +
                                              std::to_string(g.in_c) + " channels, got " +
                                              ShapeToString(ctx.In(in).shape()));
  CheckActivation(ctx.node, name, "output", ctx.Out(0), g.pool_kh > 0 ? pooled_shape : y_shape, Layout::kNhwc);
  if (g.residual) CheckActivation(ctx.node, name, "residual", ctx.In(3), y_shape, Layout::kNhwc);
  if (g.input_scale) {
    const Tensor& s = ctx.In(kInputScaleInput);
    if (s.shape().size() != 4 || (s.dim(0) != 1 && s.dim(0) != g.batch) || s.dim(1) != g.in_c || s.numel() % g.in_c)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for an input scale of " +
                                            std::to_string(g.in_c) + " channels, got " + ShapeToString(s.shape()));
  }
  if (g.bias && ctx.In(2).numel() != g.out_c)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for " + std::to_string(g.out_c) +
                                          " bias values, got " + std::to_string(ctx.In(2).numel()));
}

}  // namespace osprey::cpu
