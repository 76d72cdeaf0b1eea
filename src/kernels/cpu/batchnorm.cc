// BatchNormalization (inference) for float32, hand-written: y = act(x * a[c] + b[c]) with a = scale / sqrt(var + eps)
// and b = B - mean * a folded once at creation, so Run is one streaming pass. Plain tensors of any rank >= 2 are
// processed one (n, c) row at a time; channels-last (NHWC) rank-4 tensors one pixel row of C values at a time. The
// fused activation (`_activation`, docs/architecture.md) is applied in the same pass.
//
// The build targets x86-64-v2 (SSE4.2); the row loops are compiled a second and third time for AVX2 and AVX-512 and
// the best one is picked when the program starts (GCC target_clones), which roughly halves the time of an L2-resident
// tensor on AVX-512 machines. The activations' compare-and-select (Relu, Clip, the clamp in Exp) if-converts only
// without GCC's trapping-math (nothing here reads FP exception flags), set before any include as in
// elementwise_kernels.cc; without it those rows ran scalar.
#pragma GCC optimize("no-trapping-math")
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/vector_math.h"
#include "ops/activation.h"
#include "ops/batch_norm.h"

namespace osprey::cpu {
namespace {

constexpr const char* kBatchNormName = "BatchNormF32";
// Below this many elements a parallel region costs more than it saves (same threshold as the reference kernels).
constexpr int64_t kMinParallelElements = int64_t{1} << 15;
// Elements handed to one call of the row loop: large enough to amortise the call, small enough to split well.
constexpr int64_t kBlockElements = int64_t{1} << 13;

// The activations (ops/activation.h), each an inlined functor so the row loops vectorise around them. They follow
// Activation::Apply formula for formula, including how NaN passes through std::max/min.
struct Identity {
  [[gnu::always_inline]] float operator()(float v) const { return v; }
};
struct Relu {
  [[gnu::always_inline]] float operator()(float v) const { return std::max(v, 0.f); }
};
struct LeakyRelu {
  float alpha;
  [[gnu::always_inline]] float operator()(float v) const { return v >= 0 ? v : v * alpha; }
};
struct Clip {
  float lo, hi;
  [[gnu::always_inline]] float operator()(float v) const { return std::min(std::max(v, lo), hi); }
};
struct Sigmoid {
  [[gnu::always_inline]] float operator()(float v) const { return 1.f / (1.f + vmath::Exp(-v)); }
};
struct Tanh {  // 1 - 2 / (exp(2v) + 1): exact limits at both ends, absolute error ~1e-7 near 0
  [[gnu::always_inline]] float operator()(float v) const { return 1.f - 2.f / (vmath::Exp(2.f * v) + 1.f); }
};
struct HardSigmoid {
  float alpha, beta;
  [[gnu::always_inline]] float operator()(float v) const { return std::min(std::max(alpha * v + beta, 0.f), 1.f); }
};
struct HardSwish {
  [[gnu::always_inline]] float operator()(float v) const { return v * std::min(std::max(v / 6.f + 0.5f, 0.f), 1.f); }
};
struct Silu {
  [[gnu::always_inline]] float operator()(float v) const { return v / (1.f + vmath::Exp(-v)); }
};
struct Gelu {
  [[gnu::always_inline]] float operator()(float v) const {
    return 0.5f * v * (1.f + vmath::Erf(v * 0.70710678118654752f));
  }
};
struct GeluTanh {
  [[gnu::always_inline]] float operator()(float v) const {
    return 0.5f * v * (1.f + vmath::Tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
  }
};

// Rows of the tensor as the loops see them: plain, row r is (n, c = r % channels) with `inner` values sharing one
// a/b; NHWC, row r is one pixel with `channels` values, one a/b each. x may equal y (in-place runs).
struct RowParams {
  const float* a;
  const float* b;
  int64_t channels;
  int64_t inner;
  bool nhwc;
  Activation act;
};

template <class F>
[[gnu::always_inline]] inline void AffineRows(const RowParams& p, const float* x, float* y, int64_t begin, int64_t end,
                                              F f) {
  if (p.nhwc) {
    const int64_t c_count = p.channels;
    const float* a = p.a;
    const float* b = p.b;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * c_count;
      float* yr = y + r * c_count;
#pragma omp simd
      for (int64_t c = 0; c < c_count; ++c) yr[c] = f(xr[c] * a[c] + b[c]);
    }
  } else {
    const int64_t n = p.inner;
    for (int64_t r = begin; r < end; ++r) {
      const float a = p.a[r % p.channels], b = p.b[r % p.channels];
      const float* xr = x + r * n;
      float* yr = y + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yr[i] = f(xr[i] * a + b);
    }
  }
}

// Rows [begin, end) of y = act(x * a + b).
__attribute__((target_clones("avx512f", "avx2", "default"))) void BatchNormRows(const RowParams& p, const float* x,
                                                                                float* y, int64_t begin, int64_t end) {
  switch (p.act.kind) {
    case ActivationKind::kNone:
      return AffineRows(p, x, y, begin, end, Identity{});
    case ActivationKind::kRelu:
      return AffineRows(p, x, y, begin, end, Relu{});
    case ActivationKind::kLeakyRelu:
      return AffineRows(p, x, y, begin, end, LeakyRelu{p.act.alpha});
    case ActivationKind::kClip:
      return AffineRows(p, x, y, begin, end, Clip{p.act.alpha, p.act.beta});
    case ActivationKind::kSigmoid:
      return AffineRows(p, x, y, begin, end, Sigmoid{});
    case ActivationKind::kTanh:
      return AffineRows(p, x, y, begin, end, Tanh{});
    case ActivationKind::kHardSigmoid:
      return AffineRows(p, x, y, begin, end, HardSigmoid{p.act.alpha, p.act.beta});
    case ActivationKind::kHardSwish:
      return AffineRows(p, x, y, begin, end, HardSwish{});
    case ActivationKind::kSilu:
      return AffineRows(p, x, y, begin, end, Silu{});
    case ActivationKind::kGelu:
      return AffineRows(p, x, y, begin, end, Gelu{});
    case ActivationKind::kGeluTanh:
      return AffineRows(p, x, y, begin, end, GeluTanh{});
  }
}

// What the factory and the channels-last support test both need to know; false when the kernel does not take the
// node (the reference kernel then runs it).
struct BatchNormSetup {
  Shape x;
  Activation act;
  float epsilon = 1e-5f;
  const Tensor* params[4] = {};  // scale, B, mean, var
};

bool PrepareBatchNorm(const KernelBuildContext& ctx, BatchNormSetup& s) {
  const Node& node = ctx.node;
  if (ctx.input_shapes.size() != 5 || ctx.present.size() != 5 || ctx.output_shapes.empty()) return false;
  for (int i = 0; i < 5; ++i)
    if (!ctx.present[i] || ctx.input_dtypes[i] != DType::kF32) return false;
  if (ctx.output_dtypes[0] != DType::kF32) return false;
  s.x = ctx.input_shapes[0];
  if (s.x.size() < 2 || ctx.output_shapes[0] != s.x) return false;
  for (int64_t d : s.x)
    if (d < 0) return false;
  if (ctx.opset >= 14 && node.GetInt("training_mode", 0) != 0) return false;
  if (ctx.opset < 9 && node.GetInt("spatial", 1) == 0) return false;
  for (int i = 1; i < 5; ++i) {
    const Tensor* t = ctx.input_values.size() > static_cast<size_t>(i) ? ctx.input_values[i] : nullptr;
    if (t == nullptr || t->dtype() != DType::kF32 || t->shape() != Shape{s.x[1]}) return false;
    if (s.x[1] > 0 && t->raw() == nullptr) return false;
    s.params[i - 1] = t;
  }
  if (!Activation::FromFusedNode(node, &s.act)) return false;
  s.epsilon = node.GetFloat("epsilon", 1e-5f);
  return true;
}

// Input 0 and output 0 may each be plain or NHWC (rank 4). With different layouts a oneDNN reorder first writes x
// into y in y's layout, and the normalisation then runs in place on y.
class BatchNormKernel final : public Kernel {
 public:
  BatchNormKernel(const BatchNormSetup& s, Layout in_layout, Layout out_layout, int num_threads)
      : x_shape_(s.x), in_layout_(in_layout), out_layout_(out_layout) {
    const int64_t channels = s.x[1];
    a_.resize(static_cast<size_t>(channels));
    b_.resize(static_cast<size_t>(channels));
    const float* scale = s.params[0]->data<float>();
    const float* shift = s.params[1]->data<float>();
    const float* mean = s.params[2]->data<float>();
    const float* var = s.params[3]->data<float>();
    // The reference kernel's factors (ops/batch_norm.h), so the folded constants agree with it bit for bit.
    for (int64_t c = 0; c < channels; ++c)
      BatchNormFactors(scale[c], shift[c], mean[c], var[c], s.epsilon, &a_[c], &b_[c]);
    numel_ = NumElements(s.x);
    params_ = RowParams{a_.data(), b_.data(), channels, 1, out_layout == Layout::kNhwc, s.act};
    if (params_.nhwc) {
      rows_ = channels > 0 ? numel_ / channels : 0;
    } else {
      params_.inner = s.x[0] * channels > 0 ? numel_ / (s.x[0] * channels) : 0;
      rows_ = s.x[0] * channels;
    }
    num_threads_ = num_threads > 0 ? num_threads : omp_get_max_threads();
    if (in_layout != out_layout) {
      OmpThreadsGuard threads(num_threads);
      const dnnl::memory::desc from = ActivationDesc(s.x, in_layout), to = ActivationDesc(s.x, out_layout);
      dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, BaseAttr());
      reorder_ = dnnl::reorder(pd);
      reorder_from_md_ = from;
      reorder_to_md_ = to;
      reorder_scratch_md_ = pd.scratchpad_desc();
    }
  }

