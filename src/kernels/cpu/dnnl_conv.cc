// Conv (1-D, 2-D, 3-D) on oneDNN: groups and depthwise, strides, dilations, asymmetric and auto pads, bias, and the
// fused residual add and activation of docs/architecture.md as post-ops.
#include "kernels/cpu/dnnl_conv.h"

#include <algorithm>
#include <unordered_map>

#include "kernels/cpu/dnnl_common.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;
constexpr const char* kConvName = "ConvF32Dnnl";

struct ConvGeometry {
  Shape x, w, y;
  int64_t group = 1;
  memory::dims strides, dilates, pad_l, pad_r;  // oneDNN conventions: dilation d is passed as d - 1
};

// Fills `g` from the node and shapes; false for anything this kernel does not take (the schema has already
// rejected malformed nodes, so a mismatch here just means "let the reference kernel handle it").
bool ComputeGeometry(const KernelBuildContext& ctx, ConvGeometry& g) {
  const Node& node = ctx.node;
  if (ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1) return false;
  g.x = ctx.input_shapes[0];
  g.w = ctx.input_shapes[1];
  g.y = ctx.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(g.x.size());
  if (rank < 3 || rank > 5 || static_cast<int64_t>(g.w.size()) != rank || static_cast<int64_t>(g.y.size()) != rank)
    return false;
  const int64_t spatial = rank - 2;
  g.group = node.GetInt("group", 1);
  const int64_t in_c = g.x[1], out_c = g.w[0];
  if (g.group <= 0 || in_c % g.group != 0 || out_c % g.group != 0 || g.w[1] * g.group != in_c) return false;
  if (g.y[0] != g.x[0] || g.y[1] != out_c) return false;
  for (int64_t d : g.x)
    if (d <= 0) return false;
  for (int64_t d : g.w)
    if (d <= 0) return false;

  std::vector<int64_t> strides = node.GetInts("strides", std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> dilations = node.GetInts("dilations", std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * spatial, 0));
  std::vector<int64_t> kernel = node.GetInts("kernel_shape", std::vector<int64_t>(g.w.begin() + 2, g.w.end()));
  if (static_cast<int64_t>(strides.size()) != spatial || static_cast<int64_t>(dilations.size()) != spatial ||
      static_cast<int64_t>(pads.size()) != 2 * spatial || static_cast<int64_t>(kernel.size()) != spatial)
    return false;
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = g.x[2 + i], k = g.w[2 + i], s = strides[i], d = dilations[i];
    if (kernel[i] != k || s <= 0 || d <= 0) return false;
    const int64_t k_eff = (k - 1) * d + 1;
    int64_t pl = pads[i], pr = pads[spatial + i];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + k_eff - in);
      pl = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pr = total - pl;
    } else if (auto_pad == "VALID") {
      pl = pr = 0;
    } else if (auto_pad != "NOTSET") {
      return false;
    }
    if (pl < 0 || pr < 0) return false;
    const int64_t span = in + pl + pr - k_eff;
    if (span < 0 || span / s + 1 != g.y[2 + i]) return false;
    g.strides.push_back(s);
    g.dilates.push_back(d - 1);
    g.pad_l.push_back(pl);
    g.pad_r.push_back(pr);
  }
  return true;
}

