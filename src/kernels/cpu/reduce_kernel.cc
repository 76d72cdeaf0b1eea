// ReduceSum / ReduceMean / ReduceSumSquare / ReduceL1 / ReduceL2 / ReduceMax / ReduceMin on float32 plain tensors whose
// reduced axes form one block once size-1 dims are dropped: the input is then [outer, R, inner] and the output
// [outer, inner]. (Other axis sets stay on the reference kernel.) Exporters write layer norms, attention and pooling
// this way (JAX/tf2onnx: ReduceSum for a layer norm's moments; magika's two took 0.18 ms on the reference kernel).
// Rows (inner = 1) are vectorised reductions; otherwise the output row is the accumulator and each of the R input
// rows is folded into it with a vectorised pass. Sums accumulate in float32 (the reference uses double; the test
// allows float32 rounding, as ONNX Runtime's float kernels do); Max/Min propagate NaN as the reference does. Work is
// split over the plan's threads by outer index and blocks of inner once the input is large enough. GlobalMaxPool and
// GlobalAveragePool on plain data are the same row reductions (one row per channel).
// (-fno-math-errno for this file, CMakeLists.txt: ReduceL2's sqrt loop stays scalar with errno.)
#pragma GCC optimize("no-trapping-math")  // compare-and-select loops vectorise (nothing reads FP flags)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/reduce_axes.h"

namespace osprey {
namespace {

enum class ReduceOp { kSum, kMean, kSumSquare, kL1, kL2, kMax, kMin };

constexpr int64_t kMinParallelElements = int64_t{1} << 15;
constexpr int64_t kInnerBlock = 1024;

template <ReduceOp op>
inline float Init() {
  if constexpr (op == ReduceOp::kMax) return -std::numeric_limits<float>::infinity();
  if constexpr (op == ReduceOp::kMin) return std::numeric_limits<float>::infinity();
  return 0.f;
}

// a folded with v; for Max/Min a NaN in either stays (v > a and v < a are false for NaN, v != v catches a new one).
template <ReduceOp op>
inline float Step(float a, float v) {
  if constexpr (op == ReduceOp::kMax) return (v > a || v != v) ? v : a;
  if constexpr (op == ReduceOp::kMin) return (v < a || v != v) ? v : a;
  if constexpr (op == ReduceOp::kSumSquare || op == ReduceOp::kL2) return a + v * v;
  if constexpr (op == ReduceOp::kL1) return a + std::fabs(v);
  return a + v;
}

template <ReduceOp op>
inline float Finish(float a, int64_t count) {
  if constexpr (op == ReduceOp::kMean) return a / static_cast<float>(count);
  if constexpr (op == ReduceOp::kL2) return std::sqrt(a);
  return a;
}

// One row of n contiguous values.
template <ReduceOp op>
float ReduceRow(const float* x, int64_t n) {
  if constexpr (op == ReduceOp::kMax || op == ReduceOp::kMin) {
    float a = Init<op>();
    int nan = 0;
    if constexpr (op == ReduceOp::kMax) {
#pragma omp simd reduction(max : a) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        nan |= v != v;
        a = v > a ? v : a;
      }
    } else {
#pragma omp simd reduction(min : a) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        nan |= v != v;
        a = v < a ? v : a;
      }
    }
    return nan ? std::numeric_limits<float>::quiet_NaN() : a;
  } else {
    float a = 0.f;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < n; ++i) a += Step<op>(0.f, x[i]);
    return a;
  }
}

