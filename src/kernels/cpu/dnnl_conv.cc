// Conv (1-D, 2-D, 3-D) on oneDNN: groups and depthwise, strides, dilations, asymmetric and auto pads, bias, and the
// fused residual add, activation, PRelu and 3x3 depthwise convolution of docs/architecture.md as post-ops (a last
// SiLU the kernel applies itself, OwnSilu). 2-D convolutions also read and write channels-last (NHWC) activations when
// the runtime's layout pass asks for them (KernelBuildContext layouts).
#include "kernels/cpu/dnnl_conv.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/depthwise_conv.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/pointwise_conv.h"
#include "kernels/cpu/stem_conv.h"
#include "kernels/cpu/winograd_conv.h"
#include "ops/activation.h"
#include "ops/conv_input_scale.h"
#include "ops/conv_window.h"
#include "ops/fused_depthwise.h"
#include "ops/fused_pool.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;
constexpr const char* kConvName = "ConvF32Dnnl";
constexpr const char* kConvBf16Name = "ConvBf16Dnnl";

struct ConvGeometry {
  Shape x, w, y;  // y: the convolution's output (with a fused depthwise convolution, the pointwise part's)
  Shape x_logical, y_logical;  // the node's input and output shapes (x, w, y, out may have H and W swapped: below)
  int64_t group = 1;
  memory::dims strides, dilates, pad_l, pad_r;  // oneDNN conventions: dilation d is passed as d - 1
  // A fused depthwise convolution (ops/fused_depthwise.h): its stride (0: none), begin pad and the node's output.
  int64_t dw_stride = 0, dw_pad = 1;
  Shape out;
};

// Fills `g` from the node and shapes; false for anything this kernel does not take (the schema has already
// rejected malformed nodes, so a mismatch here just means "let the reference kernel handle it").
bool ComputeGeometry(const KernelBuildContext& ctx, ConvGeometry& g) {
  const Node& node = ctx.node;
  if (ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1) return false;
  g.x = JoinedInputShape(node, ctx.input_shapes);
  g.w = ctx.input_shapes[1];
  g.y = g.out = ctx.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(g.x.size());
  if (rank < 3 || rank > 5 || static_cast<int64_t>(g.w.size()) != rank || static_cast<int64_t>(g.y.size()) != rank)
    return false;
  const int64_t spatial = rank - 2;
  if (HasFusedDepthwise(node)) {
    // oneDNN's depthwise post-op: 3x3, pads 1, equal strides of 1 or 2, after a 2-D convolution; the shape rule has
    // checked the rest. g.y becomes the pointwise part's output.
    const std::vector<int64_t> dw_strides = node.GetInts("_dw_strides");
    if (rank != 4 || dw_strides.size() != 2 || dw_strides[0] != dw_strides[1] || dw_strides[0] < 1 ||
        dw_strides[0] > 2 || ctx.input_shapes.size() <= kDwWeightInput)
      return false;
    g.dw_stride = dw_strides[0];
    const std::vector<int64_t> dw_pads = node.GetInts("_dw_pads", {1, 1, 1, 1});
    if (dw_pads.size() != 4 || dw_pads[0] != dw_pads[1] || dw_pads[0] < 0 || dw_pads[0] > 1) return false;
    g.dw_pad = dw_pads[0];
    std::vector<int64_t> kernel(g.w.begin() + 2, g.w.end());
    const std::vector<int64_t> pointwise =
        ResolveConvWindow(FusedPointwisePart(node), g.x, kernel, /*ceil_mode=*/false).out;
    g.y = {g.x[0], g.w[0], pointwise[0], pointwise[1]};
  }
  if (HasFusedPool(node)) {  // only osprey's first-layer kernel runs it (ChooseConvKernel); g.y is the convolution's
    if (rank != 4 || HasFusedDepthwise(node)) return false;
    g.y = FusedConvOutputShape(node, g.x, g.w);
  }
  g.group = node.GetInt("group", 1);
  const int64_t in_c = g.x[1], out_c = g.w[0];
  if (g.group <= 0 || in_c % g.group != 0 || out_c % g.group != 0 || g.w[1] * g.group != in_c) return false;
  if (g.y[0] != g.x[0] || g.y[1] != out_c) return false;
  for (int64_t d : g.x)
    if (d <= 0) return false;
  for (int64_t d : g.w)
    if (d <= 0) return false;

  std::vector<int64_t> kernel = node.GetInts("kernel_shape", std::vector<int64_t>(g.w.begin() + 2, g.w.end()));
  if (kernel != std::vector<int64_t>(g.w.begin() + 2, g.w.end())) return false;
  const ConvWindow win = ResolveConvWindow(node, g.x, kernel, /*ceil_mode=*/false);
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = g.x[2 + i], s = win.strides[i], d = win.dilations[i];
    const int64_t k_eff = win.EffectiveKernel(i);
    const int64_t pl = win.pad_begin[i], pr = win.pad_end[i];
    if (pl < 0 || pr < 0) return false;
    const int64_t span = in + pl + pr - k_eff;
    if (span < 0 || span / s + 1 != g.y[2 + i]) return false;
    g.strides.push_back(s);
    g.dilates.push_back(d - 1);
    g.pad_l.push_back(pl);
    g.pad_r.push_back(pr);
  }
  g.x_logical = g.x;
  g.y_logical = g.out;
  // A 2-D convolution along H only (W = 1 throughout: a 1-D convolution written as [N, C, L, 1], as JAX/TF exports
  // do) runs as the same convolution along W. [N, C, 1, L] is the same memory as [N, C, L, 1] in both layouts, as are
  // the weights [M, C, 1, k] and [M, C, k, 1], and oneDNN's kernels block along W: magika's 256 -> 512 5x1
  // convolution over 512 rows took 6.2 ms as it was and 3.1 ms swapped (docs/performance.md, "Twentieth session").
  if (rank == 4 && g.dw_stride == 0 && !HasFusedPool(node) && g.x[3] == 1 && g.w[3] == 1 && g.y[3] == 1 &&
      g.pad_l[1] == 0 && g.pad_r[1] == 0 && g.x[2] > 1) {
    for (Shape* t : {&g.x, &g.w, &g.y, &g.out}) std::swap((*t)[2], (*t)[3]);
    for (memory::dims* t : {&g.strides, &g.dilates, &g.pad_l, &g.pad_r}) std::swap((*t)[0], (*t)[1]);
  }
  return true;
}

memory::desc WeightDesc(const ConvGeometry& g, bool plain, memory::data_type type = memory::data_type::f32) {
  memory::dims dims = ToDims(g.w);
  if (g.group > 1) {
    dims[0] = g.w[0] / g.group;
    dims.insert(dims.begin(), g.group);  // [g, M/g, C/g, k...]: same bytes as ONNX's [M, C/g, k...]
  }
  if (plain) return PlainDesc(dims);
  return memory::desc(dims, type, memory::format_tag::any);
}

// Tag for a channels-last layout of the given rank.
memory::format_tag ChannelsLastTag(size_t rank) {
  switch (rank) {
    case 3:
      return memory::format_tag::nwc;
    case 4:
      return memory::format_tag::nhwc;
    default:
      return memory::format_tag::ndhwc;
  }
}

// Whether the kernel applies the node's last activation itself (SiluInPlace, after the primitive) instead of as a
// oneDNN post-op: SiLU where the fast pass exists, ~2.3x cheaper than oneDNN's swish post-op per element (a 1x1
// 16 -> 96 convolution on 112x112: 0.20 ms + 0.20 ms against 0.64 ms with the post-op, 2 threads). The last
// activation is the depthwise part's for a node with one fused (ops/fused_depthwise.h); the pointwise part's stays a
// post-op, since the depthwise convolution reads it inside the primitive.
bool OwnSilu(const Node& node, const ConvGeometry& g) {
  return OwnSiluActivation(g.dw_stride > 0 ? FusedDepthwisePart(node, g.w[0]) : node);
}