  const char* Name() const override { return kBatchNormName; }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckActivation(node, kBatchNormName, "input", ctx.In(0), x_shape_, in_layout_);
    CheckActivation(node, kBatchNormName, "output", ctx.Out(0), x_shape_, out_layout_);
    if (numel_ == 0) return;
    const float* x = ctx.In(0).data<float>();
    float* y = ctx.Out(0).data<float>();
    if (in_layout_ != out_layout_) {
      RunDnnl(node, kBatchNormName, [&] {
        dnnl::stream& stream = ThreadStream();
        char* scratch = ThreadScratch::Reserve(reorder_scratch_md_.get_size());
        reorder_.execute(stream, {{DNNL_ARG_FROM, WrapMemory(reorder_from_md_, x)},
                                  {DNNL_ARG_TO, WrapMemory(reorder_to_md_, y)},
                                  {DNNL_ARG_SCRATCHPAD, dnnl::memory(reorder_scratch_md_, CpuEngine(), scratch)}});
        stream.wait();
      });
      x = y;
    }
    const int64_t row_length = params_.nhwc ? params_.channels : params_.inner;
    const int64_t rows_per_block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(row_length, 1));
    const int64_t blocks = (rows_ + rows_per_block - 1) / rows_per_block;
    const int threads = numel_ >= kMinParallelElements ? num_threads_ : 1;
    const RowParams& p = params_;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t block = 0; block < blocks; ++block)
      BatchNormRows(p, x, y, block * rows_per_block, std::min(rows_, (block + 1) * rows_per_block));
  }

 private:
  Shape x_shape_;
  Layout in_layout_, out_layout_;
  std::vector<float> a_, b_;
  RowParams params_{};
  int64_t numel_ = 0, rows_ = 0;
  int num_threads_ = 1;
  dnnl::reorder reorder_;
  dnnl::memory::desc reorder_from_md_, reorder_to_md_, reorder_scratch_md_;
};

