// ConvInteger and MatMulInteger (what ONNX Runtime's quantize_dynamic writes: DynamicQuantizeLinear -> ConvInteger /
// MatMulInteger -> [Add (int32 bias)] -> Cast -> Mul), and DynamicQuantizeLinear. Weights must be constants. Two
// kernels, both exact:
//
// - With VNNI or AMX (Int8ProductsExact: oneDNN sums u8 x s8 products in 32 bits), on oneDNN's int8 primitives. They
//   take signed weights without a zero point, and quantize_dynamic writes uint8 weights with one (w - w_zp spans up to
//   [-255, 255]): the kernel feeds w' = w - 128 (int8 weights: w' = w) and adds the rest,
//   sum (x - x_zp)(w - w_zp) = sum (x - x_zp) w' + c[m] sum (x - x_zp) with c[m] = 128 - w_zp[m] (int8: -w_zp[m]),
//   where the second sum runs over the same window (the convolution's taps inside the image, a MatMul row) and is
//   computed here from per-pixel channel sums. The activation zero point is the primitive's run-time source zero
//   point. ConvInteger's plain tensors go through oneDNN reorders to and from channels last. ddddocr's 21 convolutions
//   took 3.1 ms instead of 7.3 with the float32 kernel below (docs/performance.md, "Twentieth session"). With
//   `_dequantize` (the fused Add -> Cast -> Mul after it: ops/integer_dequantize.h) both kernels write float32.
// - Elsewhere, on oneDNN's float32 kernels: (w - w_zero_point) is made a float32 weight once, at build; per run the
//   activation becomes float32 (x - x_zero_point), the float kernel runs, and its result is rounded to int32. Every
//   value involved is an integer, and float32 holds integers exactly up to 2^24: the result equals the reference's
//   int32 wherever no partial sum passes 2^24 in magnitude (255 x 255 x 258 terms of one sign), and beyond that is
//   within float32 rounding of it, which the Cast to float32 that follows in such models rounds to anyway. (Without
//   VNNI oneDNN's int8 kernels sum pairs of products in 16 bits, saturating.) The reference kernels ran ddddocr's
//   model 40x slower than ONNX Runtime (docs/performance.md, "Eleventh session").
#pragma GCC optimize("no-trapping-math")  // clamps vectorise as compare-and-select (nothing reads FP flags)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/int16_gemm.h"
#include "kernels/cpu/spare_pool.h"
#include "ops/conv_window.h"
#include "ops/dynamic_quantize.h"
#include "ops/integer_dequantize.h"
#include "ops/quantize_params.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;

bool IsQuantizedType(DType t) { return t == DType::kU8 || t == DType::kI8; }

// ConvInteger / MatMulInteger's output type: int32, or float32 with the `_dequantize` epilogue.
DType ResultType(const Node& node) { return node.GetInt("_dequantize", 0) != 0 ? DType::kF32 : DType::kI32; }

float AsFloat(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kU8 ? static_cast<float>(t.data<uint8_t>()[i]) : static_cast<float>(t.data<int8_t>()[i]);
}

// The `_dequantize` epilogue (ops/integer_dequantize.h) of `acc`, an int32 result shaped like the node's output, into
// that float32 output: channels on axis 1 (ConvInteger) or the last axis (MatMulInteger), rows split over threads.
void RunDequantize(KernelContext& ctx, bool conv, const int32_t* acc, int threads) {
  Tensor& y = ctx.Out(0);
  const Shape& s = y.shape();
  const int64_t channels = s[conv ? 1 : s.size() - 1], total = y.numel();
  const int64_t inner = conv ? total / (s[0] * channels) : 1;
  const Tensor* bias = ctx.HasIn(kDequantizeBiasInput) ? &ctx.In(kDequantizeBiasInput) : nullptr;
  const Tensor& scale = ctx.In(kDequantizeScaleInput);
  CheckDequantizeOperands(ctx.node, bias, scale, channels);
  const int32_t* b = bias ? bias->data<int32_t>() : nullptr;
  const int64_t bn = bias ? bias->numel() : 0, sn = scale.numel();
  const float* sc = scale.data<float>();
  float* out = y.data<float>();
  const int parts = total >= (1 << 15) ? std::max(1, threads) : 1;
  if (conv) {
    const int64_t rows = total / inner;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t c = r % channels;
      DequantizeRows(acc + r * inner, 1, 1, inner, b ? b + (bn == 1 ? 0 : c) : nullptr, 1, sc + (sn == 1 ? 0 : c), 1,
                     out + r * inner);
    }
    return;
  }
  const int64_t rows = total / channels;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    DequantizeRows(acc + r0 * channels, r1 - r0, channels, 1, b, bn, sc, sn, out + r0 * channels);
  }
}

// What both integer kernels below need of a ConvInteger (2-D, one group) / MatMulInteger node, checked once: 8-bit
// inputs, a constant weight with a constant zero point (one, or one per output channel), one activation zero point,
// plain layouts, and shapes that agree (the convolution's window resolved against them).
struct IntegerProduct {
  bool dequantize = false;  // the `_dequantize` epilogue: float32 out
  Shape x, y;
  const Tensor* w = nullptr;
  const Tensor* wzp = nullptr;  // absent: zero
  int64_t zps = 0, out_c = 0, k = 0;
  ConvWindow win;  // ConvInteger
  int threads = 1;
  int32_t WeightZero(int64_t m) const { return zps == 0 ? 0 : static_cast<int32_t>(AsFloat(*wzp, zps == 1 ? 0 : m)); }
};

