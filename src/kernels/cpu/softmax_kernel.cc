// Softmax / LogSoftmax (opset >= 13) over an axis that is not the last one, where oneDNN has only its reference
// implementation: YOLOv8's distribution-focal-loss head normalises [1, 16, 4, A] along axis 1. The elements of one
// softmax are `inner` floats apart, so the loops run across `inner` instead: a block of neighbouring positions is
// normalised at once, each lane one softmax, vectorised (`omp simd`, vector_math.h's Exp; compiled for AVX-512, AVX2
// and the baseline, picked at start-up with GCC target_clones). The sum is float; the reference's is double (agreement
// within a few ulp, checked in tests/unit/kernels).
#pragma GCC optimize("no-trapping-math")  // lets the max's compare-and-select vectorise (nothing reads FP flags)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_math.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

constexpr int64_t kBlock = 256;  // positions normalised together: 1 KiB per row of the block

// One block: x and y point at position p of element 0; element k is at k * inner. n <= kBlock positions.
__attribute__((target_clones("avx512f", "avx2", "default"))) void SoftmaxBlock(const float* x, float* y, int64_t len,
                                                                              int64_t inner, int64_t n, bool log) {
  float max_value[kBlock], sum[kBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) max_value[i] = x[i];
  for (int64_t k = 1; k < len; ++k) {
    const float* row = x + k * inner;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) max_value[i] = row[i] > max_value[i] ? row[i] : max_value[i];
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = 0.f;
  for (int64_t k = 0; k < len; ++k) {
    const float* row = x + k * inner;
    float* out = y + k * inner;
    if (log) {  // two loops: a store under a condition keeps the loop scalar
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) sum[i] += cpu::vmath::Exp(row[i] - max_value[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float e = cpu::vmath::Exp(row[i] - max_value[i]);
        out[i] = e;
        sum[i] += e;
      }
    }
  }
  if (log) {  // (x - max) - log(sum), as the reference orders it: no rounding at the magnitude of max
    for (int64_t i = 0; i < n; ++i) sum[i] = std::log(sum[i]);
    for (int64_t k = 0; k < len; ++k) {
      const float* row = x + k * inner;
      float* out = y + k * inner;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = (row[i] - max_value[i]) - sum[i];
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = 1.f / sum[i];
  for (int64_t k = 0; k < len; ++k) {
    float* out = y + k * inner;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] *= sum[i];
  }
}

class StridedSoftmaxKernel final : public Kernel {
 public:
  StridedSoftmaxKernel(const Shape& shape, int64_t axis, bool log, int num_threads)
      : shape_(shape), log_(log), num_threads_(num_threads > 0 ? num_threads : omp_get_max_threads()) {
    for (int64_t d = 0; d < axis; ++d) outer_ *= shape[d];
    len_ = shape[axis];
    for (size_t d = axis + 1; d < shape.size(); ++d) inner_ *= shape[d];
  }
  const char* Name() const override { return log_ ? "LogSoftmaxF32Strided" : "SoftmaxF32Strided"; }

  void Run(KernelContext& ctx) override {
    if (ctx.In(0).shape() != shape_ || ctx.Out(0).shape() != shape_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + Name() + " was built for " +
                                            ShapeToString(shape_) + ", got " + ShapeToString(ctx.In(0).shape()));
    const float* x = ctx.In(0).data<float>();
    float* y = ctx.Out(0).data<float>();
    const int64_t blocks = (inner_ + kBlock - 1) / kBlock, tasks = outer_ * blocks;
    const int threads =
        static_cast<int>(std::min<int64_t>(num_threads_, outer_ * inner_ * len_ >= (int64_t{1} << 15) ? tasks : 1));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / blocks, p = t % blocks * kBlock;
      const int64_t offset = o * len_ * inner_ + p;
      SoftmaxBlock(x + offset, y + offset, len_, inner_, std::min(kBlock, inner_ - p), log_);
    }
  }

 private:
  Shape shape_;
  bool log_;
  int num_threads_;
  int64_t outer_ = 1, len_ = 1, inner_ = 1;
};

}  // namespace

std::unique_ptr<Kernel> CreateStridedSoftmax(const KernelBuildContext& ctx, int64_t axis) {
  const Shape& x = ctx.input_shapes[0];
  int64_t inner = 1;
  for (size_t d = axis + 1; d < x.size(); ++d) inner *= x[d];
  // Across at least 8 positions, so every vector lane has its own softmax; opset >= 13 (one axis, not a 2-D flatten).
  if (ctx.opset < 13 || inner < 8 || x[axis] < 1) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  return std::make_unique<StridedSoftmaxKernel>(x, axis, ctx.node.op_type == "LogSoftmax", ctx.num_threads);
}

}  // namespace osprey
