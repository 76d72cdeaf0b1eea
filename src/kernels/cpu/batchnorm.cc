// BatchNormalization (inference) for float32, hand-written: y = act(x * a[c] + b[c]) with a = scale / sqrt(var + eps)
// and b = B - mean * a folded once at creation, so Run is one streaming pass. Plain tensors of any rank >= 2 are
// processed one (n, c) row at a time; channels-last (NHWC) rank-4 tensors one pixel row of C values at a time. The
// fused activation (`_activation`, docs/architecture.md) is applied in the same pass. The same row loops run a Concat
// along channels that the runtime gave a BatchNormalization to (`_scale`/`_shift`: DenseNet's pre-activation after
// every concatenation): each input's rows are normalised straight into their channels of the output, one pass
// instead of a copy and then a normalisation.
//
// The build targets x86-64-v2 (SSE4.2); the row loops are compiled a second and third time for AVX2 and AVX-512 and
// the best one is picked when the program starts (GCC target_clones), which roughly halves the time of an L2-resident
// tensor on AVX-512 machines.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/vector_math.h"
#include "ops/activation.h"
#include "ops/op_registry.h"

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
struct Gelu {  // erf has no vectorisable form here; GELU after a BatchNormalization is rare
  [[gnu::always_inline]] float operator()(float v) const {
    return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
  }
};

// Rows of the tensor as the loops see them: plain, row r is (n, c = r % channels) with `inner` values sharing one
// a/b; NHWC, row r is one pixel with `channels` values, one a/b each, and output row r starts at y + r * y_stride
// (y_stride = channels, or the row length of a Concat's output that these channels are a part of). x may equal y
// (in-place runs).
struct RowParams {
  const float* a;
  const float* b;
  int64_t channels;
  int64_t inner;
  bool nhwc;
  Activation act;
  int64_t y_stride = 0;
};

template <class F>
[[gnu::always_inline]] inline void AffineRows(const RowParams& p, const float* x, float* y, int64_t begin, int64_t end,
                                              F f) {
  if (p.nhwc) {
    const int64_t c_count = p.channels, y_stride = p.y_stride;
    const float* a = p.a;
    const float* b = p.b;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * c_count;
      float* yr = y + r * y_stride;
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
    // Same float expressions as the reference kernel, so the folded constants agree with it bit for bit.
    for (int64_t c = 0; c < channels; ++c) {
      a_[c] = scale[c] / std::sqrt(var[c] + s.epsilon);
      b_[c] = shift[c] - mean[c] * a_[c];
    }
    numel_ = NumElements(s.x);
    params_ = RowParams{a_.data(), b_.data(), channels, 1, out_layout == Layout::kNhwc, s.act, channels};
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

// Concat(x_0 .. x_{k-1}, axis 1) -> y = act(concat * a[c] + b[c]), a and b over the output's channels (the Concat's
// `_scale` / `_shift`). Plain: one task per (batch item, input), rows of `inner` values; NHWC: blocks of pixels, each
// input's channel run of a pixel written at its offset in the output row.
class ConcatBatchNormKernel final : public Kernel {
 public:
  ConcatBatchNormKernel(std::vector<int64_t> channels, int64_t batch, int64_t inner, bool nhwc, std::vector<float> a,
                        std::vector<float> b, Activation act, int num_threads)
      : channels_(std::move(channels)), batch_(batch), inner_(inner), nhwc_(nhwc), a_(std::move(a)), b_(std::move(b)) {
    int64_t first = 0;
    for (int64_t c : channels_) {
      firsts_.push_back(first);
      parts_.push_back(RowParams{a_.data() + first, b_.data() + first, c, inner_, nhwc_, act, nhwc_ ? 0 : c});
      first += c;
    }
    total_ = first;
    for (size_t i = 0; i < parts_.size(); ++i)
      if (nhwc_) parts_[i].y_stride = total_;
    numel_ = batch_ * total_ * inner_;
    num_threads_ = num_threads > 0 ? num_threads : omp_get_max_threads();
  }

  const char* Name() const override { return nhwc_ ? "ConcatBatchNormF32Nhwc" : "ConcatBatchNormF32"; }

  void Run(KernelContext& ctx) override {
    const size_t k = channels_.size();
    if (ctx.inputs.size() != k) Internal(ctx.node, "input count changed");
    std::vector<const float*> src(k);
    for (size_t i = 0; i < k; ++i) {
      CheckBytes(ctx.node, "input", ctx.In(static_cast<int>(i)), batch_ * channels_[i] * inner_);
      src[i] = ctx.In(static_cast<int>(i)).data<float>();
    }
    CheckBytes(ctx.node, "output", ctx.Out(0), numel_);
    if (numel_ == 0) return;
    float* dst = ctx.Out(0).data<float>();
    const int threads = numel_ >= kMinParallelElements ? num_threads_ : 1;
    if (nhwc_) {
      const int64_t pixels = batch_ * inner_;
      const int64_t per_block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(total_, 1));
      const int64_t blocks = (pixels + per_block - 1) / per_block;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t begin = block * per_block, end = std::min(pixels, begin + per_block);
        for (size_t i = 0; i < k; ++i) BatchNormRows(parts_[i], src[i], dst + firsts_[i], begin, end);
      }
      return;
    }
    const int64_t tasks = batch_ * static_cast<int64_t>(k);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t n = t / static_cast<int64_t>(k);
      const size_t i = static_cast<size_t>(t % static_cast<int64_t>(k));
      BatchNormRows(parts_[i], src[i] + n * channels_[i] * inner_, dst + (n * total_ + firsts_[i]) * inner_, 0,
                    channels_[i]);
    }
  }

 private:
  void Internal(const Node& node, const std::string& what) const {
    throw Error(ErrorCode::kInternal, node.Describe() + ": " + Name() + ": " + what);
  }
  void CheckBytes(const Node& node, const char* what, const Tensor& t, int64_t elements) const {
    const size_t expected = static_cast<size_t>(elements) * sizeof(float);
    if (t.nbytes() != expected || (expected && t.raw() == nullptr))
      Internal(node, std::string(what) + " holds " + std::to_string(t.nbytes()) + " bytes, expected " +
                         std::to_string(expected));
  }

  std::vector<int64_t> channels_, firsts_;
  int64_t batch_, inner_, total_ = 0, numel_ = 0;
  bool nhwc_;
  std::vector<float> a_, b_;
  std::vector<RowParams> parts_;
  int num_threads_ = 1;
};