bool ResolveIntegerProduct(const KernelBuildContext& ctx, bool conv, IntegerProduct* p) {
  if (ctx.input_dtypes.size() < 2 || !IsQuantizedType(ctx.input_dtypes[0]) || !IsQuantizedType(ctx.input_dtypes[1]))
    return false;
  if (ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != ResultType(ctx.node) || !ctx.input_values[1])
    return false;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return false;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return false;
  if (ctx.present.size() > 2 && ctx.present[2] && NumElements(ctx.input_shapes[2]) > 1) return false;  // per row
  const bool has_wzp = ctx.present.size() > 3 && ctx.present[3];
  if (has_wzp && !ctx.input_values[3]) return false;
  p->dequantize = ctx.node.GetInt("_dequantize", 0) != 0;
  p->w = ctx.input_values[1];
  p->wzp = has_wzp ? ctx.input_values[3] : nullptr;
  p->zps = p->wzp ? p->wzp->numel() : 0;
  p->x = ctx.input_shapes[0];
  p->y = ctx.output_shapes[0];
  p->threads = std::max(1, ctx.num_threads);
  const Shape& ws = p->w->shape();
  if (ws.size() != (conv ? 4u : 2u)) return false;
  p->out_c = ws[conv ? 0 : 1];
  p->k = conv ? ws[1] * ws[2] * ws[3] : ws[0];
  if (p->k <= 0 || p->out_c <= 0 || (p->zps > 1 && p->zps != p->out_c)) return false;
  const Shape& x = p->x;
  const Shape& y = p->y;
  if (!conv)
    return !x.empty() && x.back() == p->k && !y.empty() && y.back() == p->out_c &&
           NumElements(y) == NumElements(x) / p->k * p->out_c;
  if (x.size() != 4 || y.size() != 4 || ws[1] != x[1] || y[1] != p->out_c || y[0] != x[0]) return false;
  if (ctx.node.GetInt("group", 1) != 1) return false;
  const std::vector<int64_t> kernel = ctx.node.GetInts("kernel_shape", {ws[2], ws[3]});
  if (kernel != std::vector<int64_t>{ws[2], ws[3]}) return false;
  p->win = ResolveConvWindow(ctx.node, x, kernel, /*ceil_mode=*/false);
  return p->win.out[0] == y[2] && p->win.out[1] == y[3];
}

// The activation's zero point (input 2; 0 when absent), after checking that `ctx` has the shapes `name` was built for.
int32_t ActivationZero(const KernelContext& ctx, const char* name, const Shape& x, const Shape& y) {
  if (ctx.In(0).shape() != x || ctx.Out(0).shape() != y)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for input " + ShapeToString(x) +
                                          ", got " + ShapeToString(ctx.In(0).shape()));
  return ctx.HasIn(2) && ctx.In(2).numel() > 0 ? static_cast<int32_t>(AsFloat(ctx.In(2), 0)) : 0;
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
    dequantize_ = ctx.node.GetInt("_dequantize", 0) != 0;
    threads_ = std::max(1, ctx.num_threads);
    return inner_ != nullptr;
  }
  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    const Tensor& xq = ctx.In(0);
    if (xq.shape() != x_shape_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + " was built for input " +
                                            ShapeToString(x_shape_) + ", got " + ShapeToString(xq.shape()));
    const float zero = ctx.HasIn(2) && ctx.In(2).numel() > 0 ? AsFloat(ctx.In(2), 0) : 0.f;
    Scratch scratch = scratch_.Take([&] {
      return Scratch{Tensor(DType::kF32, x_shape_), Tensor(DType::kF32, y_shape_),
                     dequantize_ ? Tensor(DType::kI32, y_shape_) : Tensor()};
    });
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
    int32_t* out = dequantize_ ? scratch.acc.data<int32_t>() : ctx.Out(0).data<int32_t>();
    const int64_t m = y.numel();
#pragma omp parallel for simd schedule(static) if (m >= (1 << 18))
    for (int64_t i = 0; i < m; ++i) out[i] = static_cast<int32_t>(std::nearbyint(yf[i]));
    if (dequantize_) RunDequantize(ctx, node_.op_type == "Conv", out, threads_);
    scratch_.Give(std::move(scratch));
  }

 private:
  const char* name_;
  Node node_;
  Tensor weight_;
  std::unique_ptr<Kernel> inner_;
  Shape x_shape_, y_shape_;
  bool dequantize_ = false;
  int threads_ = 1;

  // The float copies of the activation and the result, kept between runs (one pair per concurrent run): fresh
  // blocks of this size would be mapped and faulted in on every run (about as long as the convolution itself).
  struct Scratch {
    Tensor x, y, acc;  // acc: the int32 result before the `_dequantize` epilogue (empty without it)
  };
  SparePool<Scratch> scratch_;
};

