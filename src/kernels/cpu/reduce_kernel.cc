// ReduceSum / ReduceMean / ReduceSumSquare / ReduceL1 / ReduceL2 / ReduceMax / ReduceMin on float32 plain tensors whose
// reduced axes form one block once size-1 dims are dropped: the input is then [outer, R, inner] and the output
// [outer, inner]. (Other axis sets stay on the reference kernel.) Exporters write layer norms, attention and pooling
// this way (JAX/tf2onnx: ReduceSum for a layer norm's moments; magika's two took 0.18 ms on the reference kernel).
// Rows (inner = 1) are vectorised reductions; otherwise the output row is the accumulator and each of the R input
// rows is folded into it with a vectorised pass. Sums accumulate in float32 (the reference uses double; the test
// allows float32 rounding, as ONNX Runtime's float kernels do); Max/Min propagate NaN as the reference does. Work is
// split over the plan's threads by outer index and blocks of inner once the input is large enough. GlobalMaxPool and
// GlobalAveragePool on plain data are the same row reductions (one row per channel); GlobalAveragePool on
// channels-last data sums [N, H * W, C] over its middle in registers (GlobalAveragePoolNhwc, AVX-512).
// (-fno-math-errno for this file, CMakeLists.txt: ReduceL2's sqrt loop stays scalar with errno.)
#pragma GCC optimize("no-trapping-math")  // compare-and-select loops vectorise (nothing reads FP flags)
#include <immintrin.h>
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

// GlobalAveragePool of a channels-last [N, H, W, C] float32 tensor: the squeeze of every squeeze-and-excitation block
// (EfficientNet-B0 has 16, the largest [1, 32, 112, 112]). Work items are (image, chunk of up to 128 channels, share of
// the H * W rows): one image with few channels still gives every thread a share of its rows, summed in registers
// (a vector of 16 channels per accumulator) and combined after. oneDNN's pooling took 0.30 ms for EfficientNet-B0's.
class GlobalAveragePoolNhwc final : public Kernel {
 public:
  GlobalAveragePoolNhwc(int64_t images, int64_t rows, int64_t channels, int threads)
      : images_(images), rows_(rows), channels_(channels), threads_(std::max(1, threads)) {}
  const char* Name() const override { return "GlobalPoolF32Nhwc"; }

  void Run(KernelContext& ctx) override {
    const Tensor& in = ctx.In(0);
    Tensor& out = ctx.Out(0);
    if (in.numel() != images_ * rows_ * channels_ || out.numel() != images_ * channels_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + Name() + " was built for another shape, got " +
                                            ShapeToString(in.shape()));
    Execute(in.data<float>(), out.data<float>());
  }

 private:
  static constexpr int64_t kChunk = 128;    // channels per work item: 8 accumulators
  static constexpr int64_t kMinShare = 64;  // rows per share at least

  __attribute__((target("avx512f"))) void Execute(const float* x, float* y) const {
    const int64_t chunks = (channels_ + kChunk - 1) / kChunk, units = images_ * chunks;
    const bool parallel = images_ * rows_ * channels_ >= kMinParallelElements;
    const int64_t shares = parallel && units < threads_
                               ? std::max<int64_t>(1, std::min((threads_ + units - 1) / units, rows_ / kMinShare))
                               : 1;
    std::vector<float> partial(static_cast<size_t>(shares > 1 ? shares * images_ * channels_ : 0));
    const float scale = shares > 1 ? 1.f : 1.f / static_cast<float>(rows_);
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel)
    for (int64_t item = 0; item < units * shares; ++item) {
      const int64_t unit = item / shares, share = item % shares;
      const int64_t n = unit / chunks, c0 = unit % chunks * kChunk;
      const int64_t r0 = rows_ * share / shares, r1 = rows_ * (share + 1) / shares;
      float* out = (shares > 1 ? partial.data() + (share * images_ + n) * channels_ : y + n * channels_) + c0;
      const float* in = x + (n * rows_ + r0) * channels_ + c0;
      const int64_t left = std::min(kChunk, channels_ - c0);
      const __mmask16 last = left % 16 == 0 ? 0xffff : static_cast<__mmask16>((1u << (left % 16)) - 1);
      switch ((left + 15) / 16) {
        case 1:
          Sum<1>(in, r1 - r0, out, last, scale);
          break;
        case 2:
          Sum<2>(in, r1 - r0, out, last, scale);
          break;
        case 3:
          Sum<3>(in, r1 - r0, out, last, scale);
          break;
        case 4:
          Sum<4>(in, r1 - r0, out, last, scale);
          break;
        case 5:
          Sum<5>(in, r1 - r0, out, last, scale);
          break;
        case 6:
          Sum<6>(in, r1 - r0, out, last, scale);
          break;
        case 7:
          Sum<7>(in, r1 - r0, out, last, scale);
          break;
        default:
          Sum<8>(in, r1 - r0, out, last, scale);
          break;
      }
    }
    if (shares == 1) return;
    const int64_t size = images_ * channels_;
    const float mean = 1.f / static_cast<float>(rows_);
    for (int64_t j = 0; j < size; ++j) {
      float a = 0.f;
      for (int64_t s = 0; s < shares; ++s) a += partial[static_cast<size_t>(s * size + j)];
      y[j] = a * mean;
    }
  }

  // out[0, 16 V) = scale * the sum of `rows` rows of `in` (the last vector's lanes `last`).
  template <int V>
  __attribute__((target("avx512f"))) void Sum(const float* in, int64_t rows, float* out, __mmask16 last,
                                              float scale) const {
    __m512 acc[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r, in += channels_) {
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v)
        acc[v] = _mm512_add_ps(acc[v], _mm512_maskz_loadu_ps(v == V - 1 ? last : 0xffff, in + v * 16));
    }
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(out + v * 16, v == V - 1 ? last : 0xffff, _mm512_mul_ps(acc[v], _mm512_set1_ps(scale)));
  }

  int64_t images_, rows_, channels_;
  int threads_;
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

std::unique_ptr<Kernel> CreateGlobalPool(const KernelBuildContext& ctx) {
  const bool is_max = ctx.node.op_type == "GlobalMaxPool";
  if ((!is_max && ctx.node.op_type != "GlobalAveragePool") || ctx.input_dtypes.empty() ||
      ctx.input_dtypes[0] != DType::kF32 || ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != DType::kF32)
    return nullptr;
  const Shape& in = ctx.input_shapes[0];
  if (in.size() < 3) return nullptr;
  for (int64_t d : in)
    if (d <= 0) return nullptr;
  const int64_t planes = in[0] * in[1], size = NumElements(in) / planes;
  if (NumElements(ctx.output_shapes[0]) != planes) return nullptr;
  // The output's spatial dims are 1: its bytes are the same in either layout.
  const ReduceOp op = is_max ? ReduceOp::kMax : ReduceOp::kMean;
  if (ctx.InLayout(0) == Layout::kNhwc) {
    static const bool avx512 = __builtin_cpu_supports("avx512f");
    if (is_max || !avx512) return nullptr;  // oneDNN's pooling (it keeps GlobalMaxPool's NaNs)
    return std::make_unique<GlobalAveragePoolNhwc>(in[0], size, in[1], ctx.num_threads);
  }
  return std::make_unique<ReduceKernel>(op, planes, size, 1, ctx.num_threads, "GlobalPoolF32Rows");
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
