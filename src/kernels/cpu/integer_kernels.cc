// ConvInteger and MatMulInteger (what ONNX Runtime's quantize_dynamic writes: DynamicQuantizeLinear -> ConvInteger /
// MatMulInteger -> Cast -> Mul) on oneDNN's float32 kernels. Weights must be constants: (w - w_zero_point) is made
// a float32 weight once, at build; per run the activation becomes float32 (x - x_zero_point), the float kernel runs,
// and its result is rounded to int32. Every value involved is an integer, and float32 holds integers exactly up to
// 2^24: the result equals the reference's int32 wherever no partial sum passes 2^24 in magnitude (255 x 255 x 258
// terms of one sign), and beyond that is within float32 rounding of it, which the Cast to float32 that follows in
// such models rounds to anyway. oneDNN's own int8 primitives would need signed 8-bit weights and no weight zero
// point; quantize_dynamic writes uint8 weights with one (ddddocr's captcha model). The reference kernels ran that
// model 40x slower than ONNX Runtime (docs/performance.md, "Eleventh session").
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/dnnl_common.h"

namespace osprey::cpu {
namespace {

bool IsQuantizedType(DType t) { return t == DType::kU8 || t == DType::kI8; }

float AsFloat(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kU8 ? static_cast<float>(t.data<uint8_t>()[i]) : static_cast<float>(t.data<int8_t>()[i]);
}

class IntegerAsFloatKernel final : public Kernel {
 public:
  IntegerAsFloatKernel(const char* name, Node float_node, Tensor weight) : name_(name), node_(std::move(float_node)),
                                                                           weight_(std::move(weight)) {}
  bool Build(const KernelBuildContext& ctx) {
    KernelBuildContext fc{node_, ctx.opset};
    fc.present = {true, true};
    fc.input_dtypes = {DType::kF32, DType::kF32};
    fc.input_shapes = {ctx.input_shapes[0], weight_.shape()};
    fc.input_values = {nullptr, &weight_};
    fc.output_dtypes = {DType::kF32};
    fc.output_shapes = ctx.output_shapes;
    fc.num_threads = ctx.num_threads;
    fc.tune = ctx.tune;
    fc.derive_weight = ctx.derive_weight;
    inner_ = node_.op_type == "Conv" ? CreateDnnlConv(fc) : CreateDnnlMatMul(fc);
    x_shape_ = ctx.input_shapes[0];
    y_shape_ = ctx.output_shapes[0];
    return inner_ != nullptr;
  }
  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    const Tensor& xq = ctx.In(0);
    if (xq.shape() != x_shape_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + " was built for input " +
                                            ShapeToString(x_shape_) + ", got " + ShapeToString(xq.shape()));
    const float zero = ctx.HasIn(2) && ctx.In(2).numel() > 0 ? AsFloat(ctx.In(2), 0) : 0.f;
    Scratch scratch = TakeScratch();
    Tensor& x = scratch.x;
    Tensor& y = scratch.y;
    float* xf = x.data<float>();
    const int64_t n = x.numel();
    if (xq.dtype() == DType::kU8) {
      const uint8_t* q = xq.data<uint8_t>();
#pragma omp parallel for simd schedule(static) if (n >= (1 << 18))
      for (int64_t i = 0; i < n; ++i) xf[i] = static_cast<float>(q[i]) - zero;
    } else {
      const int8_t* q = xq.data<int8_t>();
#pragma omp parallel for simd schedule(static) if (n >= (1 << 18))
      for (int64_t i = 0; i < n; ++i) xf[i] = static_cast<float>(q[i]) - zero;
    }
    KernelContext fc{node_, ctx.opset};
    fc.inputs = {&x, &weight_};
    fc.outputs = {&y};
    inner_->Run(fc);
    const float* yf = y.data<float>();
    int32_t* out = ctx.Out(0).data<int32_t>();
    const int64_t m = y.numel();
#pragma omp parallel for simd schedule(static) if (m >= (1 << 18))
    for (int64_t i = 0; i < m; ++i) out[i] = static_cast<int32_t>(std::nearbyint(yf[i]));
    GiveScratch(std::move(scratch));
  }

 private:
  const char* name_;
  Node node_;
  Tensor weight_;
  std::unique_ptr<Kernel> inner_;
  Shape x_shape_, y_shape_;