// The weight (input 1) less its zero point (input 3: one value, or one per `axis` index), as float32; nothing when
// the weight is computed at run time or the types are not 8-bit.
bool FloatWeight(const KernelBuildContext& ctx, int64_t axis, Tensor* out) {
  if (ctx.input_dtypes.size() < 2 || !IsQuantizedType(ctx.input_dtypes[0]) || !IsQuantizedType(ctx.input_dtypes[1]))
    return false;
  if (!ctx.input_values[1] || ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != ResultType(ctx.node))
    return false;
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

// ConvInteger (2-D, one group) / MatMulInteger on oneDNN's u8 x s8 -> s32 primitives (top of the file). Built only
// where the products are exact (Int8ProductsExact), the activation is uint8 with one zero point and the weight is a
// constant with one zero point or one per output channel.
class IntegerInt8Kernel final : public Kernel {
 public:
  const char* Name() const override { return conv_ ? "ConvIntegerInt8Dnnl" : "MatMulIntegerInt8Dnnl"; }

  bool Build(const KernelBuildContext& ctx, bool conv) {
    conv_ = conv;
    IntegerProduct p;
    if (!Int8ProductsExact() || !ResolveIntegerProduct(ctx, conv, &p) || ctx.input_dtypes[0] != DType::kU8)
      return false;
    // Sums stay inside int32: |x - x_zp| <= 255, |w'| <= 128, |c[m]| <= 255.
    if (p.k > 16384) return false;
    dequantize_ = p.dequantize;
    x_ = p.x;
    y_ = p.y;
    k_ = p.k;
    win_ = p.win;
    threads_ = p.threads;
    const Tensor& w = *p.w;
    const Shape& ws = w.shape();
    const int64_t out_c = p.out_c;
    const bool w_u8 = w.dtype() == DType::kU8;
    Tensor wq(DType::kI8, ws);
    comp_.assign(static_cast<size_t>(out_c), 0);
    for (int64_t i = 0; i < w.numel(); ++i) wq.data<int8_t>()[i] = static_cast<int8_t>(AsFloat(w, i) - (w_u8 ? 128 : 0));
    for (int64_t m = 0; m < out_c; ++m) {
      comp_[m] = (w_u8 ? 128 : 0) - p.WeightZero(m);
      if (comp_[m] != 0) correct_ = true;
    }

    dnnl::primitive_attr attr = BaseAttr();
    attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    memory::desc w_plain, w_any;
    if (conv) {
      memory::dims st, di, pl, pr;
      for (int i = 0; i < 2; ++i) {
        const int64_t l = win_.pad_begin[i], r = win_.pad_end[i], s = win_.strides[i];
        if (l < 0 || r < 0) return false;
        st.push_back(s);
        di.push_back(win_.dilations[i] - 1);
        pl.push_back(l);
        pr.push_back(r);
      }
      user_src_md_ = memory::desc(ToDims(x_), memory::data_type::u8, memory::format_tag::nchw);
      user_dst_md_ = memory::desc(ToDims(y_), memory::data_type::s32, memory::format_tag::nchw);
      const memory::desc src(ToDims(x_), memory::data_type::u8, memory::format_tag::nhwc);
      const memory::desc dst(ToDims(y_), memory::data_type::s32, memory::format_tag::nhwc);
      w_plain = memory::desc(ToDims(ws), memory::data_type::s8, memory::format_tag::oihw);
      w_any = memory::desc(ToDims(ws), memory::data_type::s8, memory::format_tag::any);
      try {
        dnnl::convolution_forward::primitive_desc pd(CpuEngine(), dnnl::prop_kind::forward_inference,
                                                     dnnl::algorithm::convolution_direct, src, w_any, dst, st, di, pl,
                                                     pr, attr, /*allow_empty=*/true);
        if (!pd || IsReferenceImpl(pd)) return false;
        pd_ = pd;
        primitive_ = dnnl::convolution_forward(pd);
      } catch (const dnnl::error&) {
        return false;
      }
    } else {
      const int64_t rows = NumElements(x_) / k_;
      user_src_md_ = memory::desc({rows, k_}, memory::data_type::u8, memory::format_tag::ab);
      user_dst_md_ = memory::desc({rows, out_c}, memory::data_type::s32, memory::format_tag::ab);
      w_plain = memory::desc(ToDims(ws), memory::data_type::s8, memory::format_tag::ab);
      w_any = memory::desc(ToDims(ws), memory::data_type::s8, memory::format_tag::any);
      try {
        dnnl::matmul::primitive_desc pd(CpuEngine(), user_src_md_, w_any, user_dst_md_, attr);
        if (!pd || IsReferenceImpl(pd)) return false;
        pd_ = pd;
        primitive_ = dnnl::matmul(pd);
      } catch (const dnnl::error&) {
        return false;
      }
    }
    weight_ = PackWeight(ctx, w_plain, wq, pd_.weights_desc());
    io_ = IoReorders(user_src_md_, pd_.src_desc(), user_dst_md_, pd_.dst_desc(), pd_.scratchpad_desc());
    // Window sums: per-pixel channel sums and their sums over each output's window (conv), or row sums (MatMul).
    acc_bytes_ = dequantize_ ? ThreadScratch::Align(sizeof(int32_t) * static_cast<size_t>(NumElements(y_))) : 0;
    sums_bytes_ = correct_ ? ThreadScratch::Align(sizeof(int32_t) * static_cast<size_t>(
                                                      conv ? x_[0] * x_[2] * x_[3] + x_[0] * y_[2] * y_[3]
                                                           : NumElements(x_) / k_))
                           : 0;
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    const int32_t zero = ActivationZero(ctx, Name(), x_, y_);
    RunDnnl(ctx.node, Name(), [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(io_.TotalBytes() + sums_bytes_ + acc_bytes_);
      const auto run = runs_.Acquire([this] { return MakeRunState(); });
      *static_cast<int32_t*>(run->zero.get_data_handle()) = zero;
      int32_t* acc = dequantize_ ? reinterpret_cast<int32_t*>(scratch + io_.TotalBytes() + sums_bytes_)
                                 : ctx.Out(0).data<int32_t>();
      io_.Point(run->io, x.raw(), acc, scratch);
      if (io_.reorder_src) run->io.src_reorder.Execute(io_.src_reorder, stream);
      run->primitive.Execute(primitive_, stream);
      if (io_.reorder_dst) run->io.dst_reorder.Execute(io_.dst_reorder, stream);
      stream.wait();
      if (correct_) {
        int32_t* sums = reinterpret_cast<int32_t*>(scratch + io_.TotalBytes());
        if (conv_)
          CorrectConv(x.data<uint8_t>(), zero, sums, acc);
        else
          CorrectMatMul(x.data<uint8_t>(), zero, sums, acc);
      }
      if (dequantize_) RunDequantize(ctx, conv_, acc, threads_);
    });
  }

 private:
  // out[n, m, o] += c[m] * (sum over o's window of x - x_zp): per-pixel channel sums, then the window of each output.
  void CorrectConv(const uint8_t* x, int32_t zero, int32_t* sums, int32_t* out) const {
    const int64_t n = x_[0], c = x_[1], hw = x_[2] * x_[3], ih = x_[2], iw = x_[3];
    const int64_t oh = y_[2], ow = y_[3], ohw = oh * ow, m = y_[1];
    int32_t* box = sums + n * hw;
    for (int64_t b = 0; b < n; ++b) {
      int32_t* s = sums + b * hw;
      std::fill(s, s + hw, -static_cast<int32_t>(c) * zero);
      for (int64_t ch = 0; ch < c; ++ch) {
        const uint8_t* row = x + (b * c + ch) * hw;
#pragma omp simd
        for (int64_t p = 0; p < hw; ++p) s[p] += row[p];
      }
      int32_t* bx = box + b * ohw;
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xo = 0; xo < ow; ++xo) {
          int32_t total = 0;
          for (int64_t ky = 0; ky < win_.kernel[0]; ++ky) {
            const int64_t iy = y * win_.strides[0] - win_.pad_begin[0] + ky * win_.dilations[0];
            if (iy < 0 || iy >= ih) continue;
            for (int64_t kx = 0; kx < win_.kernel[1]; ++kx) {
              const int64_t ix = xo * win_.strides[1] - win_.pad_begin[1] + kx * win_.dilations[1];
              if (ix >= 0 && ix < iw) total += s[iy * iw + ix];
            }
          }
          bx[y * ow + xo] = total;
        }
    }
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && n * m * ohw >= (1 << 15))
    for (int64_t row = 0; row < n * m; ++row) {
      const int32_t k = comp_[row % m];
      const int32_t* bx = box + (row / m) * ohw;
      int32_t* o = out + row * ohw;
#pragma omp simd
      for (int64_t p = 0; p < ohw; ++p) o[p] += k * bx[p];
    }
  }

  // out[r, j] += c[j] * (sum of row r of x - x_zp).
  void CorrectMatMul(const uint8_t* x, int32_t zero, int32_t* sums, int32_t* out) const {
    const int64_t rows = NumElements(x_) / k_, cols = static_cast<int64_t>(comp_.size());
    const int32_t* comp = comp_.data();
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && rows * (k_ + cols) >= (1 << 15))
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* a = x + r * k_;
      int32_t total = 0;