// Channels-last tensors exist only for rank-4 activations, on input 0 and output 0 here.
bool LayoutsPossible(const KernelBuildContext& ctx, const Shape& x) {
  for (size_t i = 1; i < ctx.input_layouts.size(); ++i)
    if (ctx.input_layouts[i] != Layout::kPlain) return false;
  for (size_t i = 1; i < ctx.output_layouts.size(); ++i)
    if (ctx.output_layouts[i] != Layout::kPlain) return false;
  return x.size() == 4;
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
                            "only a rank-4 float32 BatchNormalization with constant "
                            "parameters and a known fused activation takes NHWC tensors");
  try {
    return std::make_unique<BatchNormKernel>(s, ctx.InLayout(0), ctx.OutLayout(0), ctx.num_threads);
  } catch (const dnnl::error& e) {
    ThrowUnsupportedLayouts(ctx.node, kBatchNormName, std::string("oneDNN failed: ") + e.what());
  }
}

}  // namespace osprey::cpu

namespace osprey {

std::unique_ptr<Kernel> CreateConcatBatchNorm(const KernelBuildContext& ctx) {
  using namespace cpu;
  const Node& node = ctx.node;
  const std::vector<float> a = node.GetFloats("_scale"), b = node.GetFloats("_shift");
  Activation act;
  bool ok = !ctx.input_shapes.empty() && ctx.output_shapes.size() == 1 && ctx.output_dtypes[0] == DType::kF32 &&
            Activation::FromFusedNode(node, &act);
  const Shape& y = ok ? ctx.output_shapes[0] : Shape{};
  ok = ok && y.size() >= 2 && NormalizeAxis(node.GetInt("axis", 0), static_cast<int64_t>(y.size()), node) == 1;
  const Layout layout = ctx.OutLayout(0);
  std::vector<int64_t> channels;
  int64_t total = 0;
  for (size_t i = 0; ok && i < ctx.input_shapes.size(); ++i) {
    const Shape& x = ctx.input_shapes[i];
    ok = ctx.present[i] && ctx.input_dtypes[i] == DType::kF32 && ctx.InLayout(static_cast<int>(i)) == layout &&
         x.size() == y.size() && x[0] == y[0] && std::equal(x.begin() + 2, x.end(), y.begin() + 2);
    if (ok) channels.push_back(x[1]);
    total += ok ? x[1] : 0;
  }
  ok = ok && total == y[1] && a.size() == static_cast<size_t>(total) && b.size() == static_cast<size_t>(total);
  for (int64_t d : y) ok = ok && d >= 0;
  const bool nhwc = layout == Layout::kNhwc;
  if (!ok || (nhwc && y.size() != 4)) {
    if (AnyNhwc(ctx))
      ThrowUnsupportedLayouts(node, "ConcatBatchNormF32Nhwc",
                              "only a float32 rank-4 Concat of channels carrying a folded BatchNormalization takes "
                              "NHWC tensors");
    return nullptr;
  }
  int64_t inner = 1;
  for (size_t d = 2; d < y.size(); ++d) inner *= y[d];
  return std::make_unique<ConcatBatchNormKernel>(std::move(channels), y[0], inner, nhwc, a, b, act, ctx.num_threads);
}

}  // namespace osprey

namespace osprey::cpu {

bool BatchNormSupportsNhwc(const KernelBuildContext& ctx) {
  BatchNormSetup s;
  return PrepareBatchNorm(ctx, s) && s.x.size() == 4;
}

}  // namespace osprey::cpu