// Channels-last tensors exist only for rank-4 and rank-5 activations, on input 0 and output 0 here.
bool LayoutsPossible(const KernelBuildContext& ctx, const Shape& x) {
  for (size_t i = 1; i < ctx.input_layouts.size(); ++i)
    if (ctx.input_layouts[i] != Layout::kPlain) return false;
  for (size_t i = 1; i < ctx.output_layouts.size(); ++i)
    if (ctx.output_layouts[i] != Layout::kPlain) return false;
  return ChannelsLastRank(x.size());
}

}  // namespace

std::unique_ptr<Kernel> CreateBatchNorm(const KernelBuildContext& ctx) {
  BatchNormSetup s;
  const bool ok = PrepareBatchNorm(ctx, s);
  if (!AnyNhwc(ctx))
    return ok ? std::make_unique<BatchNormKernel>(s, Layout::kPlain, Layout::kPlain, ctx.num_threads) : nullptr;
  // Asked for channels-last tensors: declining would leave them to a reference kernel that reads them as plain.
  if (!ok || !LayoutsPossible(ctx, s.x))
    ThrowUnsupportedLayouts(ctx.node, kBatchNormName,
                            "only a rank-4 or rank-5 float32 BatchNormalization with constant "
                            "parameters and a known fused activation takes NHWC tensors");
  try {
    return std::make_unique<BatchNormKernel>(s, ctx.InLayout(0), ctx.OutLayout(0), ctx.num_threads);
  } catch (const dnnl::error& e) {
    ThrowUnsupportedLayouts(ctx.node, kBatchNormName, std::string("oneDNN failed: ") + e.what());
  }
}

bool BatchNormSupportsNhwc(const KernelBuildContext& ctx) {
  BatchNormSetup s;
  return PrepareBatchNorm(ctx, s) && ChannelsLastRank(s.x.size());
}

}  // namespace osprey::cpu