#pragma omp simd reduction(+ : total)
      for (int64_t k = 0; k < k_; ++k) total += a[k];
      sums[r] = total - static_cast<int32_t>(k_) * zero;
      int32_t* o = out + r * cols;
      const int32_t sr = sums[r];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) o[j] += comp[j] * sr;
    }
  }

  // The memories and argument arrays of one run (one set per concurrent caller, PerCaller); `zero` holds the run's
  // activation zero point (its own buffer, which the primitive reads as its source zero point).
  struct RunState {
    ReorderedIo io;
    dnnl::memory zero;
    ExecArgs primitive;
  };
  RunState MakeRunState() const {
    RunState r{io_.MakeIo(), dnnl::memory(memory::desc({1}, memory::data_type::s32, memory::format_tag::x), CpuEngine()),
               {}};
    r.primitive.Add(DNNL_ARG_SRC, r.io.src)
        .Add(DNNL_ARG_WEIGHTS, weight_.memory)
        .Add(DNNL_ARG_DST, r.io.dst)
        .Add(DNNL_ARG_SCRATCHPAD, r.io.scratchpad)
        .Add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, r.zero);
    return r;
  }

  bool conv_ = false, correct_ = false, dequantize_ = false;
  Shape x_, y_;
  int64_t k_ = 0;
  int threads_ = 1;
  ConvWindow win_;
  std::vector<int32_t> comp_;  // c[m]: 128 - w_zp[m] for uint8 weights, -w_zp[m] for int8
  dnnl::primitive_desc pd_;
  dnnl::primitive primitive_;
  memory::desc user_src_md_, user_dst_md_;
  IoReorders io_;
  PackedWeight weight_;
  size_t sums_bytes_ = 0, acc_bytes_ = 0;
  PerCaller<RunState> runs_;
};