// Whether the kernel applies the node's activation itself after the primitive: OwnSilu, and any activation of a
// convolution on plain tensors (oneDNN's GEMM convolution, which ChooseLayout takes for plain 1x1 layers, applies
// post-ops in a scalar pass: a 1x1 128 -> 128 Conv1d on 8 x 1000 samples 2.2 ms, with its Relu 4.0 ms through the
// reorders to nwc, 2.3 ms with the Relu applied here).
bool OwnActivation(const Node& node, const ConvGeometry& g, ConvLayout layout) {
  if (OwnSilu(node, g)) return true;
  Activation act;
  return layout == ConvLayout::kPlain && g.dw_stride == 0 && !HasFusedPRelu(node) &&
         Activation::FromFusedNode(node, &act) && act.kind != ActivationKind::kNone;
}

// The convolution primitive for `layout` with the node's post-ops, or an empty descriptor when a needed piece is
// missing (run-time weight, odd bias or residual) or oneDNN offers only a reference implementation. Shared by the
// factory and the channels-last support test, so the two agree. With `bf16` the primitive reads bf16 source and
// weights (fp32 accumulation, fp32 bias and destination); the kernel reorders its fp32 input to bf16 per run.
dnnl::convolution_forward::primitive_desc MakeConvPd(const KernelBuildContext& ctx, const ConvGeometry& g,
                                                     ConvLayout layout, bool bf16 = false) {
  const Node& node = ctx.node;
  const bool has_bias = ctx.present.size() > 2 && ctx.present[2];
  const bool residual = node.GetInt("_residual", 0) != 0;
  if (has_bias && ctx.input_shapes[2] != Shape{g.w[0]}) return {};
  if (residual && (ctx.present.size() < 4 || !ctx.present[3] || ctx.input_shapes[3] != g.y_logical)) return {};
  const Tensor* weight = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
  if (weight == nullptr || weight->raw() == nullptr) return {};  // prepacking needs the weight now

  const memory::data_type src_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory::desc src_md, dst_md;
  switch (layout) {
    case ConvLayout::kPlain:
      src_md = WithDataType(PlainDesc(ToDims(g.x)), src_type);
      dst_md = PlainDesc(ToDims(g.y));
      break;
    case ConvLayout::kChannelsLast:
      src_md = memory::desc(ToDims(g.x), src_type, ChannelsLastTag(g.x.size()));
      dst_md = memory::desc(ToDims(g.y), memory::data_type::f32, ChannelsLastTag(g.y.size()));
      break;
    case ConvLayout::kPreferred:
      src_md = memory::desc(ToDims(g.x), src_type, memory::format_tag::any);
      dst_md = memory::desc(ToDims(g.y), memory::data_type::f32, memory::format_tag::any);
      break;
  }
  // oneDNN 3.2's fused depthwise kernel crashes (segfault in its JIT code) when the pointwise convolution has no
  // bias: the kernel then passes zeros.
  const memory::desc bias_md = has_bias || g.dw_stride > 0 ? PlainDesc({g.w[0]}) : memory::desc();
  // The residual joins before the activation as a sum post-op: the residual is first copied (same layout) or
  // reordered (any other layout) into the destination buffer. A binary-add post-op reading the residual tensor
  // directly would save that copy, but oneDNN 2.6 runs it only in its im2col+GEMM convolution and applies it there
  // elementwise without vectorising: measured 23 ms instead of 0.8 ms for a 1x1 64->256 conv on 56x56 with residual
  // and Relu.
  dnnl::primitive_attr attr = BaseAttr();
  dnnl::post_ops ops;
  if (residual) ops.append_sum(1.f);
  const bool own_silu = OwnSilu(node, g);
  if (!(g.dw_stride == 0 && OwnActivation(node, g, layout)) && !AppendFusedActivation(node, ops)) return {};
  if (HasFusedPRelu(node)) {
    // Slopes per output channel (mask: dimension 1) or one for all (mask 0); known now, as the weight is.
    const Tensor* slopes = ctx.input_values.size() > kPReluSlopeInput ? ctx.input_values[kPReluSlopeInput] : nullptr;
    if (slopes == nullptr || slopes->raw() == nullptr || g.dw_stride > 0 || own_silu) return {};
    if (slopes->numel() != 1 && slopes->numel() != g.w[0]) return {};
    ops.append_prelu(slopes->numel() == 1 ? 0 : 1 << 1);
  }
  if (g.dw_stride > 0) {
    // The depthwise convolution runs on the activated output rows as they are made, then its own activation.
    const Tensor* dw_weight = ctx.input_values.size() > kDwWeightInput ? ctx.input_values[kDwWeightInput] : nullptr;
    if (bf16 || residual || dw_weight == nullptr || dw_weight->raw() == nullptr) return {};
    const bool dw_bias = ctx.present.size() > kDwBiasInput && ctx.present[kDwBiasInput];
    const Tensor* dw_bias_value = dw_bias ? ctx.input_values[kDwBiasInput] : nullptr;
    if (dw_bias && (dw_bias_value == nullptr || dw_bias_value->raw() == nullptr)) return {};
    ops.append_dw(memory::data_type::f32, memory::data_type::f32, memory::data_type::f32, 3, g.dw_stride, g.dw_pad);
    if (!own_silu && !AppendFusedActivation(FusedDepthwisePart(node, g.w[0]), ops)) return {};
  }
  attr.set_post_ops(ops);
  dnnl::convolution_forward::primitive_desc pd(
      CpuEngine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
      WeightDesc(g, false, src_type), bias_md, dst_md, g.strides, g.dilates, g.pad_l, g.pad_r, attr,
      /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return {};
  // oneDNN derives the depthwise part's end pads from its begin pad; the output must be the node's.
  if (g.dw_stride > 0 && pd.dst_desc().get_dims() != ToDims(g.out)) return {};
  return pd;
}

std::string ConvTuningKey(const KernelBuildContext& ctx, const ConvGeometry& g, ConvLayout layout) {
  std::string key;
  auto put_dims = [&key](const auto& dims) {
    for (auto d : dims) key += std::to_string(d) + ",";
    key += ";";
  };
  key += TuningActivationKey(g.x);  // images x pixels by size class (dnnl_common.h)
  put_dims(g.w);
  key += TuningActivationKey(g.y);
  put_dims(g.strides);
  put_dims(g.dilates);
  put_dims(g.pad_l);
  put_dims(g.pad_r);
  key += std::to_string(g.group) + ";" + std::to_string(static_cast<int>(layout)) + ";" +
         std::to_string(ctx.num_threads) + ";" + std::to_string(ctx.present.size() > 2 && ctx.present[2]) + ";" +
         std::to_string(ctx.node.GetInt("_residual", 0)) + ";" + ctx.node.GetString("_activation", "") + ";" +
         std::to_string(ctx.node.GetFloat("_alpha", 0.f)) + ";" + std::to_string(ctx.node.GetFloat("_beta", 0.f));
  if (OwnSilu(ctx.node, g)) key += ";own-silu";
  if (HasFusedPRelu(ctx.node)) key += ";prelu" + std::to_string(ctx.input_shapes[kPReluSlopeInput][0]);
  if (g.dw_stride > 0)
    key += ";dw" + std::to_string(g.dw_stride) + ";" + std::to_string(g.dw_pad) + ";" +
           ctx.node.GetString("_dw_activation", "") + ";" + std::to_string(ctx.node.GetFloat("_dw_alpha", 0.f)) + ";" +
           std::to_string(ctx.node.GetFloat("_dw_beta", 0.f));
  return key;
}

// ScaleInputChannels (ops/conv_input_scale.h) on rows [row_begin, row_end), vectorised for the widest ISA here.
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScaleInputRows(const float* x, const float* scale,
                                                                                 float* y, int64_t batch,
                                                                                 int64_t channels, int64_t spatial,
                                                                                 bool nhwc, int64_t scale_batch,
                                                                                 int64_t row_begin, int64_t row_end) {
  ScaleInputChannels(x, scale, y, batch, channels, spatial, nhwc, scale_batch, row_begin, row_end);
}

// User tensors (input 0, residual input 3, output 0) are plain or NHWC as the build context says; the primitive
// works in `layout`, and reorders bridge any difference. With NHWC tensors and kChannelsLast there are none.
class DnnlConvKernel final : public Kernel {
 public:
  const char* Name() const override { return name_; }

  // Returns false when oneDNN only offers a reference implementation or a needed piece is missing. `layout` is for a
  // float32 primitive; with ctx.bf16 a bf16 one replaces it where oneDNN has a fast one and, for
  // Bf16Use::kIfFaster, where it is faster and agrees (PreferBf16).
  bool Build(const KernelBuildContext& ctx, const ConvGeometry& g, ConvLayout layout) {
    // A bf16 primitive reorders a float32 input anyway, so it may as well pick its layout (unless all are NHWC).
    const ConvLayout bf16_layout = layout == ConvLayout::kChannelsLast ? layout : ConvLayout::kPreferred;
    src_layout_ = ctx.InLayout(0);
    dst_layout_ = ctx.OutLayout(0);
    user_src_md_ = ActivationDesc(g.x, src_layout_);
    user_dst_md_ = ActivationDesc(g.out, dst_layout_);
    dnnl::convolution_forward::primitive_desc bf16_pd;
    if (ctx.bf16 != Bf16Use::kNo && g.dw_stride == 0) {
      const std::string key = "conv-bf16:" + ConvTuningKey(ctx, g, bf16_layout);
      bf16_pd = TryBf16([&] {
        return FastestImpl<dnnl::convolution_forward::primitive_desc>(
            ctx, [&] { return MakeConvPd(ctx, g, bf16_layout, /*bf16=*/true); }, key);
      });
    }
    if (bf16_pd && ctx.bf16 == Bf16Use::kYes) {
      pd_ = bf16_pd;
      name_ = kConvBf16Name;
    }
    if (!pd_) {
      pd_ = FastestImpl<dnnl::convolution_forward::primitive_desc>(ctx, [&] { return MakeConvPd(ctx, g, layout); },
                                                                   "conv:" + ConvTuningKey(ctx, g, layout));
    }
    if (bf16_pd && ctx.bf16 == Bf16Use::kIfFaster &&
        (!pd_ || TryBf16([&] {
          return PreferBf16(ConvTuningKey(ctx, g, layout) + "|" + std::to_string(static_cast<int>(bf16_layout)) + "|" +
                                name_,
                            pd_, bf16_pd, user_src_md_, user_dst_md_, WeightDesc(g, true), ctx.input_values[1]->raw());
        }))) {
      pd_ = bf16_pd;
      name_ = kConvBf16Name;
    }
    if (!pd_) return false;
    x_shape_ = g.x_logical;
    y_shape_ = g.y_logical;
    if (OwnActivation(ctx.node, g, name_ == kConvBf16Name ? bf16_layout : layout))
      Activation::FromFusedNode(g.dw_stride > 0 ? FusedDepthwisePart(ctx.node, g.w[0]) : ctx.node, &own_activation_);
    num_threads_ = ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
    has_bias_ = ctx.present.size() > 2 && ctx.present[2];
    if (g.dw_stride > 0 && !has_bias_) zero_bias_.assign(static_cast<size_t>(g.w[0]), 0.f);  // see MakeConvPd
    residual_ = ctx.node.GetInt("_residual", 0) != 0;
    residual_layout_ = residual_ ? ctx.InLayout(3) : Layout::kPlain;
    if (HasInputScale(ctx.node)) {  // the input times its gate, in a pass before the primitive (its own scratch)
      if (ctx.input_shapes.size() <= kInputScaleInput || !ctx.present[kInputScaleInput] ||
          ctx.InLayout(kInputScaleInput) != Layout::kPlain)
        return false;
      scale_batch_ = ctx.input_shapes[kInputScaleInput][0];
      scaled_bytes_ = ThreadScratch::Align(user_src_md_.get_size());
    }
    user_residual_md_ = ActivationDesc(g.y, residual_layout_);
    bias_md_ = has_bias_ || !zero_bias_.empty() ? PlainDesc({g.w[0]}) : memory::desc();
    conv_dst_md_ = pd_.dst_desc();
    conv_src_md_ = pd_.src_desc();
    conv_ = dnnl::convolution_forward(pd_);

    weight_ = PackWeight(ctx, WeightDesc(g, true), *ctx.input_values[1], pd_.weights_desc());
    if (g.dw_stride > 0) {
      const int64_t channels = g.w[0];
      dw_weight_ = PackWeight(ctx, PlainDesc({channels, 1, 1, 3, 3}), *ctx.input_values[kDwWeightInput],
                              pd_.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS));
      dw_bias_.assign(static_cast<size_t>(channels), 0.f);
      if (ctx.present.size() > kDwBiasInput && ctx.present[kDwBiasInput]) {
        const float* b = ctx.input_values[kDwBiasInput]->data<float>();
        std::copy(b, b + channels, dw_bias_.begin());
      }
      dw_bias_md_ = pd_.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
      if (dw_bias_md_.get_size() != dw_bias_.size() * sizeof(float)) return false;
      fused_dw_ = true;
    }
    if (HasFusedPRelu(ctx.node)) {  // MakeConvPd has checked the slopes
      const Tensor& slopes = *ctx.input_values[kPReluSlopeInput];
      prelu_slopes_.assign(slopes.data<float>(), slopes.data<float>() + slopes.numel());
      const dnnl::post_ops ops = pd_.get_primitive_attr().get_post_ops();
      prelu_post_op_ = -1;
      for (int i = 0; i < ops.len(); ++i)
        if (ops.kind(i) == dnnl::primitive::kind::prelu) prelu_post_op_ = i;
      if (prelu_post_op_ < 0) return false;
    }

    reorder_src_ = conv_src_md_ != user_src_md_;
    reorder_dst_ = conv_dst_md_ != user_dst_md_;
    auto make_reorder = [&](const memory::desc& from, const memory::desc& to) {
      dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, BaseAttr());
      reorder_scratch_bytes_ = std::max(reorder_scratch_bytes_, ScratchpadBytes(pd));
      return dnnl::reorder(pd);
    };
    if (reorder_src_) src_reorder_ = make_reorder(user_src_md_, conv_src_md_);
    if (reorder_dst_) dst_reorder_ = make_reorder(conv_dst_md_, user_dst_md_);
    if (residual_) residual_reorder_ = make_reorder(user_residual_md_, conv_dst_md_);
    reorder_scratch_md_ = memory::desc({static_cast<int64_t>(std::max<size_t>(reorder_scratch_bytes_, 1))},
                                       memory::data_type::u8, memory::format_tag::x);
    reorder_scratch_bytes_ = ThreadScratch::Align(reorder_scratch_bytes_);
    src_bytes_ = reorder_src_ ? ThreadScratch::Align(conv_src_md_.get_size()) : 0;
    dst_bytes_ = reorder_dst_ ? ThreadScratch::Align(conv_dst_md_.get_size()) : 0;
    scratch_md_ = pd_.scratchpad_desc();
    scratch_bytes_ = ThreadScratch::Align(scratch_md_.get_size());
    return true;
  }

  /// The oneDNN implementation chosen, e.g. "brgconv:avx512_core" (for tests and measurements).
  const char* Implementation() const { return pd_.impl_info_str(); }
  const dnnl::convolution_forward::primitive_desc& Pd() const { return pd_; }

  // The residual's buffer may become the output's (the add in place): the primitive then sums onto it directly.
  bool MayOverwriteInput(int i) const override {
    return i == 3 && residual_ && !reorder_dst_ && user_residual_md_ == conv_dst_md_;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckActivation(node, name_, "input", ctx.In(0), x_shape_, src_layout_);
    CheckActivation(node, name_, "output", ctx.Out(0), y_shape_, dst_layout_);
    if (residual_) CheckActivation(node, name_, "residual", ctx.In(3), y_shape_, residual_layout_);
    if (scaled_bytes_ > 0)
      CheckShape(node, name_, "input scale", ctx.In(kInputScaleInput), {scale_batch_, x_shape_[1], 1, 1});
    // The primitive writes its destination from the residual already there (sum post-op). When the runtime runs the
    // add in place (residual and output share a buffer) the residual is there already, provided both use one layout.
    const void* residual = residual_ ? ctx.In(3).raw() : nullptr;
    const bool residual_in_place = residual_ && !reorder_dst_ && residual == ctx.Out(0).raw();
    if (residual_in_place && user_residual_md_ != conv_dst_md_)
      throw Error(ErrorCode::kInternal, node.Describe() + ": " + name_ +
                                            " cannot add a residual in place when it and the output differ in layout");
    RunDnnl(node, name_, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch =
          ThreadScratch::Reserve(src_bytes_ + dst_bytes_ + scratch_bytes_ + reorder_scratch_bytes_ + scaled_bytes_);
      const void* x = ctx.In(0).raw();
      if (scaled_bytes_ > 0) {
        float* scaled =
            reinterpret_cast<float*>(scratch + src_bytes_ + dst_bytes_ + scratch_bytes_ + reorder_scratch_bytes_);
        const float* xd = ctx.In(0).data<float>();
        const float* sd = ctx.In(kInputScaleInput).data<float>();
        const int64_t n = x_shape_[0], c = x_shape_[1], spatial = x_shape_[2] * x_shape_[3];
        const bool nhwc = src_layout_ == Layout::kNhwc;
        const int64_t rows = InputScaleRows(n, c, spatial, nhwc);
#pragma omp parallel num_threads(num_threads_) if (n * c * spatial >= (int64_t{1} << 14))
        {
          const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
          ScaleInputRows(xd, sd, scaled, n, c, spatial, nhwc, scale_batch_, rows * t / threads,
                         rows * (t + 1) / threads);
        }
        x = scaled;
      }
      const auto run = runs_.Acquire([this] { return MakeRunState(); });
      run->io.Point(x, ctx.Out(0).raw(), scratch, src_bytes_, dst_bytes_, scratch_bytes_);
      if (has_bias_) Point(run->bias, ctx.In(2).raw());
      if (reorder_src_) run->io.src_reorder.Execute(src_reorder_, stream);
      // Same layout: a (parallel) copy; otherwise a reorder into the layout the primitive writes.
      if (residual_ && !residual_in_place) {
        Point(run->residual, residual);
        run->residual_reorder.Execute(residual_reorder_, stream);
      }
      run->conv.Execute(conv_, stream);
      if (reorder_dst_) run->io.dst_reorder.Execute(dst_reorder_, stream);
      stream.wait();
    });
    ActivateInPlace(own_activation_, ctx.Out(0).data<float>(), NumElements(y_shape_), num_threads_);
  }

 private:
  // The memories and argument arrays of one run (one set per concurrent caller, PerCaller).
  struct RunState {
    ReorderedIo io;
    memory bias, residual;
    ExecArgs conv, residual_reorder;
  };
  RunState MakeRunState() const {
    RunState r{ReorderedIo(user_src_md_, conv_src_md_, user_dst_md_, conv_dst_md_, scratch_md_, reorder_scratch_md_),
               {}, {}, {}, {}};
    r.conv.Add(DNNL_ARG_SRC, r.io.src)
        .Add(DNNL_ARG_WEIGHTS, weight_.memory)
        .Add(DNNL_ARG_DST, r.io.dst)
        .Add(DNNL_ARG_SCRATCHPAD, r.io.scratchpad);
    if (has_bias_) r.conv.Add(DNNL_ARG_BIAS, r.bias = UnboundMemory(bias_md_));
    if (!zero_bias_.empty()) r.conv.Add(DNNL_ARG_BIAS, WrapMemory(bias_md_, zero_bias_.data()));
    if (fused_dw_) {
      r.conv.Add(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, dw_weight_.memory);
      r.conv.Add(DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS, WrapMemory(dw_bias_md_, dw_bias_.data()));
    }
    if (!prelu_slopes_.empty())
      r.conv.Add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(prelu_post_op_) | DNNL_ARG_WEIGHTS,
                 WrapMemory(PlainDesc({static_cast<int64_t>(prelu_slopes_.size())}), prelu_slopes_.data()));
    if (residual_) {
      r.residual = UnboundMemory(user_residual_md_);
      r.residual_reorder.Add(DNNL_ARG_FROM, r.residual).Add(DNNL_ARG_TO, r.io.dst).Add(DNNL_ARG_SCRATCHPAD,
                                                                                      r.io.reorder_scratchpad);
    }
    return r;
  }

  const char* name_ = kConvName;
  Shape x_shape_, y_shape_;
  bool has_bias_ = false, residual_ = false;
  Activation own_activation_;  // the last activation, applied after the primitive (OwnActivation); kNone: a post-op
  int num_threads_ = 1;
  bool reorder_src_ = false, reorder_dst_ = false;
  Layout src_layout_ = Layout::kPlain, dst_layout_ = Layout::kPlain, residual_layout_ = Layout::kPlain;
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward conv_;
  dnnl::reorder src_reorder_, dst_reorder_, residual_reorder_;
  memory::desc user_src_md_, user_dst_md_, user_residual_md_, conv_src_md_, conv_dst_md_, bias_md_, scratch_md_,
      reorder_scratch_md_;
  PackedWeight weight_;
  // A fused depthwise convolution's packed weights and bias (zeros when the node has none).
  bool fused_dw_ = false;
  PackedWeight dw_weight_;
  std::vector<float> dw_bias_, zero_bias_;
  memory::desc dw_bias_md_;
  // A fused PRelu's slopes ([C] or [1]) and the index of its post-op.
  std::vector<float> prelu_slopes_;
  int prelu_post_op_ = -1;
  size_t src_bytes_ = 0, dst_bytes_ = 0, scratch_bytes_ = 0, reorder_scratch_bytes_ = 0;
  // A fused input scale (ops/conv_input_scale.h): the scaled input's bytes in the scratch (0: none), the scale's
  // images.
  size_t scaled_bytes_ = 0;
  int64_t scale_batch_ = 1;
  PerCaller<RunState> runs_;
};

