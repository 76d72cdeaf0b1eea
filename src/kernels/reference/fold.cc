// Reference kernels of Col2Im and MaxUnpool (ops/fold.h).
#include "ops/fold.h"

#include <algorithm>
#include <cstring>

#include "kernels/reference/reference.h"

namespace osprey {
namespace {

// Every (channel, block offset, block position) adds its value where it lands on the image, if inside it.
void Col2ImKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Col2ImParams p = ResolveCol2Im(ctx.node, x.shape(), ctx.In(1), ctx.In(2));
  Tensor& out = ctx.Out(0);
  const size_t dims = p.image.size();
  int64_t kernel = 1, blocks = 1, pixels = 1;
  for (size_t d = 0; d < dims; ++d) {
    kernel *= p.block[d];
    blocks *= p.blocks[d];
    pixels *= p.image[d];
  }
  const float* in = x.data<float>();
  float* o = out.data<float>();
  std::fill(o, o + out.numel(), 0.0f);
  std::vector<int64_t> k(dims), b(dims);
  for (int64_t n = 0; n < x.dim(0); ++n)
    for (int64_t c = 0; c < p.channels; ++c)
      for (int64_t kf = 0; kf < kernel; ++kf) {
        for (int64_t rem = kf, d = static_cast<int64_t>(dims) - 1; d >= 0; --d) {
          k[d] = rem % p.block[d];
          rem /= p.block[d];
        }
        const float* row = in + ((n * p.channels + c) * kernel + kf) * blocks;
        float* plane = o + (n * p.channels + c) * pixels;
        for (int64_t bf = 0; bf < blocks; ++bf) {
          int64_t at = 0;
          bool inside = true;
          for (int64_t rem = bf, d = static_cast<int64_t>(dims) - 1; d >= 0; --d) {
            b[d] = rem % p.blocks[d];
            rem /= p.blocks[d];
          }
          for (size_t d = 0; d < dims && inside; ++d) {
            const int64_t i = b[d] * p.strides[d] - p.pads_begin[d] + k[d] * p.dilations[d];
            inside = i >= 0 && i < p.image[d];
            at = at * p.image[d] + i;
          }
          if (inside) plane[at] += row[bf];
        }
      }
}

// Y = 0, then Y.flat[I.flat[j]] = X.flat[j] (a later duplicate index wins, as in the ONNX reference).
void MaxUnpoolKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& indices = ctx.In(1);
  Tensor& out = ctx.Out(0);
  const Tensor* given = ctx.inputs.size() > 2 ? ctx.inputs[2] : nullptr;
  (void)ResolveMaxUnpool(ctx.node, x.shape(), given);  // checks the sizes again
  if (indices.dtype() != DType::kI64 || indices.shape() != x.shape())
    throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": I must be int64 of X's shape");
  float* o = out.data<float>();
  const int64_t size = out.numel();
  std::fill(o, o + size, 0.0f);
  const float* v = x.data<float>();
  const int64_t* at = indices.data<int64_t>();
  for (int64_t j = 0, n = x.numel(); j < n; ++j) {
    if (at[j] < 0 || at[j] >= size)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": index " + std::to_string(at[j]) + " at " +
                                                   std::to_string(j) + " is outside the output's " +
                                                   std::to_string(size) + " elements");
    o[at[j]] = v[j];
  }
}

}  // namespace

void AddFoldReferenceKernels(ReferenceKernelTable& t) {
  t.Add("Col2Im", Col2ImKernel);
  t.Add("MaxUnpool", MaxUnpoolKernel);
}

}  // namespace osprey