// ConvInteger (2-D, one group) / MatMulInteger exactly on AVX2 without VNNI (int16_gemm.h): both operands widened to
// int16 less their zero points, products summed in 32 bits by vpmaddwd. MatMul: the activation rows are A and the
// weight is B, packed once. Conv: the weight [M][C kh kw] is A and each block of output pixels is gathered (im2col)
// into B panels on its thread, so the result comes out [M][pixels], the NCHW layout. Used where IntegerInt8Kernel is
// not (no VNNI): the float32 kernel below it ran ddddocr's dynamically quantised CRNN 1.6x slower than ONNX Runtime.
class IntegerInt16Kernel final : public Kernel {
 public:
  const char* Name() const override { return conv_ ? "ConvIntegerInt16Avx2" : "MatMulIntegerInt16Avx2"; }

  bool Build(const KernelBuildContext& ctx, bool conv) {
    conv_ = conv;
    IntegerProduct p;
    // Each product is at most 255 x 255: sums of up to 33,025 of them fit int32.
    if (!Int16GemmAvailable() || !ResolveIntegerProduct(ctx, conv, &p) || p.k > 33025) return false;
    dequantize_ = p.dequantize;
    x_ = p.x;
    y_ = p.y;
    out_c_ = p.out_c;
    k_ = p.k;
    kp_ = Int16PairedK(k_);
    win_ = p.win;
    threads_ = p.threads;
    if (conv) PlanConv();
    const Tensor& w = *p.w;
    const Tensor* wzp = p.wzp;
    auto weight = [&](int64_t out, int64_t i) {  // element i of W, less output channel out's zero point
      return static_cast<int16_t>(static_cast<int32_t>(AsFloat(w, i)) - p.WeightZero(out));
    };
    // The weight, once: conv [M][Kp] rows (A), MatMul packed panels (B). Shared between plans of the same weight and
    // zero points (the key names them).
    const size_t bytes = sizeof(int16_t) * static_cast<size_t>(conv ? out_c_ * kp_ : Int16PackedSize(k_, out_c_));
    auto fill = [&](void* data) {
      int16_t* out = static_cast<int16_t*>(data);
      if (conv) {
        for (int64_t m = 0; m < out_c_; ++m)
          for (int64_t k = 0; k < kp_; ++k) out[m * kp_ + k] = k < k_ ? weight(m, m * k_ + k) : int16_t{0};
      } else {
        PackInt16B(
            k_, out_c_, [&](int64_t k, int64_t n) { return weight(n, k * out_c_ + n); }, out);
      }
    };
    std::string key = conv ? "int16-conv-weight" : "int16-matmul-weight";
    if (wzp) {
      uint64_t h = 1469598103934665603ull;  // FNV-1a of the zero points' bytes
      for (size_t i = 0; i < wzp->nbytes(); ++i)
        h = (h ^ static_cast<const uint8_t*>(wzp->raw())[i]) * 1099511628211ull;
      key += ":zp" + std::to_string(p.zps) + ":" + std::to_string(h);
    }
    if (ctx.derive_weight && w.buffer()) {
      weight_ = ctx.derive_weight(w, key, bytes, fill);
    } else {
      weight_ = Allocator::Host().Allocate(bytes);
      fill(weight_->data());
    }
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    const int32_t zero = ActivationZero(ctx, Name(), x_, y_);
    const size_t acc_bytes =
        dequantize_ ? ThreadScratch::Align(sizeof(int32_t) * static_cast<size_t>(NumElements(y_))) : 0;
    const size_t a_bytes =
        conv_ ? 0 : ThreadScratch::Align(sizeof(int16_t) * static_cast<size_t>(NumElements(x_) / k_ * kp_));
    // This thread's block also holds its pixel panels (RunConv): a second Reserve here would move the first.
    char* scratch = ThreadScratch::Reserve(acc_bytes + a_bytes + (conv_ ? PanelBytes() : 0));
    int32_t* acc = dequantize_ ? reinterpret_cast<int32_t*>(scratch) : ctx.Out(0).data<int32_t>();
    const int16_t* w = static_cast<const int16_t*>(weight_->data());
    if (conv_)
      RunConv(x, zero, w, reinterpret_cast<int16_t*>(scratch + acc_bytes), acc);
    else
      RunMatMul(x, zero, w, reinterpret_cast<int16_t*>(scratch + acc_bytes), acc);
    if (dequantize_) RunDequantize(ctx, conv_, acc, threads_);
  }

 private:
  // dst[i] = src[i * stride] - zero for i < n (8-bit src of either signedness).
  static void Shift(const Tensor& x, int64_t offset, int64_t stride, int64_t n, int32_t zero, int16_t* dst) {
    auto run = [&](const auto* src) {
      src += offset;
      if (stride == 1) return ShiftInt16(src, n, zero, dst);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int16_t>(src[i * stride] - zero);
    };
    if (x.dtype() == DType::kU8)
      run(x.data<uint8_t>());
    else
      run(x.data<int8_t>());
  }