  // The float copies of the activation and the result, kept between runs (one pair per concurrent run): fresh
  // blocks of this size would be mapped and faulted in on every run (about as long as the convolution itself).
  struct Scratch {
    Tensor x, y;
  };
  std::mutex scratch_mu_;
  std::vector<Scratch> scratch_;
  Scratch TakeScratch() {
    {
      std::lock_guard<std::mutex> lock(scratch_mu_);
      if (!scratch_.empty()) {
        Scratch s = std::move(scratch_.back());
        scratch_.pop_back();
        return s;
      }
    }
    return {Tensor(DType::kF32, x_shape_), Tensor(DType::kF32, y_shape_)};
  }
  void GiveScratch(Scratch s) {
    std::lock_guard<std::mutex> lock(scratch_mu_);
    if (scratch_.size() < 4) scratch_.push_back(std::move(s));
  }
};

// The weight (input 1) less its zero point (input 3: one value, or one per `axis` index), as float32; nothing when
// the weight is computed at run time or the types are not 8-bit.
bool FloatWeight(const KernelBuildContext& ctx, int64_t axis, Tensor* out) {
  if (ctx.input_dtypes.size() < 2 || !IsQuantizedType(ctx.input_dtypes[0]) || !IsQuantizedType(ctx.input_dtypes[1]))
    return false;
  if (!ctx.input_values[1] || ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != DType::kI32) return false;
  const bool has_zp = ctx.present.size() > 3 && ctx.present[3];
  if (has_zp && !ctx.input_values[3]) return false;
  if (ctx.present.size() > 2 && ctx.present[2] && NumElements(ctx.input_shapes[2]) > 1) return false;  // per row
  const Tensor& w = *ctx.input_values[1];
  const Shape& s = w.shape();
  if (s.empty() || axis < 0 || axis >= static_cast<int64_t>(s.size())) return false;
  const Tensor* zp = has_zp ? ctx.input_values[3] : nullptr;
  const int64_t zps = zp ? zp->numel() : 0;
  if (zps > 1 && zps != s[axis]) return false;
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) inner *= s[i];
  Tensor f(DType::kF32, s);
  float* dst = f.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) {
    const int64_t channel = (i / inner) % s[axis];
    dst[i] = AsFloat(w, i) - (zps == 0 ? 0.f : AsFloat(*zp, zps == 1 ? 0 : channel));
  }
  *out = std::move(f);
  return true;
}

// DynamicQuantizeLinear(x float32) -> (y uint8, y_scale, y_zero_point): the reference's arithmetic (min/max with 0,
// scale = (max - min) / 255, zero point and values rounded half to even and saturated, NaN -> zero point) in
// vectorised loops; bit-identical (tests/unit/kernels/integer_test.cc).
__attribute__((target_clones("avx512f", "avx2", "default"))) void DynamicQuantize(const float* x, int64_t n,
                                                                                  uint8_t* y, float* scale_out,
                                                                                  uint8_t* zero_out) {
  float lo = 0.f, hi = 0.f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    lo = v < lo ? v : lo;  // a NaN never replaces the running value, as in the reference's std::min
    hi = v > hi ? v : hi;
  }
  const float scale = (hi - lo) / 255.f;
  uint8_t zp = 0;
  if (scale > 0.f) {
    const float z = -lo / scale;
    zp = z != z ? 0 : static_cast<uint8_t>(std::min(std::max(std::nearbyint(z), 0.f), 255.f));
  }
  const float zpf = static_cast<float>(zp);
  if (scale > 0.f) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] / scale;
      const float r = v != v ? zpf : std::nearbyint(v) + zpf;
      y[i] = static_cast<uint8_t>(static_cast<int32_t>(std::min(std::max(r, 0.f), 255.f)));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = zp;
  }
  *scale_out = scale;
  *zero_out = zp;
}

class DynamicQuantizeLinearF32 final : public Kernel {
 public:
  const char* Name() const override { return "DynamicQuantizeLinearF32"; }
  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    DynamicQuantize(x.data<float>(), x.numel(), ctx.Out(0).data<uint8_t>(), ctx.Out(1).data<float>(),
                    ctx.Out(2).data<uint8_t>());
  }
};

}  // namespace

std::unique_ptr<Kernel> CreateIntegerKernel(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (node.domain.empty() && node.op_type == "DynamicQuantizeLinear" && ctx.input_dtypes.size() == 1 &&
      ctx.input_dtypes[0] == DType::kF32)
    return std::make_unique<DynamicQuantizeLinearF32>();
  if (!node.domain.empty() || (node.op_type != "ConvInteger" && node.op_type != "MatMulInteger")) return nullptr;
  const bool conv = node.op_type == "ConvInteger";
  if (!conv && ctx.input_shapes.size() > 1 && ctx.input_shapes[1].size() != 2) return nullptr;
  Tensor weight;
  // ConvInteger's w_zero_point is per output channel (axis 0 of W); MatMulInteger's b_zero_point per column of B.
  if (!FloatWeight(ctx, conv ? 0 : 1, &weight)) return nullptr;
  Node float_node = node;
  float_node.op_type = conv ? "Conv" : "MatMul";
  float_node.inputs.resize(2);
  auto kernel = std::make_unique<IntegerAsFloatKernel>(conv ? "ConvIntegerAsF32Dnnl" : "MatMulIntegerAsF32Dnnl",
                                                       std::move(float_node), std::move(weight));
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