// A fused input affine or parts: every part, the residual and the output channels-last, the rest plain.
bool FusedInputLayouts(const KernelBuildContext& ctx) {
  for (size_t i = 0; i < ctx.input_layouts.size(); ++i) {
    const bool part = i == 0 || (HasInputParts(ctx.node) && i >= static_cast<size_t>(kInputPartsInput));
    if (ctx.present.size() > i && ctx.present[i] &&
        ctx.input_layouts[i] != (part || i == 3 ? Layout::kNhwc : Layout::kPlain))
      return false;
  }
  return ctx.output_layouts.size() == 1 && ctx.output_layouts[0] == Layout::kNhwc;
}

// Channels-last tensors exist only for rank-4 and rank-5 float32 activations, and only on input 0, the residual and
// output 0.
bool LayoutsAreSupportedShape(const KernelBuildContext& ctx) {
  for (size_t i = 0; i < ctx.input_layouts.size(); ++i)
    if (ctx.input_layouts[i] != Layout::kPlain && i != 0 && i != 3) return false;
  for (size_t i = 1; i < ctx.output_layouts.size(); ++i)
    if (ctx.output_layouts[i] != Layout::kPlain) return false;
  return ctx.input_shapes.size() >= 2 && ChannelsLastRank(ctx.input_shapes[0].size());
}