  void RunMatMul(const Tensor& x, int32_t zero, const int16_t* b, int16_t* a, int32_t* c) const {
    const int64_t rows = NumElements(x_) / k_;
    for (int64_t r = 0; r < rows; ++r) {
      Shift(x, r * k_, 1, k_, zero, a + r * kp_);
      if (kp_ > k_) a[r * kp_ + k_] = 0;
    }
    Int16GemmThreaded(a, rows, kp_, b, c, out_c_, threads_);
  }

  // How a convolution's output is cut into jobs (Build). Output pixels are gathered in blocks of whole panels, the
  // rows of a block in at most kBlockRowBytes (its panels take as much again), the blocks of an image equal in
  // panels. Where images x blocks leave threads idle, the work is cut further: the output channels when they
  // outnumber the pixels (each part gathers the block itself but reads only its share of the weight, which is then
  // the larger operand: ResNet's last 3x3 layers, 512 channels of K 4608 over 49 pixels), else the pixels into
  // smaller blocks; and the job count is rounded up to a multiple of the threads where the panels allow, so that no
  // thread runs a last job alone (1024 + 1024 + 1024 + 64 pixels on two threads ran 2048 on one).
  static constexpr int64_t kBlockRowBytes = 128 << 10;
  void PlanConv() {
    const int64_t images = x_[0], pixels = y_[2] * y_[3];
    const int64_t panels = (pixels + kInt16PanelCols - 1) / kInt16PanelCols;
    const int64_t max_panels =
        std::max<int64_t>(1, kBlockRowBytes / (kp_ * int64_t{sizeof(int16_t)}) / kInt16PanelCols);
    int64_t blocks = (panels + max_panels - 1) / max_panels;
    splits_ = 1;
    if (images * blocks < threads_) {
      if (out_c_ > pixels)
        splits_ = std::clamp<int64_t>((threads_ + images * blocks - 1) / (images * blocks), 1, (out_c_ + 3) / 4);
      else
        blocks = std::min(panels, (threads_ + images - 1) / images);
    } else if (images * blocks % threads_ != 0 && threads_ > 1) {
      const int64_t jobs = (images * blocks + threads_ - 1) / threads_ * threads_;
      blocks = std::min(panels, (jobs + images - 1) / images);
    }
    const int64_t block_panels = (panels + blocks - 1) / blocks;
    block_ = block_panels * kInt16PanelCols;
    blocks_ = (panels + block_panels - 1) / block_panels;
  }
  int64_t PixelBlock() const { return block_; }
  size_t BlockBytes() const { return ThreadScratch::Align(sizeof(int16_t) * static_cast<size_t>(PixelBlock() * kp_)); }
  size_t PanelBytes() const { return 2 * BlockBytes(); }

  // `own`: the calling thread's PanelBytes; the others reserve theirs. Per block of output pixels: row k (a tap of an
  // input channel) of the im2col matrix is runs of one input row each (contiguous at stride 1), then the rows are
  // interleaved into panels (PackInt16Rows). With fewer blocks than threads (small images, deep layers) the output
  // channels are split too, each part gathering the block itself (1 / channels of its products).
  void RunConv(const Tensor& x, int32_t zero, const int16_t* w, int16_t* own, int32_t* c) const {
    const int64_t images = x_[0], channels = x_[1], ih = x_[2], iw = x_[3], oh = y_[2], ow = y_[3];
    const int64_t pixels = oh * ow, kh = win_.kernel[0], kw = win_.kernel[1];
    const int64_t sy = win_.strides[0], sx = win_.strides[1], dy = win_.dilations[0], dx = win_.dilations[1];
    const int64_t block = block_, blocks = blocks_, splits = splits_;
    const bool pointwise = kh == 1 && kw == 1 && sy == 1 && sx == 1 && ih * iw == pixels && win_.pad_begin[0] == 0 &&
                           win_.pad_begin[1] == 0;
    const int64_t row_blocks = (out_c_ + 3) / 4;  // int16_gemm.cc's 4-row blocks
    const int64_t jobs = images * blocks * splits;
    const int parts = static_cast<int>(std::min<int64_t>(threads_, jobs));
#pragma omp parallel for num_threads(parts) schedule(dynamic, 1) if (parts > 1)
    for (int64_t job = 0; job < jobs; ++job) {
      const int64_t split = job % splits, n = job / splits / blocks, p0 = job / splits % blocks * block;
      const int64_t count = std::min(block, pixels - p0);
      const int64_t m0 = row_blocks * split / splits * 4, m1 = std::min(out_c_, row_blocks * (split + 1) / splits * 4);
      int16_t* rows =
          omp_get_thread_num() == 0 ? own : reinterpret_cast<int16_t*>(ThreadScratch::Reserve(PanelBytes()));
      int16_t* packed = rows + BlockBytes() / sizeof(int16_t);
      const int64_t x_base = n * channels * ih * iw;
      if (pointwise) {  // the input is its own im2col matrix
        if (x.dtype() == DType::kU8)
          PackInt16Rows(x.data<uint8_t>() + x_base + p0, pixels, k_, count, zero, packed);
        else
          PackInt16Rows(x.data<int8_t>() + x_base + p0, pixels, k_, count, zero, packed);
        Int16Gemm(w + m0 * kp_, kp_, m1 - m0, kp_, packed, c + (n * out_c_ + m0) * pixels + p0, pixels, 0, count);
        continue;
      }
      int64_t k = 0;
      for (int64_t ch = 0; ch < channels; ++ch)
        for (int64_t ky = 0; ky < kh; ++ky)
          for (int64_t kx = 0; kx < kw; ++kx, ++k) {
            int16_t* row = rows + k * block;
            const int64_t off_x = kx * dx - win_.pad_begin[1];
            // Output columns whose input column is inside: ox * sx + off_x in [0, iw).
            const int64_t lo = off_x >= 0 ? 0 : (-off_x + sx - 1) / sx;
            const int64_t hi = std::min(ow, iw - off_x <= 0 ? 0 : (iw - off_x - 1) / sx + 1);
            for (int64_t j = 0; j < count;) {
              const int64_t p = p0 + j, oy = p / ow, ox0 = p % ow, run = std::min(ow - ox0, count - j);
              const int64_t yy = oy * sy - win_.pad_begin[0] + ky * dy;
              int16_t* dst = row + j;
              if (yy < 0 || yy >= ih) {
                std::fill(dst, dst + run, int16_t{0});
              } else {
                const int64_t a = std::clamp(lo, ox0, ox0 + run), b = std::clamp(hi, a, ox0 + run);
                std::fill(dst, dst + (a - ox0), int16_t{0});
                if (b > a) Shift(x, x_base + (ch * ih + yy) * iw + a * sx + off_x, sx, b - a, zero, dst + (a - ox0));
                std::fill(dst + (b - ox0), dst + run, int16_t{0});
              }
              j += run;
            }
          }
      PackInt16Rows(rows, block, k_, count, packed);
      Int16Gemm(w + m0 * kp_, kp_, m1 - m0, kp_, packed, c + (n * out_c_ + m0) * pixels + p0, pixels, 0, count);
    }
  }

