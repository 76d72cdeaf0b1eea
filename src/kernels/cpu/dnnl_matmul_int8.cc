// Int8 MatMul for QDQ models (src/runtime/fusion_qdq.cc, FuseInt8): a MatMul node carrying `_int8` attributes computes
// DequantizeLinear(QuantizeLinear(MatMul(DequantizeLinear(QuantizeLinear(x)), W))) with oneDNN's u8 x s8 matmul, W
// a constant [K, N] of int8 multiples of its scales (one, or one per column). What transformers quantised by ONNX
// Runtime's quantize_static (QDQ format) spend their time in: the projections and the feed-forward layers.
//
// Per run: x (float32, any rank, rows of K) is quantised into a u8 [rows, K] buffer (QuantizeLinear's arithmetic,
// quantise_u8.h; an s8 activation is stored + 128 with its zero point + 128); the primitive sums (x_q - zp) * w_q
// in int32, scales by x_scale * w_scale[n] / y_scale, rounds half to even, clips to the output type's range less its
// zero point and multiplies by y_scale (post-ops): the float32 output is DequantizeLinear(QuantizeLinear(.)) of the
// product, as with the int8 convolution (dnnl_conv_int8.cc), and agrees with the reference MatMul's float arithmetic
// of the same chain except where a sum lands next to a rounding boundary (one step). Where oneDNN's int8 products are
// not exact (Int8ProductsExact false: AVX2 without VNNI sums two adjacent u8 x s8 products in 16 bits, saturating),
// a constant B's rows (A's columns) are placed in safe pairs (int8_pairing.h) and A is gathered into that order as it
// is quantised; a run-time B has no weights to pair by, so that MatMul stays float32 (the fusion asks the same).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/int8_pairing.h"
#include "kernels/cpu/quantise_u8.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;
constexpr const char* kName = "MatMulInt8Dnnl";

class MatMulInt8Kernel final : public Kernel {
 public:
  const char* Name() const override { return kName; }