memory::desc WeightDesc(const ConvGeometry& g, bool plain) {
  memory::dims dims = ToDims(g.w);
  if (g.group > 1) {
    dims[0] = g.w[0] / g.group;
    dims.insert(dims.begin(), g.group);  // [g, M/g, C/g, k...]: same bytes as ONNX's [M, C/g, k...]
  }
  if (plain) return PlainDesc(dims);
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
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

class DnnlConvKernel final : public Kernel {
 public:
  const char* Name() const override { return kConvName; }

  // Returns false when oneDNN only offers a reference implementation or a needed piece is missing.
  bool Build(const KernelBuildContext& ctx, const ConvGeometry& g, ConvLayout layout) {
    const Node& node = ctx.node;
    x_shape_ = g.x;
    y_shape_ = g.y;
    has_bias_ = ctx.present.size() > 2 && ctx.present[2];
    residual_ = node.GetInt("_residual", 0) != 0;
    if (has_bias_ && ctx.input_shapes[2] != Shape{g.w[0]}) return false;
    if (residual_ && (ctx.present.size() < 4 || !ctx.present[3] || ctx.input_shapes[3] != g.y)) return false;
    const Tensor* weight = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
    if (weight == nullptr || weight->raw() == nullptr) return false;  // prepacking needs the weight now

    user_src_md_ = PlainDesc(ToDims(g.x));
    user_dst_md_ = PlainDesc(ToDims(g.y));
    memory::desc src_md, dst_md;
    switch (layout) {
      case ConvLayout::kPlain:
        src_md = user_src_md_;
        dst_md = user_dst_md_;
        break;
      case ConvLayout::kChannelsLast:
        src_md = memory::desc(ToDims(g.x), memory::data_type::f32, ChannelsLastTag(g.x.size()));
        dst_md = memory::desc(ToDims(g.y), memory::data_type::f32, ChannelsLastTag(g.y.size()));
        break;
      case ConvLayout::kPreferred:
        src_md = memory::desc(ToDims(g.x), memory::data_type::f32, memory::format_tag::any);
        dst_md = memory::desc(ToDims(g.y), memory::data_type::f32, memory::format_tag::any);
        break;
    }
    bias_md_ = has_bias_ ? PlainDesc({g.w[0]}) : memory::desc();
    dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                         src_md, WeightDesc(g, false), bias_md_, dst_md, g.strides, g.dilates, g.pad_l,
                                         g.pad_r);

    // The residual joins before the activation as a sum post-op: the residual is first copied (plain destination)
    // or reordered (any other destination layout) into the destination buffer. A binary-add post-op reading the
    // residual tensor directly would save that copy, but oneDNN 2.6 runs it only in its im2col+GEMM convolution and
    // applies it there elementwise without vectorising: measured 23 ms instead of 0.8 ms for a 1x1 64->256 conv on
    // 56x56 with residual and Relu.
    dnnl::primitive_attr attr = BaseAttr();
    dnnl::post_ops ops;
    if (residual_) ops.append_sum(1.f);
    if (!AppendFusedActivation(node, ops)) return false;
    attr.set_post_ops(ops);
    pd_ = dnnl::convolution_forward::primitive_desc(desc, attr, CpuEngine(), /*allow_empty=*/true);
    if (!pd_ || IsReferenceImpl(pd_)) return false;
    conv_dst_md_ = pd_.dst_desc();
    conv_src_md_ = pd_.src_desc();
    conv_ = dnnl::convolution_forward(pd_);

    weight_ = PackWeight(WeightDesc(g, true), weight->raw(), pd_.weights_desc());

    reorder_src_ = conv_src_md_ != user_src_md_;
    reorder_dst_ = conv_dst_md_ != user_dst_md_;
    auto make_reorder = [&](const memory::desc& from, const memory::desc& to) {
      dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, BaseAttr());
      reorder_scratch_bytes_ = std::max(reorder_scratch_bytes_, ScratchpadBytes(pd));
      return dnnl::reorder(pd);
    };
    if (reorder_src_) src_reorder_ = make_reorder(user_src_md_, conv_src_md_);
    if (reorder_dst_) dst_reorder_ = make_reorder(conv_dst_md_, user_dst_md_);
    if (residual_) residual_reorder_ = make_reorder(user_dst_md_, conv_dst_md_);
    reorder_scratch_md_ = memory::desc({static_cast<int64_t>(std::max<size_t>(reorder_scratch_bytes_, 1))},
                                       memory::data_type::u8, memory::format_tag::x);
    reorder_scratch_bytes_ = ThreadScratch::Align(reorder_scratch_bytes_);
    src_bytes_ = reorder_src_ ? ThreadScratch::Align(conv_src_md_.get_size()) : 0;
    dst_bytes_ = reorder_dst_ ? ThreadScratch::Align(conv_dst_md_.get_size()) : 0;
    scratch_md_ = pd_.scratchpad_desc();
    scratch_bytes_ = ThreadScratch::Align(scratch_md_.get_size());
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckShape(node, kConvName, "input", ctx.In(0), x_shape_);
    CheckShape(node, kConvName, "output", ctx.Out(0), y_shape_);
    if (residual_) CheckShape(node, kConvName, "residual", ctx.In(3), y_shape_);
    RunDnnl(node, kConvName, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(src_bytes_ + dst_bytes_ + scratch_bytes_ + reorder_scratch_bytes_);
      memory user_src = WrapMemory(user_src_md_, ctx.In(0).raw());
      memory user_dst = WrapMemory(user_dst_md_, ctx.Out(0).raw());
      memory src = reorder_src_ ? memory(conv_src_md_, CpuEngine(), scratch) : user_src;
      memory dst = reorder_dst_ ? memory(conv_dst_md_, CpuEngine(), scratch + src_bytes_) : user_dst;
      memory scratchpad(scratch_md_, CpuEngine(), scratch + src_bytes_ + dst_bytes_);
      memory reorder_scratchpad(reorder_scratch_md_, CpuEngine(), scratch + src_bytes_ + dst_bytes_ + scratch_bytes_);
      auto reorder = [&](const dnnl::reorder& r, const memory& from, const memory& to) {
        r.execute(stream, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, reorder_scratchpad}});
      };
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                           {DNNL_ARG_WEIGHTS, weight_.memory},
                                           {DNNL_ARG_DST, dst},
                                           {DNNL_ARG_SCRATCHPAD, scratchpad}};
      if (has_bias_) args.emplace(DNNL_ARG_BIAS, WrapMemory(bias_md_, ctx.In(2).raw()));
      if (reorder_src_) reorder(src_reorder_, user_src, src);
      if (residual_) {
        const void* residual = ctx.In(3).raw();
        // With a plain destination this is a (parallel) copy, skipped when the runtime runs the add in place.
        if (reorder_dst_ || residual != ctx.Out(0).raw())
          reorder(residual_reorder_, WrapMemory(user_dst_md_, residual), dst);
      }
      conv_.execute(stream, args);
      if (reorder_dst_) reorder(dst_reorder_, dst, user_dst);
      stream.wait();
    });
  }

 private:
  Shape x_shape_, y_shape_;
  bool has_bias_ = false, residual_ = false;
  bool reorder_src_ = false, reorder_dst_ = false;
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward conv_;
  dnnl::reorder src_reorder_, dst_reorder_, residual_reorder_;
  memory::desc user_src_md_, user_dst_md_, conv_src_md_, conv_dst_md_, bias_md_, scratch_md_, reorder_scratch_md_;
  PackedWeight weight_;
  size_t src_bytes_ = 0, dst_bytes_ = 0, scratch_bytes_ = 0, reorder_scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx, ConvLayout layout) {
  if (!AllFloat32(ctx)) return nullptr;
  ConvGeometry g;
  if (!ComputeGeometry(ctx, g)) return nullptr;
  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<DnnlConvKernel>();
  if (!kernel->Build(ctx, g, layout)) return nullptr;
  return kernel;
}