  bool conv_ = false, dequantize_ = false;
  Shape x_, y_;
  int64_t out_c_ = 0, k_ = 0, kp_ = 0;
  int threads_ = 1;
  int64_t block_ = 0, blocks_ = 0, splits_ = 1;  // PlanConv
  ConvWindow win_;
  std::shared_ptr<Buffer> weight_;
};

// DynamicQuantizeLinear(x float32) -> (y uint8, y_scale, y_zero_point): the reference's arithmetic (min/max with 0,
// scale = (max - min) / 255, zero point and values rounded half to even and saturated, NaN -> zero point) in
// vectorised loops, split over the plan's threads for large tensors; bit-identical (tests/unit/kernels/integer_test.cc).
__attribute__((target_clones("avx512f", "avx2", "default"))) void MinMax(const float* x, int64_t n, float* lo_out,
                                                                         float* hi_out) {
  float lo = 0.f, hi = 0.f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    lo = v < lo ? v : lo;  // a NaN never replaces the running value, as in the reference's std::min
    hi = v > hi ? v : hi;
  }
  *lo_out = lo;
  *hi_out = hi;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void QuantiseU8(const float* x, int64_t n, float scale,
                                                                             float zpf, uint8_t* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = DynamicQuantizeValue(x[i], scale, zpf);
}

class DynamicQuantizeLinearF32 final : public Kernel {
 public:
  explicit DynamicQuantizeLinearF32(int threads) : threads_(std::max(1, threads)) {}
  const char* Name() const override { return "DynamicQuantizeLinearF32"; }
  void Run(KernelContext& ctx) override {
    const Tensor& xt = ctx.In(0);
    const float* x = xt.data<float>();
    const int64_t n = xt.numel();
    uint8_t* y = ctx.Out(0).data<uint8_t>();
    // Pieces of whole cache lines, one per thread, when the tensor is large enough to pay for a parallel region.
    const int parts = n >= (1 << 16) ? threads_ : 1;
    const int64_t step = (n / parts + 15) / 16 * 16;
    // Each part's range into its own slot, combined after (a `reduction` clause on floats would take libgomp's
    // atomic entry points, which osprey's OpenMP runtime does not provide: tests/e2e/test_omp_default.py).
    std::vector<float> los(static_cast<size_t>(parts), 0.f), his(static_cast<size_t>(parts), 0.f);
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int part = 0; part < parts; ++part) {
      const int64_t i0 = std::min(n, part * step), i1 = std::min(n, i0 + step);
      MinMax(x + i0, i1 - i0, &los[part], &his[part]);
    }
    const float lo = *std::min_element(los.begin(), los.end()), hi = *std::max_element(his.begin(), his.end());
    const DynamicQuantParams q = DynamicQuantParamsOf(lo, hi);
    const float scale = q.scale;
    const uint8_t zp = q.zero;
    if (scale > 0.f) {
      const float zpf = static_cast<float>(zp);
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
      for (int part = 0; part < parts; ++part) {
        const int64_t i0 = std::min(n, part * step), i1 = std::min(n, i0 + step);
        QuantiseU8(x + i0, i1 - i0, scale, zpf, y + i0);
      }
    } else {
      std::fill(y, y + n, zp);
    }
    *ctx.Out(1).data<float>() = scale;
    *ctx.Out(2).data<uint8_t>() = zp;
  }

 private:
  int threads_;
};

}  // namespace