// The shapes and window of a 2-D convolution `g` (oneDNN's conventions) in osprey's own kernels' terms.
void FillOwnConvShape(const ConvGeometry& g, OwnConvGeometry* own) {
  own->batch = g.x[0];
  own->in_c = g.x[1];
  own->in_h = g.x[2];
  own->in_w = g.x[3];
  own->out_c = g.w[0];
  own->out_h = g.y[2];
  own->out_w = g.y[3];
  own->kernel_h = g.w[2];
  own->kernel_w = g.w[3];
  own->stride_h = g.strides[0];
  own->stride_w = g.strides[1];
  own->dilation_h = g.dilates[0] + 1;
  own->dilation_w = g.dilates[1] + 1;
  own->pad_top = g.pad_l[0];
  own->pad_left = g.pad_l[1];
}

// The geometry of a 2-D, ungrouped, undilated float32 convolution without a PRelu or fused depthwise part, as
// osprey's own kernels take it (own_conv.h); empty for any other, and where bf16 is asked for without timing
// (Bf16Use::kYes). Where bf16 is allowed if faster, osprey's fp32 kernels compete with oneDNN's kernel where that
// one's fp32 form was timed faster than its bf16 form (OwnOrDirect): on a CPU whose bf16 is slow (AVX512_BF16 without
// AMX), --precision auto then runs what fp32 runs instead of oneDNN's fp32 kernels alone (ResNet-50 ~12% slower).
std::optional<OwnConvGeometry> OwnConvGeometryOf(const KernelBuildContext& ctx, const ConvGeometry& g) {
  OwnConvGeometry own;
  if (ctx.bf16 == Bf16Use::kYes || g.x.size() != 4 || g.group != 1 || g.dw_stride > 0 || HasFusedPRelu(ctx.node) ||
      g.dilates != memory::dims{0, 0} || !Activation::FromFusedNode(ctx.node, &own.activation))
    return std::nullopt;
  FillOwnConvShape(g, &own);
  if (HasFusedPool(ctx.node)) {
    const std::vector<int64_t> kernel = ctx.node.GetInts("_pool_kernel"), strides = ctx.node.GetInts("_pool_strides"),
                               pads = ctx.node.GetInts("_pool_pads");
    if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 || g.out.size() != 4) return std::nullopt;
    own.pool_kh = kernel[0];
    own.pool_kw = kernel[1];
    own.pool_sh = strides[0];
    own.pool_sw = strides[1];
    own.pool_top = pads[0];
    own.pool_left = pads[1];
    own.pooled_h = g.out[2];
    own.pooled_w = g.out[3];
  }
  own.bias = ctx.present.size() > 2 && ctx.present[2];
  own.residual = ctx.node.GetInt("_residual", 0) != 0;
  own.input_scale = HasInputScale(ctx.node);
  own.input_affine = HasInputAffine(ctx.node);
  own.input_relu = ctx.node.GetInt("_input_relu", 0) != 0;
  if (HasInputParts(ctx.node)) own.input_parts = ctx.node.GetInts("_input_parts");
  return own;
}