  bool Build(const KernelBuildContext& ctx) {
    const Node& node = ctx.node;
    has_bias_ = node.GetInt("_bias", 0) != 0;  // a Gemm's C (FuseInt8): an [N] input 2, constant
    if (ctx.input_shapes.size() != (has_bias_ ? 3u : 2u) || ctx.output_shapes.size() != 1) return false;
    for (Layout l : ctx.input_layouts)
      if (l != Layout::kPlain) return false;
    for (Layout l : ctx.output_layouts)
      if (l != Layout::kPlain) return false;
    if (ctx.input_dtypes[0] != DType::kF32 || ctx.input_dtypes[1] != DType::kF32 || ctx.output_dtypes[0] != DType::kF32)
      return false;
    if (!node.GetString("_activation", "").empty()) return false;
    x_ = ctx.input_shapes[0];
    b_ = ctx.input_shapes[1];
    y_ = ctx.output_shapes[0];
    b_runtime_ = node.Has("_int8_b_scale");
    const bool exact = Int8ProductsExact();
    if (b_runtime_ && !exact) return false;
    const Tensor* w = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
    if (b_runtime_ ? b_.size() != x_.size() || has_bias_ : (w == nullptr || w->raw() == nullptr || b_.size() != 2))
      return false;
    const int64_t rank = static_cast<int64_t>(x_.size()), k = b_[b_.size() - 2], n = b_.back();
    if (rank < 2 || x_.back() != k || y_.size() != x_.size() || y_.back() != n || k <= 0 || n <= 0) return false;
    threads_ = std::max(1, ctx.num_threads);
    x_scale_ = node.GetFloat("_int8_x_scale", 0.f);
    const float y_scale = node.GetFloat("_int8_y_scale", 0.f);
    const int32_t x_zp = static_cast<int32_t>(node.GetInt("_int8_x_zero_point", 0));
    const int32_t y_zp = static_cast<int32_t>(node.GetInt("_int8_y_zero_point", 0));
    const bool x_signed = node.GetInt("_int8_x_signed", 0) != 0, y_signed = node.GetInt("_int8_y_signed", 0) != 0;
    if (!(x_scale_ > 0.f) || !(y_scale > 0.f)) return false;
    zp_u8_ = x_zp + (x_signed ? 128 : 0);  // u8 storage of a quantised activation: q + 128 for s8
    if (zp_u8_ < 0 || zp_u8_ > 255) return false;

    dnnl::primitive_attr attr = BaseAttr();
    memory::desc w_md;
    Tensor wq;
    if (b_runtime_) {
      // B quantised per run like A, stored as s8 (u8 storage - 128, the bytes XOR 0x80) with its zero point less 128
      // as oneDNN's weights zero point; one scale for the product: x_scale * b_scale / y_scale.
      b_scale_ = node.GetFloat("_int8_b_scale", 0.f);
      const int32_t b_zp = static_cast<int32_t>(node.GetInt("_int8_b_zero_point", 0));
      b_zp_u8_ = b_zp + (node.GetInt("_int8_b_signed", 0) != 0 ? 128 : 0);
      if (!(b_scale_ > 0.f) || b_zp_u8_ < 0 || b_zp_u8_ > 255) return false;
      b_zp_s8_ = b_zp_u8_ - 128;
      for (int64_t d = 0; d + 2 < rank; ++d)  // batch dims: equal, or 1 in one operand (oneDNN broadcasts)
        if (x_[d] != b_[d] && x_[d] != 1 && b_[d] != 1) return false;
      scales_ = {x_scale_ * b_scale_ / y_scale};
      attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
      if (b_zp_s8_ != 0) attr.set_zero_points_mask(DNNL_ARG_WEIGHTS, 0);
      w_md = memory::desc(ToDims(b_), memory::data_type::s8, PlainDesc(ToDims(b_)).get_strides());
    } else {
      // The int8 weights: W = w_q * w_scale[n] exactly (infer-and-fold's DequantizeLinear of the constant).
      const std::vector<float> w_scale = node.GetFloats("_int8_w_scale", {});
      if (w_scale.size() != 1 && static_cast<int64_t>(w_scale.size()) != n) return false;
      wq = Tensor(DType::kI8, w->shape());
      const float* wf = w->data<float>();
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const float s = w_scale[w_scale.size() == 1 ? 0 : c], v = wf[r * n + c];
          const float q = std::nearbyint(v / s);
          if (q < -128.f || q > 127.f || std::fabs(q * s - v) > 1e-6f * std::fabs(v) + 1e-30f) return false;
          wq.data<int8_t>()[r * n + c] = static_cast<int8_t>(q);
        }
      scales_.resize(w_scale.size());
      for (size_t c = 0; c < w_scale.size(); ++c) scales_[c] = x_scale_ * w_scale[c] / y_scale;
      attr.set_scales_mask(DNNL_ARG_WEIGHTS, scales_.size() == 1 ? 0 : 1 << 1);
      if (has_bias_) {
        // oneDNN scales the int32 sum, then adds the bias in float: the bias (an int32 multiple of x_scale *
        // w_scale[n], as the quantiser writes it) is scaled the same way.
        const Tensor* b = ctx.input_values.size() > 2 ? ctx.input_values[2] : nullptr;
        if (b == nullptr || b->dtype() != DType::kF32 || b->numel() != n) return false;
        std::vector<float> bias(static_cast<size_t>(n));
        for (int64_t c = 0; c < n; ++c) {
          const double step = static_cast<double>(x_scale_) * w_scale[w_scale.size() == 1 ? 0 : c];
          const double v = b->data<float>()[c], q = std::nearbyint(v / step);
          if (std::fabs(q) > 2e9 || std::fabs(q * step - v) > 1e-3 * step + 1e-6 * std::fabs(v)) return false;
          bias[c] = static_cast<float>(q) * scales_[scales_.size() == 1 ? 0 : c];
        }
        bias_ = Tensor::FromVector<float>({1, n}, bias);
        bias_md_ = memory::desc({1, n}, memory::data_type::f32, memory::format_tag::ab);
      }
      // Rows of B (A's columns) in pairs where the products are not exact; the primitive's K is then the slots'.
      slots_.clear();
      if (!exact) {
        std::vector<int8_t> by_row(wq.data<int8_t>(), wq.data<int8_t>() + k * n);
        slots_ = PairInputChannels(by_row, n);
        bool in_order = static_cast<int64_t>(slots_.size()) == k;
        for (int64_t r = 0; in_order && r < k; ++r) in_order = slots_[r] == r;
        if (in_order) {
          slots_.clear();
        } else {
          Tensor placed(DType::kI8, {static_cast<int64_t>(slots_.size()), n});
          for (size_t r = 0; r < slots_.size(); ++r)
            for (int64_t c = 0; c < n; ++c)
              placed.data<int8_t>()[r * n + c] = slots_[r] < 0 ? 0 : wq.data<int8_t>()[slots_[r] * n + c];
          wq = std::move(placed);
        }
      }
      const int64_t depth = slots_.empty() ? k : static_cast<int64_t>(slots_.size());
      w_md = memory::desc({depth, n}, memory::data_type::s8, memory::format_tag::any);
      // A constant B is 2-D: A's leading dims are rows.
      x_dims_ = {NumElements(x_) / k, depth};
      y_dims_ = {NumElements(x_) / k, n};
    }
    if (b_runtime_) {
      x_dims_ = ToDims(x_);
      y_dims_ = ToDims(y_);
    }
    if (zp_u8_ != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    const float lo = static_cast<float>((y_signed ? -128 : 0) - y_zp),
                hi = static_cast<float>((y_signed ? 127 : 255) - y_zp);
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_round, 0.f, 0.f);
    ops.append_eltwise(dnnl::algorithm::eltwise_clip, lo, hi);
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, y_scale, 0.f);
    attr.set_post_ops(ops);
    src_md_ = memory::desc(x_dims_, memory::data_type::u8, PlainDesc(x_dims_).get_strides());
    dst_md_ = memory::desc(y_dims_, memory::data_type::f32, PlainDesc(y_dims_).get_strides());
    try {
      dnnl::matmul::primitive_desc pd =
          has_bias_
              ? dnnl::matmul::primitive_desc(CpuEngine(), src_md_, w_md, bias_md_, dst_md_, attr, /*allow_empty=*/true)
              : dnnl::matmul::primitive_desc(CpuEngine(), src_md_, w_md, dst_md_, attr, /*allow_empty=*/true);
      if (pd && !IsReferenceImpl(pd)) pd_ = pd;
    } catch (const dnnl::error&) {
    }
    if (!pd_) return false;
    matmul_ = dnnl::matmul(pd_);
    if (b_runtime_) {
      b_md_ = w_md;
      b_bytes_ = ThreadScratch::Align(b_md_.get_size());
    } else {
      weight_ = PackWeight(ctx, memory::desc(ToDims(wq.shape()), memory::data_type::s8, memory::format_tag::ab), wq,
                           pd_.weights_desc());
    }
    src_bytes_ = ThreadScratch::Align(src_md_.get_size());
    scratch_md_ = pd_.scratchpad_desc();
    scratch_bytes_ = ThreadScratch::Align(scratch_md_.get_size());
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckShape(node, kName, "input", ctx.In(0), x_);
    if (b_runtime_) CheckShape(node, kName, "B", ctx.In(1), b_);
    CheckShape(node, kName, "output", ctx.Out(0), y_);
    RunDnnl(node, kName, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(src_bytes_ + b_bytes_ + scratch_bytes_);
      if (slots_.empty())
        Quantise(ctx.In(0).data<float>(), NumElements(x_), x_scale_, zp_u8_, false,
                 reinterpret_cast<uint8_t*>(scratch));
      else
        QuantiseGathered(ctx.In(0).data<float>(), reinterpret_cast<uint8_t*>(scratch));
      if (b_runtime_)
        Quantise(ctx.In(1).data<float>(), NumElements(b_), b_scale_, b_zp_u8_, true,
                 reinterpret_cast<uint8_t*>(scratch + src_bytes_));
      const auto run = run_states_.Acquire([this] { return MakeRunState(); });
      Point(run->src, scratch);
      if (b_runtime_) Point(run->weights, scratch + src_bytes_);
      Point(run->dst, ctx.Out(0).raw());
      Point(run->scratchpad, scratch + src_bytes_ + b_bytes_);
      run->args.Execute(matmul_, stream);
      stream.wait();
    });
  }

 private:
  struct RunState {
    memory src, weights, dst, scratchpad;
    ExecArgs args;
  };
  RunState MakeRunState() const {
    RunState r;
    r.src = UnboundMemory(src_md_);
    r.weights = b_runtime_ ? UnboundMemory(b_md_) : weight_.memory;
    r.dst = UnboundMemory(dst_md_);
    r.scratchpad = UnboundMemory(scratch_md_);
    r.args.Add(DNNL_ARG_SRC, r.src)
        .Add(DNNL_ARG_WEIGHTS, r.weights)
        .Add(DNNL_ARG_DST, r.dst)
        .Add(DNNL_ARG_SCRATCHPAD, r.scratchpad);
    if (has_bias_) r.args.Add(DNNL_ARG_BIAS, WrapMemory(bias_md_, bias_.raw()));
    r.args.Add(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS,
               WrapMemory(memory::desc({static_cast<memory::dim>(scales_.size())}, memory::data_type::f32,
                                       memory::format_tag::x),
                          scales_.data()));
    const memory::desc one({1}, memory::data_type::s32, memory::format_tag::x);
    if (zp_u8_ != 0) r.args.Add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, WrapMemory(one, &zp_u8_));
    if (b_runtime_ && b_zp_s8_ != 0)
      r.args.Add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_WEIGHTS, WrapMemory(one, &b_zp_s8_));
    return r;
  }

  // n floats -> u8 storage of QuantizeLinear(x, scale, zp_u8 - storage offset) (s8: the bytes XOR 0x80, the same
  // integer less 128), split over the plan's threads in whole cache lines when large enough to pay for it.
  void Quantise(const float* x, int64_t total, float scale, int32_t zp_u8, bool as_s8, uint8_t* out) const {
    const int64_t parts = total >= (1 << 15) ? threads_ : 1;
    const int64_t step = (total / parts + 63) / 64 * 64;
#pragma omp parallel for num_threads(threads_) schedule(static) if (parts > 1)
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t j0 = std::min(total, part * step), j1 = std::min(total, j0 + step);
      QuantiseU8(x + j0, out + j0, j1 - j0, scale, static_cast<float>(zp_u8));
      if (as_s8)
        for (int64_t j = j0; j < j1; ++j) out[j] ^= 0x80;
    }
  }

  // Each row of A quantised, then placed in the slots' order (an empty slot: the zero point, times zero weights); one
  // row buffer per thread.
  void QuantiseGathered(const float* x, uint8_t* out) const {
    const int64_t k = x_.back(), rows = NumElements(x_) / k, depth = static_cast<int64_t>(slots_.size());
    const int parts = threads_ > 1 && rows * k >= (1 << 15) ? threads_ : 1;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int part = 0; part < parts; ++part) {
      std::vector<uint8_t> row(static_cast<size_t>(k) + 1, static_cast<uint8_t>(zp_u8_));  // [k]: the zero point
      for (int64_t r = rows * part / parts; r < rows * (part + 1) / parts; ++r) {
        QuantiseU8(x + r * k, row.data(), k, x_scale_, static_cast<float>(zp_u8_));
        uint8_t* o = out + r * depth;
        for (int64_t s = 0; s < depth; ++s) o[s] = row[slots_[s] < 0 ? k : slots_[s]];
      }
    }
  }

  Shape x_, b_, y_;
  std::vector<int32_t> slots_;    // B's rows (A's columns) per slot where paired (empty: in order)
  memory::dims x_dims_, y_dims_;  // as the primitive sees them (a constant B: A's leading dims folded into rows)
  bool b_runtime_ = false, has_bias_ = false;
  Tensor bias_;  // [1, N], in output steps (has_bias_)
  int threads_ = 1;
  float x_scale_ = 1.f, b_scale_ = 1.f;
  int32_t zp_u8_ = 0, b_zp_u8_ = 0, b_zp_s8_ = 0;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul matmul_;
  memory::desc src_md_, b_md_, dst_md_, bias_md_, scratch_md_;
  PackedWeight weight_;
  std::vector<float>
      scales_;  // per column (or one): x_scale * w_scale[n] / y_scale (B at run time: x_scale * b_scale / y_scale)
  size_t src_bytes_ = 0, b_bytes_ = 0, scratch_bytes_ = 0;
  PerCaller<RunState> run_states_;
};

}  // namespace

}  // namespace osprey::cpu

