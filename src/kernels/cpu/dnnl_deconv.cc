// ConvTranspose (float32, 1-3 spatial axes, constant weights and bias) on oneDNN's deconvolution primitive, reading
// and writing its tensors where they are: plain, or channels-last for 2-D and 3-D when the runtime's layout pass asks
// (CpuKernelSupportsNhwc). The window (auto_pad, pads, output_padding, output_shape) comes from ops/conv_window.h;
// oneDNN's right pad is what crops the full result to the output size, so a negative crop on either side (SAME_* or
// output_shape growing the result) is left to the reference kernel, as are cases oneDNN has only a reference
// implementation for. ONNX weights are [C_in, C_out / group, k...]: described to oneDNN by strides, then packed once
// into the primitive's layout (shared through the weight store).
#include <string>
#include <unordered_map>

#include "kernels/cpu/dnnl_common.h"
#include "ops/conv_window.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;

struct DeconvGeometry {
  Shape x, w, y;
  int64_t group = 1;
  memory::dims strides, dilates, pad_l, pad_r;
};

bool ComputeDeconvGeometry(const KernelBuildContext& ctx, DeconvGeometry& g) {
  const Node& node = ctx.node;
  if (node.op_type != "ConvTranspose" || !node.domain.empty() || !AllFloat32(ctx)) return false;
  if (ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1 || !ctx.input_values[1]) return false;
  const bool has_bias = ctx.present.size() > 2 && ctx.present[2];
  if (has_bias && !ctx.input_values[2]) return false;
  g.x = ctx.input_shapes[0];
  g.w = ctx.input_shapes[1];
  g.y = ctx.output_shapes[0];
  const size_t rank = g.x.size();
  if (rank < 3 || rank > 5 || g.w.size() != rank || g.y.size() != rank || NumElements(g.x) == 0 ||
      NumElements(g.y) == 0)
    return false;
  g.group = node.GetInt("group", 1);
  if (g.group < 1 || g.x[1] != g.w[0] || g.x[1] % g.group != 0 || g.y[1] != g.w[1] * g.group) return false;
  const std::vector<int64_t> kernel(g.w.begin() + 2, g.w.end());
  const ConvWindow win = ResolveConvTransposeWindow(node, g.x, kernel);
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (win.out[i] != g.y[2 + i]) return false;
    const int64_t full = win.strides[i] * (g.x[2 + i] - 1) + win.EffectiveKernel(i);
    const int64_t pad_l = win.pad_begin[i], pad_r = full - pad_l - g.y[2 + i];
    if (pad_l < 0 || pad_r < 0) return false;
    g.strides.push_back(win.strides[i]);
    g.dilates.push_back(win.dilations[i] - 1);
    g.pad_l.push_back(pad_l);
    g.pad_r.push_back(pad_r);
  }
  return true;
}

// oneDNN's logical weight dims ({G,} OC/G, IC/G, k...) over ONNX's memory order [G * IC/G, OC/G, k...].
memory::desc OnnxWeightDesc(const DeconvGeometry& g) {
  const int64_t ic = g.x[1] / g.group, oc = g.w[1];
  int64_t k = 1;
  for (size_t i = 2; i < g.w.size(); ++i) k *= g.w[i];
  memory::dims dims, strides;
  if (g.group > 1) {
    dims.push_back(g.group);
    strides.push_back(ic * oc * k);
  }
  dims.push_back(oc);
  strides.push_back(k);
  dims.push_back(ic);
  strides.push_back(oc * k);
  int64_t stride = k;
  for (size_t i = 2; i < g.w.size(); ++i) {
    stride /= g.w[i];
    dims.push_back(g.w[i]);
    strides.push_back(stride);
  }
  return memory::desc(dims, memory::data_type::f32, strides);
}

memory::desc AnyWeightDesc(const DeconvGeometry& g) {
  memory::dims dims = OnnxWeightDesc(g).get_dims();
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
}

