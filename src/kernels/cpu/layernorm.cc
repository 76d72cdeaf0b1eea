// LayerNormalization over the last axis, float32 (the form transformers use, and the form the runtime's pattern
// fusion produces from decomposed exports). Rows are independent and run in parallel; each row is read from memory
// once, and the variance and normalising passes then hit L1 (a 768-float row is 3 KiB). Statistics are float32 with
// vectorised partial sums, computed in two passes (mean, then centred variance) for accuracy.
#include <cmath>
#include <vector>

#include "kernels/kernel.h"
#include "ops/op_registry.h"

namespace osprey {

std::unique_ptr<Kernel> CreateCpuLayerNormalization(const KernelBuildContext& ctx);

namespace {

// Below this many elements the parallel region costs more than it saves.
constexpr int64_t kMinParallelElements = int64_t{1} << 14;

class LayerNormF32Kernel final : public Kernel {
 public:
  LayerNormF32Kernel(Shape shape, float epsilon) : shape_(std::move(shape)), epsilon_(epsilon) {
    width_ = shape_.back();
    rows_ = width_ > 0 ? NumElements(shape_) / width_ : 0;
  }
  const char* Name() const override { return "LayerNormF32"; }

  // A parameter (scale or bias) of `width_` values or one value broadcast; constant ones are copied now.
  struct Param {
    bool present = false;
    bool broadcast = false;  // a single value for every column
    std::vector<float> constant;
  };
  Param scale, bias;

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    if (x.dtype() != DType::kF32 || x.shape() != shape_ || y.dtype() != DType::kF32 || y.shape() != shape_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": LayerNormF32 was built for float32 " +
                                            ShapeToString(shape_) + ", got input " + ShapeToString(x.shape()) +
                                            " and output " + ShapeToString(y.shape()));
    if (rows_ == 0 || width_ == 0) return;
    const float* xd = x.data<float>();
    float* yd = y.data<float>();
    // Constant parameters were expanded at creation; only a single value given at run time is expanded here.
    std::vector<float> scale_row, bias_row;
    const float* gamma = Resolve(ctx, 1, scale, &scale_row);
    const float* beta = Resolve(ctx, 2, bias, &bias_row);
    const int64_t width = width_;
    const float epsilon = epsilon_;
#pragma omp parallel for schedule(static) if (rows_ * width_ >= kMinParallelElements)
    for (int64_t r = 0; r < rows_; ++r) {
      const float* xr = xd + r * width;
      float* yr = yd + r * width;
      // Sums of x - x[0] stay of the order of the spread, not of the mean, so float partial sums keep their
      // precision when |mean| >> std (activations before a LayerNorm can sit far from zero).
      const float pivot = xr[0];
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < width; ++i) sum += xr[i] - pivot;
      const float mean = pivot + sum / static_cast<float>(width);
      // Second pass over the centred values (not E[x^2] - mean^2, which cancels badly when |mean| >> std).
      float sum_sq = 0.f;
#pragma omp simd reduction(+ : sum_sq)
      for (int64_t i = 0; i < width; ++i) {
        const float d = xr[i] - mean;
        sum_sq += d * d;
      }
      const float inv_std = 1.f / std::sqrt(sum_sq / static_cast<float>(width) + epsilon);
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) yr[i] = (xr[i] - mean) * inv_std * gamma[i] + beta[i];
    }
  }

 private:
  // Pointer to `width_` values of parameter `index`: the constant copy or the run-time tensor.
  const float* Resolve(const KernelContext& ctx, int index, const Param& p, std::vector<float>* row) const {
    if (!p.constant.empty()) return p.constant.data();
    const Tensor& t = ctx.In(index);
    const int64_t expected = p.broadcast ? 1 : width_;
    if (t.dtype() != DType::kF32 || t.numel() != expected)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": LayerNormF32 was built for a parameter of " +
                                            std::to_string(expected) + " float32 values at input " +
                                            std::to_string(index) + ", got " + ShapeToString(t.shape()));
    if (!p.broadcast) return t.data<float>();
    row->assign(static_cast<size_t>(width_), t.data<float>()[0]);
    return row->data();
  }

  Shape shape_;
  float epsilon_;
  int64_t width_ = 0, rows_ = 0;
};

// Describes input `index` as a per-column parameter: [..., 1, width] or a single value.
bool DescribeParam(const KernelBuildContext& ctx, int index, int64_t width, LayerNormF32Kernel::Param* p) {
  if (index >= static_cast<int>(ctx.present.size()) || !ctx.present[index]) return true;  // omitted: default
  if (ctx.input_dtypes[index] != DType::kF32) return false;
  const Shape& s = ctx.input_shapes[index];
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] != 1) return false;
  const int64_t n = NumElements(s);
  if (n != width && n != 1) return false;
  p->present = true;
  p->broadcast = n == 1 && width != 1;
  const Tensor* value = index < static_cast<int>(ctx.input_values.size()) ? ctx.input_values[index] : nullptr;
  if (value != nullptr && value->raw() != nullptr) {
    const float* v = value->data<float>();
    if (p->broadcast)
      p->constant.assign(static_cast<size_t>(width), v[0]);
    else
      p->constant.assign(v, v + width);
  }
  return true;
}

}  // namespace

/// The LayerNormF32 kernel for a float32 LayerNormalization over the last axis with one output, or nullptr.
std::unique_ptr<Kernel> CreateCpuLayerNormalization(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (ctx.present.empty() || !ctx.present[0] || ctx.input_dtypes[0] != DType::kF32) return nullptr;
  // Mean and inverse-std outputs are left to the reference kernel.
  if (ctx.output_shapes.size() != 1 || ctx.output_dtypes[0] != DType::kF32) return nullptr;
  for (size_t i = 0; i < ctx.present.size(); ++i)
    if (ctx.InLayout(static_cast<int>(i)) != Layout::kPlain) return nullptr;
  if (ctx.OutLayout(0) != Layout::kPlain) return nullptr;
  const Shape& x = ctx.input_shapes[0];
  if (x.empty() || ctx.output_shapes[0] != x) return nullptr;
  const int64_t rank = static_cast<int64_t>(x.size());
  if (NormalizeAxis(node.GetInt("axis", -1), rank, node) != rank - 1) return nullptr;
  const float epsilon = node.GetFloat("epsilon", 1e-5f);
  if (ctx.present.size() < 2 || !ctx.present[1]) return nullptr;  // Scale is required
  auto kernel = std::make_unique<LayerNormF32Kernel>(x, epsilon);
  if (!DescribeParam(ctx, 1, x.back(), &kernel->scale) || !DescribeParam(ctx, 2, x.back(), &kernel->bias))
    return nullptr;
  if (!kernel->bias.present) {  // no B: zeros, prepared once
    kernel->bias.present = true;
    kernel->bias.constant.assign(static_cast<size_t>(x.back()), 0.f);
  }
  return kernel;
}

}  // namespace osprey