namespace osprey {

bool Int8MatMulOfActivationsFast() {
  static const bool fast = [] {
    if (!Int8ProductsExact()) return false;
    try {
      dnnl::primitive_attr attr = cpu::BaseAttr();
      attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
      attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
      attr.set_zero_points_mask(DNNL_ARG_WEIGHTS, 0);
      const dnnl::memory::desc a({2, 64, 32}, dnnl::memory::data_type::u8, dnnl::memory::format_tag::abc);
      const dnnl::memory::desc b({2, 32, 64}, dnnl::memory::data_type::s8, dnnl::memory::format_tag::abc);
      const dnnl::memory::desc y({2, 64, 64}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::abc);
      dnnl::matmul::primitive_desc pd(cpu::CpuEngine(), a, b, y, attr, /*allow_empty=*/true);
      return pd && !cpu::IsReferenceImpl(pd);
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return fast;
}

}  // namespace osprey

namespace osprey::cpu {

std::unique_ptr<Kernel> CreateDnnlMatMulInt8(const KernelBuildContext& ctx) {
  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<MatMulInt8Kernel>();
  try {
    if (!kernel->Build(ctx)) return nullptr;
  } catch (const dnnl::error&) {
    return nullptr;
  }
  return kernel;
}

}  // namespace osprey::cpu
