// Col2Im (PyTorch's F.fold) of plain float32 data with two spatial dims and compile-time image and block sizes: the
// reference's walk (every value's image position worked out from flat indices by division, ~14 ns a value) as
// loops over planes, block offsets and block rows, with each block row's valid columns found once. Values land in
// the same order as the reference adds them, so results are identical. MobileViTV2 (Hugging Face) folds its patches
// back this way: [1, 512, 256] -> [1, 128, 32, 32] took 1.9 ms.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/fold.h"

namespace osprey {
namespace {

class Col2Im2d final : public Kernel {
 public:
  explicit Col2Im2d(const Col2ImParams& p) : p_(p) {}
  const char* Name() const override { return "Col2ImF32"; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    const int64_t kh = p_.block[0], kw = p_.block[1], bh = p_.blocks[0], bw = p_.blocks[1];
    const int64_t h = p_.image[0], w = p_.image[1], planes = x.dim(0) * p_.channels;
    if (x.numel() != planes * kh * kw * bh * bw || y.numel() != planes * h * w)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": Col2ImF32: tensor sizes changed");
    const float* in = x.data<float>();
    float* out = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() >= (int64_t{1} << 15))
    for (int64_t plane = 0; plane < planes; ++plane) {
      float* o = out + plane * h * w;
      std::fill(o, o + h * w, 0.f);
      for (int64_t ki = 0; ki < kh; ++ki)
        for (int64_t kj = 0; kj < kw; ++kj) {
          const float* row = in + ((plane * kh + ki) * kw + kj) * bh * bw;
          // Block column bx lands on image column bx * stride + shift: inside for bx in [lo, hi).
          const int64_t sw = p_.strides[1], shift = kj * p_.dilations[1] - p_.pads_begin[1];
          const int64_t lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
          const int64_t hi = w - shift <= 0 ? 0 : std::min(bw, (w - shift + sw - 1) / sw);
          for (int64_t by = 0; by < bh; ++by) {
            const int64_t iy = by * p_.strides[0] - p_.pads_begin[0] + ki * p_.dilations[0];
            if (iy < 0 || iy >= h) continue;
            const int64_t at = iy * w + shift;  // + bx * sw: in [iy * w, (iy + 1) * w) for bx in [lo, hi)
            const float* values = row + by * bw;
            for (int64_t bx = lo; bx < hi; ++bx) o[at + bx * sw] += values[bx];
          }
        }
    }
  }

 private:
  Col2ImParams p_;
};

}  // namespace

std::unique_ptr<Kernel> CreateCol2ImKernel(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.size() != 3 || ctx.input_values.size() != 3 || !ctx.input_values[1] || !ctx.input_values[2] ||
      ctx.input_dtypes[0] != DType::kF32 || ctx.InLayout(0) != Layout::kPlain || ctx.OutLayout(0) != Layout::kPlain)
    return nullptr;
  const Col2ImParams p = ResolveCol2Im(ctx.node, ctx.input_shapes[0], *ctx.input_values[1], *ctx.input_values[2]);
  if (p.image.size() != 2) return nullptr;
  return std::make_unique<Col2Im2d>(p);
}

}  // namespace osprey
