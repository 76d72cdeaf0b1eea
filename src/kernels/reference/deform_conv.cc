// Reference kernel of DeformConv (ops/deform_conv.h): per image and input channel, the sampled columns (kernel tap x
// output pixel, bilinear with zeros outside, times the mask), summed against the weights of the output channels of
// its group, as a convolution over im2col columns would.
#include "ops/deform_conv.h"

#include <cmath>
#include <vector>

#include "kernels/reference/reference.h"

namespace osprey {
namespace {

const Tensor* Optional(KernelContext& ctx, int i) {
  return i < static_cast<int>(ctx.inputs.size()) && ctx.inputs[i] != nullptr && ctx.inputs[i]->numel() > 0
             ? ctx.inputs[i]
             : nullptr;
}

// X[y, x] of one channel plane, bilinear, taps outside the plane reading 0.
float Sample(const float* plane, int64_t h, int64_t w, double y, double x) {
  if (!(y > -1 && y < static_cast<double>(h) && x > -1 && x < static_cast<double>(w))) return 0.0f;  // NaN: 0
  const double fy = std::floor(y), fx = std::floor(x);
  const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  const double ty = y - fy, tx = x - fx;
  auto at = [&](int64_t yy, int64_t xx) -> double {
    return yy >= 0 && yy < h && xx >= 0 && xx < w ? plane[yy * w + xx] : 0.0;
  };
  return static_cast<float>((1 - ty) * ((1 - tx) * at(y0, x0) + tx * at(y0, x0 + 1)) +
                            ty * ((1 - tx) * at(y0 + 1, x0) + tx * at(y0 + 1, x0 + 1)));
}

void DeformConvKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  const Tensor& offset = ctx.In(2);
  const Tensor* bias = Optional(ctx, 3);
  const Tensor* mask = Optional(ctx, 4);
  const Shape bias_shape = bias ? bias->shape() : Shape{}, mask_shape = mask ? mask->shape() : Shape{};
  const DeformConvParams p = ResolveDeformConv(ctx.node, x.shape(), w.shape(), offset.shape(),
                                               bias ? &bias_shape : nullptr, mask ? &mask_shape : nullptr);
  Tensor& out = ctx.Out(0);
  const int64_t taps = p.kh * p.kw, pixels = p.out_h * p.out_w, in_per_group = p.in_c / p.group;
  const int64_t out_per_group = p.out_c / p.group, in_per_offset = p.in_c / p.offset_group;
  // One input channel's sampled columns at a time (kernel tap x output pixel), added at once into the output
  // channels of its group: extra memory is the output's size in doubles plus one channel's columns.
  std::vector<float> columns(static_cast<size_t>(taps * pixels));
  std::vector<double> acc(static_cast<size_t>(p.out_c * pixels));
  const float* xd = x.data<float>();
  const float* wd = w.data<float>();
  const float* od = offset.data<float>();
  const float* md = mask ? mask->data<float>() : nullptr;
  float* y = out.data<float>();
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t oc = 0; oc < p.out_c; ++oc)
      std::fill(acc.begin() + oc * pixels, acc.begin() + (oc + 1) * pixels, bias ? bias->data<float>()[oc] : 0.0);
    for (int64_t c = 0; c < p.in_c; ++c) {
      const int64_t og = c / in_per_offset, g = c / in_per_group, ci = c % in_per_group;
      const float* plane = xd + (n * p.in_c + c) * p.in_h * p.in_w;
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t ki = k / p.kw, kj = k % p.kw;
        const float* dy = od + ((n * p.offset_group + og) * taps * 2 + k * 2) * pixels;
        const float* dx = dy + pixels;
        const float* m = md ? md + ((n * p.offset_group + og) * taps + k) * pixels : nullptr;
        float* col = columns.data() + k * pixels;
        for (int64_t i = 0; i < p.out_h; ++i)
          for (int64_t j = 0; j < p.out_w; ++j) {
            const int64_t q = i * p.out_w + j;
            const double sy = static_cast<double>(i * p.stride_h - p.pad_top + ki * p.dil_h) + dy[q];
            const double sx = static_cast<double>(j * p.stride_w - p.pad_left + kj * p.dil_w) + dx[q];
            col[q] = Sample(plane, p.in_h, p.in_w, sy, sx) * (m ? m[q] : 1.0f);
          }
      }
      for (int64_t oc = g * out_per_group; oc < (g + 1) * out_per_group; ++oc) {
        double* a = acc.data() + oc * pixels;
        for (int64_t k = 0; k < taps; ++k) {
          const double weight = wd[(oc * in_per_group + ci) * taps + k];
          const float* col = columns.data() + k * pixels;
          for (int64_t q = 0; q < pixels; ++q) a[q] += weight * col[q];
        }
      }
    }
    float* dst = y + n * p.out_c * pixels;
    for (int64_t e = 0; e < p.out_c * pixels; ++e) dst[e] = static_cast<float>(acc[e]);
  }
}

}  // namespace

void AddDeformConvReferenceKernels(ReferenceKernelTable& t) { t.Add("DeformConv", DeformConvKernel); }

}  // namespace osprey