namespace {

// Measured on the 2-core AVX-512 build machine with oneDNN 2.6.3, 2 threads, times including the reorders: oneDNN
// prefers NHWC here (brgconv). A 1x1 stride-1 convolution on NCHW is one GEMM per image and beats reorder+brgconv (1x1
// 256->64 on 56x56: 0.34 ms plain vs 0.54 ms; 1x1 1024->256 on 14x14: 0.34 vs 0.39 ms), except that oneDNN's GEMM
// convolution applies a residual sum *and* an activation in a slow scalar pass (3.2 ms vs 0.78 ms). Everything else
// (3x3, 7x7 stride 2, grouped, depthwise) is 1.7-5x faster with the reorders (3x3 64->64 on 56x56: 1.30 ms plain vs
// 0.72 ms).
ConvLayout ChooseLayout(const KernelBuildContext& ctx) {
  const Shape& w = ctx.input_shapes[1];
  bool pointwise = ctx.node.GetInt("group", 1) == 1;
  for (size_t i = 2; i < w.size(); ++i) pointwise = pointwise && w[i] == 1;
  for (int64_t s : ctx.node.GetInts("strides")) pointwise = pointwise && s == 1;
  for (int64_t p : ctx.node.GetInts("pads")) pointwise = pointwise && p == 0;
  const bool residual_and_activation =
      ctx.node.GetInt("_residual", 0) != 0 && !ctx.node.GetString("_activation", "").empty();
  return pointwise && !residual_and_activation ? ConvLayout::kPlain : ConvLayout::kPreferred;
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.size() < 2) return nullptr;
  return CreateDnnlConv(ctx, ChooseLayout(ctx));
}

}  // namespace osprey::cpu