// osprey's Winograd F(4x4, 3x3) (winograd_conv.cc) instead of oneDNN's direct convolution, for 3x3 stride-1
// undilated dense float32 convolutions on channels-last tensors with channel counts multiples of 16. It wins where
// there are enough channels (ResNet-50's 3x3 layers at batch 8: 1.5-2.2x; 64 -> 128 on 28x28 at batch 1: 2.2x) and
// loses where there are few (32 -> 32 on 112x112: 1.9x slower; its transforms move more bytes than the direct
// convolution computes) or the weights dominate (512 -> 512 on 7x7 at batch 1: 1.08x slower), so: by timing both on
// this machine when tuning (PreferOwnKernel: by a margin; remembered: a later build makes only the kernel it uses),
// else for >= 64 input and output channels. OSPREY_WINOGRAD=0 never takes it (to save its memory), =1 wherever it
// applies (for comparisons and tests). With bf16 allowed where faster, only where oneDNN's fp32 form won
// (OwnOrDirect).
std::optional<OwnConvGeometry> WinogradCandidate(const KernelBuildContext& ctx, const ConvGeometry& g,
                                                      const std::string& mode) {
  std::optional<OwnConvGeometry> own = mode == "0" ? std::nullopt : OwnConvGeometryOf(ctx, g);
  if (!own || own->input_scale || own->input_affine || !own->input_parts.empty() || own->kernel_h != 3 ||
      own->kernel_w != 3 || own->stride_h != 1 || own->stride_w != 1 || ctx.InLayout(0) != Layout::kNhwc ||
      ctx.OutLayout(0) != Layout::kNhwc || (own->residual && ctx.InLayout(3) != Layout::kNhwc))
    return std::nullopt;
  const OwnConvGeometry& wg = *own;
  // Its transformed weights take 4x the layer's (36 values per input-output channel pair instead of 9): up to 256 x 256
  // channels (9.4 MB) only. ResNet-50's two 512 -> 512 layers would add 75 MB for ~2% of a batch-8 run; the layers
  // kept add 56 MB to its 98 MB of weights (RSS at batch 1: 246 MB without, 348 with all of them, 298 as it is).
  if (!WinogradConvApplies(wg) || wg.in_c * wg.out_c > 256 * 256) return std::nullopt;
  if (mode == "1") return wg;
  const bool worth_timing = wg.in_c * wg.out_c >= 32 * 32;
  const bool by_rule = wg.in_c >= 64 && wg.out_c >= 64;
  if (!(ctx.tune ? worth_timing : by_rule)) return std::nullopt;
  return wg;
}

// osprey's first-layer convolution (stem_conv.cc) instead of oneDNN's: 1-4 input channels read from the plain
// input (or a channels-last one: TensorFlow exports transpose their NHWC image, which the layout pass turns into a
// channels-last copy), channels-last output, 8-128 output channels, no residual, PRelu or fused depthwise part.
// OSPREY_STEM=0 never takes it, =1 wherever it applies (comparisons and tests); else by timing when tuning, and always
// otherwise (it saves the input's reorder to NHWC that oneDNN's kernels need).
std::optional<OwnConvGeometry> StemCandidate(const KernelBuildContext& ctx, const ConvGeometry& g,
                                              const std::string& mode) {
  std::optional<OwnConvGeometry> sg = mode == "0" ? std::nullopt : OwnConvGeometryOf(ctx, g);
  if (!sg || sg->residual || sg->input_scale || sg->input_affine || !sg->input_parts.empty() || g.x != g.x_logical ||
      (ctx.InLayout(0) != Layout::kPlain && ctx.InLayout(0) != Layout::kNhwc) || ctx.OutLayout(0) != Layout::kNhwc ||
      !StemConvApplies(*sg))
    return std::nullopt;
  return sg;
}

// osprey's depthwise convolution (depthwise_conv.cc) instead of oneDNN's, on channels-last tensors: one filter per
// channel, any window, stride and dilation, bias and activation, nothing else fused.
std::optional<OwnConvGeometry> DepthwiseCandidate(const KernelBuildContext& ctx, const ConvGeometry& g,
                                                  const std::string& mode) {
  OwnConvGeometry own;
  if (mode == "0" || ctx.bf16 == Bf16Use::kYes || g.x.size() != 4 || g.group != g.x[1] || g.w[0] != g.x[1] ||
      g.w[1] != 1 || g.dw_stride > 0 || HasFusedPRelu(ctx.node) || HasFusedPool(ctx.node) ||
      ctx.node.GetInt("_residual", 0) != 0 || HasInputScale(ctx.node) || HasInputAffine(ctx.node) ||
      HasInputParts(ctx.node) || g.x != g.x_logical || g.y != g.y_logical || ctx.InLayout(0) != Layout::kNhwc ||
      ctx.OutLayout(0) != Layout::kNhwc || !Activation::FromFusedNode(ctx.node, &own.activation))
    return std::nullopt;
  FillOwnConvShape(g, &own);
  own.bias = ctx.present.size() > 2 && ctx.present[2];
  if (!DepthwiseConvApplies(own)) return std::nullopt;
  return own;
}