// QuantizeLinear from float32 and DequantizeLinear to float32 with one scale and zero point for the whole tensor,
// known when compiled (a quantised model's input and output, QOperator graphs' edges): QuantizeLinear's arithmetic
// (ops/dynamic_quantize.h: NaN to the zero point, half to even, saturated; int8 as uint8 with the zero point + 128,
// then - 128), and (x - zp) * scale, vectorised and split over threads for large tensors. Exact.
class QuantizeLinearF32 final : public Kernel {
 public:
  QuantizeLinearF32(bool dequantize, DType integer, float scale, int32_t zero_point, int threads)
      : dequantize_(dequantize), signed_(integer == DType::kI8), scale_(scale), zp_(zero_point), threads_(threads) {}
  const char* Name() const override { return dequantize_ ? "DequantizeLinearF32" : "QuantizeLinearF32"; }
  void Run(KernelContext& ctx) override {
    const int64_t n = ctx.In(0).numel();
    const int parts = n >= (1 << 16) ? threads_ : 1;
    const int64_t step = (n / parts + 63) / 64 * 64;
    const void* x = ctx.In(0).raw();
    void* y = ctx.Out(0).raw();
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int part = 0; part < parts; ++part) {
      const int64_t i0 = std::min(n, part * step), i1 = std::min(n, i0 + step);
      if (dequantize_)
        Dequantise(x, i0, i1, static_cast<float*>(y) + i0);
      else
        Quantise(static_cast<const float*>(x) + i0, i1 - i0, static_cast<uint8_t*>(y) + i0);
    }
  }

 private:
  void Quantise(const float* x, int64_t n, uint8_t* y) const {
    QuantiseU8(x, n, scale_, static_cast<float>(signed_ ? zp_ + 128 : zp_), y);
    if (signed_)
      for (int64_t i = 0; i < n; ++i) y[i] ^= 0x80;  // the same bytes as int8 v - 128
  }
  void Dequantise(const void* x, int64_t i0, int64_t i1, float* y) const {
    const float s = scale_, zp = static_cast<float>(zp_);
    if (signed_) {
      const int8_t* p = static_cast<const int8_t*>(x);
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) y[i - i0] = (static_cast<float>(p[i]) - zp) * s;
    } else {
      const uint8_t* p = static_cast<const uint8_t*>(x);
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) y[i - i0] = (static_cast<float>(p[i]) - zp) * s;
    }
  }

  bool dequantize_, signed_;
  float scale_;
  int32_t zp_;
  int threads_;
};

std::unique_ptr<Kernel> CreateQuantizeLinear(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  const bool dequantize = node.op_type == "DequantizeLinear";
  if (ctx.input_dtypes.size() < 2 || ctx.output_dtypes.size() != 1 || ctx.input_values.size() < 2) return nullptr;
  const DType integer = dequantize ? ctx.input_dtypes[0] : ctx.output_dtypes[0];
  const DType real = dequantize ? ctx.output_dtypes[0] : ctx.input_dtypes[0];
  if ((integer != DType::kU8 && integer != DType::kI8) || real != DType::kF32) return nullptr;
  const Tensor* scale = ctx.input_values[1];
  const bool has_zp = ctx.present.size() > 2 && ctx.present[2];
  const Tensor* zp = has_zp ? ctx.input_values[2] : nullptr;
  if (scale == nullptr || scale->dtype() != DType::kF32 || scale->numel() != 1 || (has_zp && zp == nullptr) ||
      (zp != nullptr && (zp->dtype() != integer || zp->numel() != 1)))
    return nullptr;
  try {
    if (ResolveQuantParams(node, ctx.opset, ctx.input_shapes[0], scale->shape()).kind != QuantParams::Kind::kPerTensor)
      return nullptr;
  } catch (const Error&) {
    return nullptr;  // the reference kernel reports it
  }
  const float s = scale->data<float>()[0];
  if (!(s > 0.f) || !std::isfinite(s)) return nullptr;  // the reference kernel's arithmetic for odd scales
  const int32_t z = zp == nullptr ? 0 : integer == DType::kI8 ? zp->data<int8_t>()[0] : zp->data<uint8_t>()[0];
  return std::make_unique<QuantizeLinearF32>(dequantize, integer, s, z, std::max(1, ctx.num_threads));
}

std::unique_ptr<Kernel> CreateIntegerKernel(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (node.domain.empty() && node.op_type == "DynamicQuantizeLinear" && ctx.input_dtypes.size() == 1 &&
      ctx.input_dtypes[0] == DType::kF32)
    return std::make_unique<DynamicQuantizeLinearF32>(ctx.num_threads);
  if (node.domain.empty() && (node.op_type == "QuantizeLinear" || node.op_type == "DequantizeLinear"))
    return CreateQuantizeLinear(ctx);
  if (!node.domain.empty() || (node.op_type != "ConvInteger" && node.op_type != "MatMulInteger")) return nullptr;
  const bool conv = node.op_type == "ConvInteger";
  if (!conv && ctx.input_shapes.size() > 1 && ctx.input_shapes[1].size() != 2) return nullptr;
  {
    OmpThreadsGuard threads(ctx.num_threads);
    auto int8 = std::make_unique<IntegerInt8Kernel>();
    if (int8->Build(ctx, conv)) return int8;
  }
  // OSPREY_INT16=0: the float32 kernel instead (A/B, tests); read when a plan is compiled.
  if (const char* e = std::getenv("OSPREY_INT16"); e == nullptr || std::string(e) != "0") {
    auto int16 = std::make_unique<IntegerInt16Kernel>();
    if (int16->Build(ctx, conv)) return int16;
  }
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
