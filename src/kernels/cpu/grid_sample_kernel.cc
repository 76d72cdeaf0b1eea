// GridSample on plain float32 [N, C, H, W]: each output point's taps (ops/grid_sample.h, the reference kernel's) are
// computed once and applied to every channel, where the reference recomputes them per channel; output rows are
// split over the plan's threads. Bilinear [1, 64, 128, 128]: see docs/performance.md (twenty-third session).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/grid_sample.h"

namespace osprey {
namespace {

class GridSampleKernel final : public Kernel {
 public:
  explicit GridSampleKernel(int threads) : threads_(threads) {}
  const char* Name() const override { return "GridSampleCpu"; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    const Tensor& grid = ctx.In(1);
    Tensor& y = ctx.Out(0);
    const int64_t batch = x.dim(0), channels = x.dim(1), h = x.dim(2), w = x.dim(3);
    const int64_t rows = grid.dim(1), cols = grid.dim(2), plane = h * w, points = rows * cols;
    const GridSampleParams p = ReadGridSample(ctx.node, h, w);
    const bool linear_zeros = p.mode == GridSampleParams::kLinear && p.padding == GridSampleParams::kZeros;
    const float* xd = x.data<float>();
    const float* gd = grid.data<float>();
    float* yd = y.data<float>();
    const int64_t work = batch * rows;
    const int parts =
        static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(1, work * cols * channels / 4096)));
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int64_t nr = 0; nr < work; ++nr) {
      const int64_t n = nr / rows;
      int64_t offset[kMaxGridTaps];
      float weight[kMaxGridTaps];
      for (int64_t i = (nr % rows) * cols, end = i + cols; i < end; ++i) {
        const float* g = gd + (n * points + i) * 2;
        const int taps =
            linear_zeros ? LinearZerosTaps(p, g[0], g[1], offset, weight) : GridTaps(p, g[0], g[1], offset, weight);
        const float* in = xd + n * channels * plane;
        float* out = yd + n * channels * points + i;
        for (int64_t c = 0; c < channels; ++c, in += plane, out += points) {
          float sum = taps < 0 ? std::numeric_limits<float>::quiet_NaN() : 0.f;
          for (int t = 0; t < taps; ++t) sum += weight[t] * in[offset[t]];
          *out = sum;
        }
      }
    }
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Kernel> CreateGridSampleKernel(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.size() != 2 || ctx.input_shapes[0].size() != 4 || ctx.input_dtypes[0] != DType::kF32 ||
      ctx.input_dtypes[1] != DType::kF32)
    return nullptr;
  return std::make_unique<GridSampleKernel>(std::max(1, ctx.num_threads));
}

}  // namespace osprey