// Whether oneDNN's kernel for a convolution is a generic one (im2col + GEMM, or the reference loops), which a
// depthwise layer falls to where oneDNN's jit_dw refuses it.
bool GenericDnnlConv(const DnnlConvKernel& direct) {
  const std::string impl = direct.Pd().impl_info_str() ? direct.Pd().impl_info_str() : "";
  return impl.find("gemm") != std::string::npos || impl.find("ref") != std::string::npos;
}

// osprey's 1x1 convolution (pointwise_conv.cc) instead of oneDNN's, on channels-last tensors, for a node ending in
// SiLU (OwnSilu: oneDNN's kernel then needs a second pass over its output) or with a fused input scale
// (ops/conv_input_scale.h: oneDNN's path scales the input in a pass first), and, when tuning, for weight-heavy layers
// of any window (PointwiseConvWeightHeavy: streaming the weights once for all pixels beat oneDNN on ResNet-50's 7x7
// layers at batch 1 by 15-30%, docs/performance.md "Thirty-eighth session"), except 3x3 windows Winograd competes
// for. OSPREY_POINTWISE=0 never takes it, =1 wherever it applies (any activation; comparisons and tests); else by
// timing when tuning (by kPointwiseMargin), and without tuning for SiLU and input scales only. Other layers stay with
// oneDNN: timed alone, osprey's won ShuffleNet's 1x1 ReLU layers and lost them in the model (2% slower), and tied
// ResNet-50's layers of 14x14 and more pixels.
// Timed alone, oneDNN's kernel and its SiLU pass find the output in the cache; in a model the pass reads what the
// next layer has not yet used and oneDNN's kernel lost more: EfficientNet-B0's 16 -> 96 layer on 112x112 was timed
// 0.86x alone and ran 0.81x in the model, its 40 -> 240 layers 0.93-0.99x and 0.86-0.91x.
constexpr double kPointwiseMargin = 0.95;
constexpr int64_t kWeightHeavyTimedBytes = int64_t{64} << 10;

std::optional<OwnConvGeometry> PointwiseCandidate(const KernelBuildContext& ctx, const ConvGeometry& g,
                                                  const std::string& mode, const std::string& winograd_mode) {
  std::optional<OwnConvGeometry> pg = mode == "0" ? std::nullopt : OwnConvGeometryOf(ctx, g);
  if (!pg || g.x != g.x_logical || g.y != g.y_logical || ctx.InLayout(0) != Layout::kNhwc ||
      ctx.OutLayout(0) != Layout::kNhwc || (pg->residual && ctx.InLayout(3) != Layout::kNhwc) ||
      !PointwiseConvApplies(*pg))
    return std::nullopt;
  // A window Winograd takes stays Winograd's to compete for (it beats both on ResNet-50's 14x14 3x3 layers).
  if (pg->kernel_h * pg->kernel_w > 1 && WinogradCandidate(ctx, g, winograd_mode)) return std::nullopt;
  // Weight-heavy layers of at least kWeightHeavyTimedBytes of weights: smaller ones take microseconds either way.
  const bool heavy =
      PointwiseConvWeightHeavy(*pg) &&
      pg->out_c * pg->in_c * pg->kernel_h * pg->kernel_w * int64_t{sizeof(float)} >= kWeightHeavyTimedBytes;
  if (mode == "1" || OwnSilu(ctx.node, g) || pg->input_scale || (ctx.tune && heavy)) return pg;
  return std::nullopt;
}

// Milliseconds of the reorder oneDNN's kernel `direct` needs from the image (input 0 as the plan holds it) to its
// source layout (0 when it reads it as it is).
double ImageReorderMs(const KernelBuildContext& ctx, const ConvGeometry& g, const DnnlConvKernel& direct) {
  const memory::desc user(ToDims(g.x), memory::data_type::f32,
                          ctx.InLayout(0) == Layout::kNhwc ? memory::format_tag::nhwc : memory::format_tag::nchw);
  if (direct.Pd().src_desc() == user) return 0;
  return PrimitiveMs(dnnl::reorder::primitive_desc(CpuEngine(), user, CpuEngine(), direct.Pd().src_desc()), 3);
}

// Milliseconds of the SiLU pass (SiluInPlace) a oneDNN convolution kernel runs over its output `y` when OwnSilu.
double SiluPassMs(const Shape& y, int threads) {
  std::vector<float> out(static_cast<size_t>(NumElements(y)));
  return BestRunMs(3, [&] { SiluInPlace(out.data(), static_cast<int64_t>(out.size()), threads); });
}

// Milliseconds of the pass a oneDNN convolution kernel runs to scale its channels-last input `x` [N, C, H, W] by a
// fused input scale (DnnlConvKernel::Run).
double InputScalePassMs(const Shape& x, int threads) {
  std::vector<float> in(static_cast<size_t>(NumElements(x))), out(in.size()), scale(static_cast<size_t>(x[1]), 1.f);
  const int64_t rows = InputScaleRows(x[0], x[1], x[2] * x[3], /*nhwc=*/true);
  return BestRunMs(3, [&] {
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      ScaleInputRows(in.data(), scale.data(), out.data(), x[0], x[1], x[2] * x[3], true, 1, rows * t / n,
                     rows * (t + 1) / n);
    }
  });
}

// One of osprey's own convolution kernels (`make_own`) or oneDNN's (`build_direct`; nullptr when it has no fast one):
// `mode` "1" takes osprey's untimed, no tuning takes it when `by_rule`; else the remembered verdict for `key`, or
// both timed (PreferOwnKernel: osprey's by a margin) and remembered.
// `direct_extra(direct)`, when given, returns the milliseconds the direct kernel spends outside its primitive; `margin`
// is PreferOwnKernel's.
template <typename Own>
std::unique_ptr<Kernel> OwnOrDirect(const KernelBuildContext& ctx, const std::string& fp32_key, const std::string& mode,
                                    bool by_rule, const std::function<std::unique_ptr<Own>()>& make_own,
                                    const std::function<std::unique_ptr<DnnlConvKernel>()>& build_direct,
                                    const std::function<double(const DnnlConvKernel&)>& direct_extra = nullptr,
                                    double margin = kOwnKernelMargin) {
  // With bf16 allowed where faster (--precision auto / bf16 when tuning), oneDNN's kernel is the faster of its bf16
  // and fp32 forms: a verdict of its own, and where it is bf16 (timed faster than oneDNN's fp32) it is kept.
  const std::string key = ctx.bf16 == Bf16Use::kNo ? fp32_key : fp32_key + ";bf16-if-faster";
  const std::optional<bool> remembered = ctx.tune && mode != "1" ? RememberedOwnVerdict(key) : std::nullopt;
  if (mode == "1" || !ctx.tune || remembered) {  // no timing: the one kernel it will be
    if (remembered ? *remembered : (mode == "1" || by_rule))
      if (std::unique_ptr<Own> own = make_own()) return own;
    return build_direct();
  }
  std::unique_ptr<DnnlConvKernel> direct = build_direct();
  if (direct && std::string(direct->Name()) == kConvBf16Name) return direct;
  std::unique_ptr<Own> own = make_own();
  if (!direct || !own) return direct ? std::unique_ptr<Kernel>(std::move(direct)) : std::move(own);
  const std::function<double()> extra =
      direct_extra ? std::function<double()>([&] { return direct_extra(*direct); }) : std::function<double()>();
  if (PreferOwnKernel(
          key, [&] { return own->TimeMs(3); }, direct->Pd(), extra, margin))
    return own;
  return direct;
}