dnnl::deconvolution_forward::primitive_desc MakeDeconvPd(const KernelBuildContext& ctx, const DeconvGeometry& g) {
  const bool has_bias = ctx.present.size() > 2 && ctx.present[2];
  if (AnyNhwc(ctx) && !ChannelsLastRank(g.x.size())) return {};
  dnnl::deconvolution_forward::primitive_desc pd(
      CpuEngine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
      ActivationDesc(g.x, ctx.InLayout(0)), AnyWeightDesc(g), has_bias ? PlainDesc({g.y[1]}) : memory::desc(),
      ActivationDesc(g.y, ctx.OutLayout(0)), g.strides, g.dilates, g.pad_l, g.pad_r, BaseAttr(), /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return {};
  return pd;
}

std::string DeconvTuningKey(const KernelBuildContext& ctx, const DeconvGeometry& g) {
  std::string key = "deconv:" + TuningActivationKey(g.x);  // images x pixels by size class (dnnl_common.h)
  for (int64_t d : g.w) key += std::to_string(d) + ",";
  key += ";" + TuningActivationKey(g.y);
  for (const auto* dims : {&g.strides, &g.dilates, &g.pad_l, &g.pad_r}) {
    for (int64_t d : *dims) key += std::to_string(d) + ",";
    key += ";";
  }
  return key + std::to_string(g.group) + ";" + std::to_string(static_cast<int>(ctx.InLayout(0))) +
         std::to_string(static_cast<int>(ctx.OutLayout(0))) + ";" + std::to_string(ctx.num_threads) + ";" +
         std::to_string(ctx.present.size() > 2 && ctx.present[2]);
}

class DnnlDeconvKernel final : public Kernel {
 public:
  DnnlDeconvKernel(const KernelBuildContext& ctx, const DeconvGeometry& g,
                   const dnnl::deconvolution_forward::primitive_desc& pd)
      : primitive_(pd),
        src_md_(pd.src_desc()),
        dst_md_(pd.dst_desc()),
        scratch_md_(pd.scratchpad_desc()),
        x_(g.x),
        y_(g.y),
        in_layout_(ctx.InLayout(0)),
        out_layout_(ctx.OutLayout(0)) {
    weight_ = PackWeight(ctx, OnnxWeightDesc(g), *ctx.input_values[1], pd.weights_desc());
    if (ctx.present.size() > 2 && ctx.present[2]) {
      bias_ = *ctx.input_values[2];
      bias_md_ = PlainDesc({g.y[1]});
    }
  }
  const char* Name() const override { return "ConvTransposeF32Dnnl"; }

  void Run(KernelContext& ctx) override {
    CheckActivation(ctx.node, Name(), "input", ctx.In(0), x_, in_layout_);
    CheckActivation(ctx.node, Name(), "output", ctx.Out(0), y_, out_layout_);
    RunDnnl(ctx.node, Name(), [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(ThreadScratch::Align(scratch_md_.get_size()));
      const auto run = runs_.Acquire([this] { return MakeRunState(); });
      Point(run->src, ctx.In(0).raw());
      Point(run->dst, ctx.Out(0).raw());
      Point(run->scratchpad, scratch);
      run->args.Execute(primitive_, stream);
      stream.wait();
    });
  }

 private:
  // The memories and argument array of one run (one set per concurrent caller, PerCaller).
  struct RunState {
    memory src, dst, scratchpad;
    ExecArgs args;
  };
  RunState MakeRunState() const {
    RunState r;
    r.src = UnboundMemory(src_md_);
    r.dst = UnboundMemory(dst_md_);
    r.scratchpad = UnboundMemory(scratch_md_);
    r.args.Add(DNNL_ARG_SRC, r.src).Add(DNNL_ARG_WEIGHTS, weight_.memory).Add(DNNL_ARG_DST, r.dst).Add(
        DNNL_ARG_SCRATCHPAD, r.scratchpad);
    if (bias_.defined() && bias_.numel() > 0) r.args.Add(DNNL_ARG_BIAS, WrapMemory(bias_md_, bias_.raw()));
    return r;
  }

  dnnl::deconvolution_forward primitive_;
  memory::desc src_md_, dst_md_, scratch_md_, bias_md_;
  PackedWeight weight_;
  Tensor bias_;
  Shape x_, y_;
  Layout in_layout_, out_layout_;
  PerCaller<RunState> runs_;
};

}  // namespace

bool DnnlDeconvSupportsNhwc(const KernelBuildContext& ctx) {
  DeconvGeometry g;
  if (!ComputeDeconvGeometry(ctx, g) || !ChannelsLastRank(g.x.size())) return false;
  // Every combination with a channels-last side must have a fast primitive (the layout pass may ask for any).
  for (Layout in : {Layout::kPlain, Layout::kNhwc})
    for (Layout out : {Layout::kPlain, Layout::kNhwc}) {
      if (in == Layout::kPlain && out == Layout::kPlain) continue;
      KernelBuildContext asked = ctx;
      asked.input_layouts.assign(ctx.input_shapes.size(), Layout::kPlain);
      asked.input_layouts[0] = in;
      asked.output_layouts = {out};
      if (!MakeDeconvPd(asked, g)) return false;
    }
  return true;
}

std::unique_ptr<Kernel> CreateDnnlDeconv(const KernelBuildContext& ctx) {
  DeconvGeometry g;
  if (!ComputeDeconvGeometry(ctx, g)) return nullptr;
  OmpThreadsGuard threads(ctx.num_threads);
  const auto pd = FastestImpl<dnnl::deconvolution_forward::primitive_desc>(
      ctx, [&] { return MakeDeconvPd(ctx, g); }, DeconvTuningKey(ctx, g));
  if (!pd) {
    if (AnyNhwc(ctx)) ThrowUnsupportedLayouts(ctx.node, "ConvTransposeF32Dnnl", "oneDNN has no fast deconvolution");
    return nullptr;
  }
  return std::make_unique<DnnlDeconvKernel>(ctx, g, pd);
}

}  // namespace osprey::cpu