class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(ReduceOp op, int64_t outer, int64_t reduced, int64_t inner, int threads,
               const char* name = "ReduceF32")
      : op_(op), outer_(outer), reduced_(reduced), inner_(inner), threads_(std::max(1, threads)), name_(name) {}
  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    const Tensor& in = ctx.In(0);
    Tensor& out = ctx.Out(0);
    if (in.numel() != outer_ * reduced_ * inner_ || out.numel() != outer_ * inner_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + " was built for another shape, got " +
                                            ShapeToString(in.shape()));
    const float* x = in.data<float>();
    float* y = out.data<float>();
    switch (op_) {
      case ReduceOp::kSum: return RunOp<ReduceOp::kSum>(x, y);
      case ReduceOp::kMean: return RunOp<ReduceOp::kMean>(x, y);
      case ReduceOp::kSumSquare: return RunOp<ReduceOp::kSumSquare>(x, y);
      case ReduceOp::kL1: return RunOp<ReduceOp::kL1>(x, y);
      case ReduceOp::kL2: return RunOp<ReduceOp::kL2>(x, y);
      case ReduceOp::kMax: return RunOp<ReduceOp::kMax>(x, y);
      case ReduceOp::kMin: return RunOp<ReduceOp::kMin>(x, y);
    }
  }

 private:
  template <ReduceOp op>
  void RunOp(const float* x, float* y) const {
    const int64_t blocks = inner_ == 1 ? 1 : (inner_ + kInnerBlock - 1) / kInnerBlock;
    const int64_t units = outer_ * blocks;
    const int parts = outer_ * reduced_ * inner_ >= kMinParallelElements ? threads_ : 1;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1 && units > 1)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t o = u / blocks;
      if (inner_ == 1) {
        y[o] = Finish<op>(ReduceRow<op>(x + o * reduced_, reduced_), reduced_);
        continue;
      }
      const int64_t i0 = (u % blocks) * kInnerBlock, i1 = std::min(inner_, i0 + kInnerBlock);
      float* acc = y + o * inner_;
      const float init = Init<op>();
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) acc[i] = init;
      for (int64_t r = 0; r < reduced_; ++r) {
        const float* row = x + (o * reduced_ + r) * inner_;
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) acc[i] = Step<op>(acc[i], row[i]);
      }
      if constexpr (op == ReduceOp::kMean || op == ReduceOp::kL2) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) acc[i] = Finish<op>(acc[i], reduced_);
      }
    }
  }

  ReduceOp op_;
  int64_t outer_, reduced_, inner_;
  int threads_;
  const char* name_;
};

bool PlainFloat32(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes.empty() || ctx.input_dtypes[0] != DType::kF32) return false;
  if (ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != DType::kF32) return false;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return false;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return false;
  return true;
}

}  // namespace

std::unique_ptr<Kernel> CreatePlainGlobalPool(const KernelBuildContext& ctx) {
  const bool is_max = ctx.node.op_type == "GlobalMaxPool";
  if ((!is_max && ctx.node.op_type != "GlobalAveragePool") || !PlainFloat32(ctx)) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  if (in.size() < 3) return nullptr;
  for (int64_t d : in)
    if (d <= 0) return nullptr;
  const int64_t planes = in[0] * in[1], size = NumElements(in) / planes;
  if (NumElements(ctx.output_shapes[0]) != planes) return nullptr;
  return std::make_unique<ReduceKernel>(is_max ? ReduceOp::kMax : ReduceOp::kMean, planes, size, 1, ctx.num_threads,
                                        "GlobalPoolF32Rows");
}

std::unique_ptr<Kernel> CreateReduceKernel(const KernelBuildContext& ctx) {
  static const struct {
    const char* name;
    ReduceOp op;
  } kOps[] = {{"ReduceSum", ReduceOp::kSum},     {"ReduceMean", ReduceOp::kMean}, {"ReduceSumSquare", ReduceOp::kSumSquare},
              {"ReduceL1", ReduceOp::kL1},       {"ReduceL2", ReduceOp::kL2},     {"ReduceMax", ReduceOp::kMax},
              {"ReduceMin", ReduceOp::kMin}};
  const ReduceOp* op = nullptr;
  for (const auto& k : kOps)
    if (ctx.node.op_type == k.name) op = &k.op;
  if (op == nullptr || !PlainFloat32(ctx)) return nullptr;
  const bool axes_input = ctx.present.size() > 1 && ctx.present[1];
  if (axes_input && (ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr)) return nullptr;  // run-time axes
  const Shape& in = ctx.input_shapes[0];
  const std::vector<bool> mask =
      ReduceAxesMask(ctx.node, ctx.opset, static_cast<int64_t>(in.size()), axes_input ? ctx.input_values[1] : nullptr);
  // [outer, R, inner]: the reduced dims (size-1 dims aside) must be one block.
  int64_t outer = 1, reduced = 1, inner = 1;
  int stage = 0;  // 0: before the block, 1: in it, 2: after it
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] <= 0) return nullptr;
    if (in[d] == 1) continue;
    if (mask[d]) {
      if (stage == 2) return nullptr;
      stage = 1;
      reduced *= in[d];
    } else {
      if (stage == 1) stage = 2;
      (stage == 0 ? outer : inner) *= in[d];
    }
  }
  if (NumElements(ctx.output_shapes[0]) != outer * inner) return nullptr;
  return std::make_unique<ReduceKernel>(*op, outer, reduced, inner, ctx.num_threads);
}

}  // namespace osprey