// The convolution's kernel: oneDNN's (`build_direct`; nullptr when it has no fast one), osprey's Winograd or its
// first-layer kernel.
std::unique_ptr<Kernel> ChooseConvKernel(const KernelBuildContext& ctx, const ConvGeometry& g,
                                         const std::function<std::unique_ptr<DnnlConvKernel>()>& build_direct) {
  // A fused input affine or parts (runtime/fusion.cc FuseConvInputs) runs on osprey's 1x1 kernel alone: the fusion
  // makes such a node only where CpuKernelTakesFusedInput says it does.
  if (HasInputAffine(ctx.node) || HasInputParts(ctx.node)) {
    const std::optional<OwnConvGeometry> pg = OwnConvGeometryOf(ctx, g);
    return pg && g.x == g.x_logical && FusedInputLayouts(ctx) ? CreatePointwiseConv(ctx, *pg) : nullptr;
  }
  const char* stem_setting = std::getenv("OSPREY_STEM");
  const std::string stem_mode = stem_setting ? stem_setting : "";
  // A fused MaxPool runs on osprey's first-layer kernel alone: the fusion makes such a node only where it takes it
  // (CpuKernelFusesPool).
  if (HasFusedPool(ctx.node)) {
    const std::optional<OwnConvGeometry> sg = StemCandidate(ctx, g, stem_mode);
    return sg && StemConvPoolApplies(*sg) ? CreateStemConv(ctx, *sg) : nullptr;
  }
  if (const std::optional<OwnConvGeometry> sg = StemCandidate(ctx, g, stem_mode)) {
    // oneDNN's kernel also reorders the plain image to its source layout and may run a SiLU pass after the primitive
    // (OwnSilu); osprey's reads the image as it is and applies the activation in registers.
    auto direct_extra = [&](const DnnlConvKernel& direct) {
      return ImageReorderMs(ctx, g, direct) + (OwnSilu(ctx.node, g) ? SiluPassMs(g.y, ctx.num_threads) : 0.);
    };
    return OwnOrDirect<OwnConvKernel>(
        ctx, "stem:" + ConvTuningKey(ctx, g, ConvLayout::kChannelsLast), stem_mode, /*by_rule=*/true,
        [&] { return CreateStemConv(ctx, *sg); }, build_direct, direct_extra);
  }
  // A depthwise layer oneDNN runs on a generic kernel (a dilation jit_dw refuses): osprey's, timed against it when
  // tuning. OSPREY_DEPTHWISE=0 never takes it, =1 for every depthwise layer it applies to.
  const char* depthwise_setting = std::getenv("OSPREY_DEPTHWISE");
  const std::string depthwise_mode = depthwise_setting ? depthwise_setting : "";
  if (const std::optional<OwnConvGeometry> dg = DepthwiseCandidate(ctx, g, depthwise_mode)) {
    std::unique_ptr<DnnlConvKernel> direct = depthwise_mode == "1" ? nullptr : build_direct();
    if (depthwise_mode == "1" || !direct || GenericDnnlConv(*direct))
      return OwnOrDirect<OwnConvKernel>(
          ctx, "depthwise:" + ConvTuningKey(ctx, g, ConvLayout::kChannelsLast), depthwise_mode, /*by_rule=*/true,
          [&] { return CreateDepthwiseConv(ctx, *dg); }, [&] { return direct ? std::move(direct) : build_direct(); });
    return direct;
  }
  const char* pointwise_setting = std::getenv("OSPREY_POINTWISE");
  const std::string pointwise_mode = pointwise_setting ? pointwise_setting : "";
  const char* winograd_setting = std::getenv("OSPREY_WINOGRAD");
  const std::string winograd_mode = winograd_setting ? winograd_setting : "";
  if (const std::optional<OwnConvGeometry> pg = PointwiseCandidate(ctx, g, pointwise_mode, winograd_mode)) {
    auto direct_extra = [&](const DnnlConvKernel&) {
      return (OwnSilu(ctx.node, g) ? SiluPassMs(g.y, ctx.num_threads) : 0.) +
             (pg->input_scale ? InputScalePassMs(g.x, ctx.num_threads) : 0.);
    };
    return OwnOrDirect<OwnConvKernel>(
        ctx, "pointwise:" + ConvTuningKey(ctx, g, ConvLayout::kChannelsLast) + (pg->input_scale ? ";input-scale" : ""),
        pointwise_mode, /*by_rule=*/OwnSilu(ctx.node, g) || pg->input_scale,
        [&] { return CreatePointwiseConv(ctx, *pg); }, build_direct, direct_extra, kPointwiseMargin);
  }
  const std::optional<OwnConvGeometry> wg = WinogradCandidate(ctx, g, winograd_mode);
  if (!wg) return build_direct();
  // WinogradCandidate only offers a layer without tuning where the rule takes it.
  return OwnOrDirect<OwnConvKernel>(
      ctx, "winograd-f4x3:" + ConvTuningKey(ctx, g, ConvLayout::kChannelsLast), winograd_mode, /*by_rule=*/true,
      [&] { return CreateWinogradConv(ctx, *wg); }, build_direct);
}

std::unique_ptr<Kernel> TryCreateDnnlConv(const KernelBuildContext& ctx, ConvLayout layout) {
  if (!AllFloat32(ctx)) return nullptr;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return nullptr;
  OmpThreadsGuard threads(ctx.num_threads);
  return ChooseConvKernel(ctx, g, [&]() -> std::unique_ptr<DnnlConvKernel> {
    auto kernel = std::make_unique<DnnlConvKernel>();
    if (!kernel->Build(ctx, g, layout)) return nullptr;
    return kernel;
  });
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx, ConvLayout layout) {
  if (!AnyNhwc(ctx)) return TryCreateDnnlConv(ctx, layout);
  // Asked for channels-last tensors: declining would leave them to a reference kernel that reads them as plain.
  if (!LayoutsAreSupportedShape(ctx) && !(HasInputParts(ctx.node) && FusedInputLayouts(ctx)))
    ThrowUnsupportedLayouts(ctx.node, kConvName, "only input 0, the residual and output 0 of a 2-D Conv may be NHWC");
  std::unique_ptr<Kernel> kernel;
  try {
    kernel = TryCreateDnnlConv(ctx, layout);
  } catch (const dnnl::error& e) {
    ThrowUnsupportedLayouts(ctx.node, kConvName, std::string("oneDNN failed: ") + e.what());
  }
  if (!kernel) ThrowUnsupportedLayouts(ctx.node, kConvName, "this convolution has no fast oneDNN kernel");
  return kernel;
}

const char* DnnlConvImplementation(const Kernel& kernel) {
  const auto* conv = dynamic_cast<const DnnlConvKernel*>(&kernel);
  return conv ? conv->Implementation() : "";
}

namespace {

// Measured on the 2-core AVX-512 build machine with oneDNN 2.6.3, 2 threads, times including the reorders: oneDNN
// prefers NHWC here (brgconv). A 1x1 stride-1 convolution on NCHW is one GEMM per image and beats reorder+brgconv (1x1
// 256->64 on 56x56: 0.39 ms plain vs 0.60 ms; 1x1 1024->256 on 14x14: 0.39 vs 0.45 ms). oneDNN's GEMM convolution
// applies an activation post-op in a slow scalar pass (with Relu: 0.87 vs 0.61 ms, 0.51 vs 0.46 ms; 1x1 64->256 on
// 56x56 2.26 vs 0.64 ms; MobileNetV2's 1x1 32->192 + Clip 1.63 vs 0.34 ms; see the NhwcMeasure test); the kernel
// applies a plain convolution's activation itself (OwnActivation), and a 1-D one (PyTorch's Conv1d) stays plain with
// it (128 -> 128 on 8 x 1000 samples with Relu: 2.0 ms, 3.2 ms reordered). 2-D ones with an activation stay as they
// were measured: EfficientNet-B0's squeeze-excite 1x1 layers on 1x1 pixels at batch 8 went 1.5% slower plain.
// Everything else (3x3, 7x7 stride 2, grouped, depthwise) is 1.7-7x faster with the reorders (3x3 64->64 on 56x56:
// 1.30 ms plain vs 0.72 ms; depthwise 3x3 192 on 56x56: 3.70 vs 0.49 ms).
// With channels-last tensors the primitive works on NHWC directly (no reorders at all when every tensor is NHWC):
// oneDNN 2.6 then picks brgconv_1x1 / brgconv / brdgmm_dw (depthwise) / jit (grouped) on AVX-512. A primitive reading
// NCHW and writing NHWC (or the reverse) exists only as a reference implementation, so mixed layouts reorder.
ConvLayout ChooseLayout(const KernelBuildContext& ctx) {
  if (AnyNhwc(ctx) || HasFusedDepthwise(ctx.node)) return ConvLayout::kChannelsLast;
  const Shape& w = ctx.input_shapes[1];
  bool pointwise = ctx.node.GetInt("group", 1) == 1;
  for (size_t i = 2; i < w.size(); ++i) pointwise = pointwise && w[i] == 1;
  for (int64_t s : ctx.node.GetInts("strides")) pointwise = pointwise && s == 1;
  for (int64_t p : ctx.node.GetInts("pads")) pointwise = pointwise && p == 0;
  const bool activation = !ctx.node.GetString("_activation", "").empty() || HasFusedPRelu(ctx.node);
  const bool one_dimensional = w.size() == 3 && !HasFusedPRelu(ctx.node);
  return pointwise && (!activation || one_dimensional) ? ConvLayout::kPlain : ConvLayout::kPreferred;
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.size() < 2) {
    if (AnyNhwc(ctx)) ThrowUnsupportedLayouts(ctx.node, kConvName, "the node has fewer than 2 inputs");
    return nullptr;
  }
  return CreateDnnlConv(ctx, ChooseLayout(ctx));
}

bool DnnlConvSupportsNhwc(const KernelBuildContext& ctx) {
  // A fused input affine or parts, or a fused pool, is made after the layout pass, on channels-last values
  // (FuseConvInputs, FuseConvMaxPool); one in a model file stays plain and runs on the reference kernel.
  if (ctx.input_shapes.size() < 2 || !ChannelsLastRank(ctx.input_shapes[0].size()) || !AllFloat32(ctx) ||
      HasInputAffine(ctx.node) || HasInputParts(ctx.node) || HasFusedPool(ctx.node))
    return false;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return false;
  OmpThreadsGuard threads(ctx.num_threads);
  return (ctx.bf16 != Bf16Use::kNo && MakeConvPd(ctx, g, ConvLayout::kChannelsLast, /*bf16=*/true)) ||
         static_cast<bool>(MakeConvPd(ctx, g, ConvLayout::kChannelsLast));
}

bool CpuConvTakesFusedInput(const KernelBuildContext& ctx) {
  if (!(HasInputAffine(ctx.node) || HasInputParts(ctx.node)) || !AllFloat32(ctx) || !FusedInputLayouts(ctx))
    return false;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g) || g.x != g.x_logical) return false;
  const std::optional<OwnConvGeometry> pg = OwnConvGeometryOf(ctx, g);
  return pg && PointwiseConvApplies(*pg);
}

// With tuning (and no OSPREY_STEM=1), the fused kernel is timed against what the plan would run without the fusion:
// oneDNN's convolution (plus its reorder of the image, as for the stem alone) and oneDNN's pool over its output,
// remembered as `stem-pool:` (PreferOwnKernel at a margin of 1: both sides write their outputs to memory alike, and
// the fused side's saving is that it writes a quarter as much). On this machine's kind oneDNN's convolution ties the
// stem kernel and the pool decides; elsewhere oneDNN's convolution may win by more than the pool costs.
bool CpuConvFusesPool(const KernelBuildContext& ctx) {
  if (!HasFusedPool(ctx.node) || ctx.node.Has("_int8") || !AllFloat32(ctx)) return false;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return false;
  const char* stem_setting = std::getenv("OSPREY_STEM");
  const std::string mode = stem_setting ? stem_setting : "";
  const std::optional<OwnConvGeometry> sg = StemCandidate(ctx, g, mode);
  if (!sg || !StemConvPoolApplies(*sg)) return false;
  if (!ctx.tune || mode == "1") return true;
  std::string key = "stem-pool:" + ConvTuningKey(ctx, g, ConvLayout::kChannelsLast);
  for (const char* attr : {"_pool_kernel", "_pool_strides", "_pool_pads"})
    for (int64_t v : ctx.node.GetInts(attr)) key += std::to_string(v) + ",";
  key += std::to_string(ctx.node.GetInt("_pool_ceil", 0));
  if (const std::optional<bool> remembered = RememberedOwnVerdict(key)) return *remembered;
  OmpThreadsGuard threads(ctx.num_threads);
  // The two nodes the fusion replaces, as build contexts of their own.
  const Node conv_node = FusedConvPart(ctx.node), pool_node = FusedPoolPart(ctx.node);
  KernelBuildContext conv_ctx{conv_node, ctx.opset}, pool_ctx{pool_node, ctx.opset};
  conv_ctx.present = ctx.present;
  conv_ctx.input_dtypes = ctx.input_dtypes;
  conv_ctx.input_shapes = ctx.input_shapes;
  conv_ctx.input_values = ctx.input_values;
  conv_ctx.output_dtypes = ctx.output_dtypes;
  conv_ctx.output_shapes = {g.y};
  conv_ctx.input_layouts = ctx.input_layouts;
  conv_ctx.output_layouts = {Layout::kNhwc};
  conv_ctx.num_threads = pool_ctx.num_threads = ctx.num_threads;
  conv_ctx.tune = pool_ctx.tune = true;
  pool_ctx.present = {true};
  pool_ctx.input_dtypes = pool_ctx.output_dtypes = {DType::kF32};
  pool_ctx.input_shapes = {g.y};
  pool_ctx.output_shapes = ctx.output_shapes;
  pool_ctx.input_layouts = pool_ctx.output_layouts = {Layout::kNhwc};
  ConvGeometry cg;
  auto direct = std::make_unique<DnnlConvKernel>();
  if (!ComputeGeometry(conv_ctx, cg) || !direct->Build(conv_ctx, cg, ConvLayout::kChannelsLast)) return true;
  std::unique_ptr<OwnConvKernel> own = CreateStemConv(ctx, *sg);
  if (!own) return false;
  auto extra = [&] { return DnnlNhwcPoolMs(pool_ctx) + ImageReorderMs(ctx, g, *direct); };
  return PreferOwnKernel(
      key, [&] { return own->TimeMs(3); }, direct->Pd(), extra, /*margin=*/1.0);
}

bool DnnlConvFusesPRelu(const KernelBuildContext& ctx) {
  if (!HasFusedPRelu(ctx.node) || ctx.input_shapes.size() <= kPReluSlopeInput || !AllFloat32(ctx)) return false;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return false;
  OmpThreadsGuard threads(ctx.num_threads);
  return static_cast<bool>(MakeConvPd(ctx, g, ChooseLayout(ctx)));
}

bool DnnlConvFusesDepthwise(const KernelBuildContext& ctx) {
  if (!HasFusedDepthwise(ctx.node) || ctx.input_shapes.size() < 2 || !AllFloat32(ctx)) return false;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return false;
  OmpThreadsGuard threads(ctx.num_threads);
  return static_cast<bool>(MakeConvPd(ctx, g, ConvLayout::kChannelsLast));
}

}  // namespace osprey::cpu
