// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool on oneDNN's pooling primitive, and Softmax /
// LogSoftmax on its softmax primitives. They work on the layout of their tensors directly (plain, or NHWC for 2-D
// pools when the runtime's layout pass asks): they are memory-bound, so a reorder would cost as much as the op itself.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "ops/conv_window.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;

// One primitive reading input 0 and writing output 0, with the same shapes on every run. The user tensors are
// described by `user_src_md` / `user_dst_md`; where the primitive wants another layout, reorders through per-thread
// scratch memory bridge the difference (pools asked for one NCHW and one NHWC tensor).
class DnnlUnaryKernel final : public Kernel {
 public:
  DnnlUnaryKernel(const char* name, dnnl::primitive primitive, const dnnl::primitive_desc_base& pd, Shape in_shape,
                  Layout in_layout, memory::desc user_src_md, Shape out_shape, Layout out_layout,
                  memory::desc user_dst_md, DType dtype = DType::kF32)
      : name_(name),
        dtype_(dtype),
        primitive_(std::move(primitive)),
        io_(user_src_md, pd.src_desc(0), user_dst_md, pd.dst_desc(0), pd.scratchpad_desc()),
        in_shape_(std::move(in_shape)),
        out_shape_(std::move(out_shape)),
        in_layout_(in_layout),
        out_layout_(out_layout) {}

  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    CheckActivation(ctx.node, name_, "input", ctx.In(0), in_shape_, in_layout_, dtype_);
    CheckActivation(ctx.node, name_, "output", ctx.Out(0), out_shape_, out_layout_, dtype_);
    RunDnnl(ctx.node, name_, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(io_.TotalBytes());
      const auto run = runs_.Acquire([this] { return MakeRunState(); });
      io_.Point(run->io, ctx.In(0).raw(), ctx.Out(0).raw(), scratch);
      if (io_.reorder_src) run->io.src_reorder.Execute(io_.src_reorder, stream);
      run->primitive.Execute(primitive_, stream);
      if (io_.reorder_dst) run->io.dst_reorder.Execute(io_.dst_reorder, stream);
      stream.wait();
    });
  }

 private:
  // The memories and argument arrays of one run (one set per concurrent caller, PerCaller).
  struct RunState {
    ReorderedIo io;
    ExecArgs primitive;
  };
  RunState MakeRunState() const {
    RunState r{io_.MakeIo(), {}};
    r.primitive.Add(DNNL_ARG_SRC, r.io.src).Add(DNNL_ARG_DST, r.io.dst).Add(DNNL_ARG_SCRATCHPAD, r.io.scratchpad);
    return r;
  }

  const char* name_;
  DType dtype_;
  dnnl::primitive primitive_;
  IoReorders io_;
  Shape in_shape_, out_shape_;
  Layout in_layout_, out_layout_;
  PerCaller<RunState> runs_;
};

bool AllPositive(const Shape& s) {
  for (int64_t d : s)
    if (d <= 0) return false;
  return true;
}

// A pooling node in oneDNN's terms.
struct PoolGeometry {
  Shape x, y;
  DType dtype = DType::kF32;  // float32; MaxPool also (u)int8, as quantised models in QOperator form have it
  memory::data_type type = memory::data_type::f32;
  bool global = false;
  const char* name = "";
  dnnl::algorithm algorithm = dnnl::algorithm::pooling_max;
  memory::dims kernel, strides, dilation, pad_l, pad_r;
};

// False for anything this kernel does not take (the reference kernel runs it).
bool ComputePoolGeometry(const KernelBuildContext& ctx, PoolGeometry& p) {
  const Node& node = ctx.node;
  const std::string& op = node.op_type;
  // MaxPool's optional Indices output has no oneDNN equivalent in inference.
  if (ctx.input_shapes.size() != 1 || ctx.output_shapes.size() != 1 || ctx.input_dtypes.size() != 1 ||
      ctx.output_dtypes.size() != 1 || ctx.input_dtypes[0] != ctx.output_dtypes[0])
    return false;
  const Shape& x = ctx.input_shapes[0];
  const Shape& y = ctx.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank < 3 || rank > 5 || static_cast<int64_t>(y.size()) != rank || !AllPositive(x) || !AllPositive(y))
    return false;
  if (y[0] != x[0] || y[1] != x[1]) return false;
  p.x = x;
  p.y = y;
  const int64_t spatial = rank - 2;
  p.global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  const bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  p.dtype = ctx.input_dtypes[0];
  if (p.dtype == DType::kU8 && op == "MaxPool") {  // (u)int8: MaxPool only (GlobalMaxPool is float in ONNX)
    p.type = memory::data_type::u8;
    p.name = "MaxPoolU8Dnnl";
  } else if (p.dtype == DType::kI8 && op == "MaxPool") {
    p.type = memory::data_type::s8;
    p.name = "MaxPoolS8Dnnl";
  } else if (p.dtype == DType::kF32) {
    p.name = is_max ? (p.global ? "GlobalMaxPoolF32Dnnl" : "MaxPoolF32Dnnl")
                    : (p.global ? "GlobalAveragePoolF32Dnnl" : "AveragePoolF32Dnnl");
  } else {
    return false;  // averages of integers: the reference kernel's rounding
  }

  p.algorithm = is_max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  if (p.global) {
    for (int64_t i = 0; i < spatial; ++i) {
      if (y[2 + i] != 1) return false;
      p.kernel.push_back(x[2 + i]);
      p.strides.push_back(1);
      p.dilation.push_back(0);
      p.pad_l.push_back(0);
      p.pad_r.push_back(0);
    }
    return true;
  }
  const std::vector<int64_t> k = node.GetInts("kernel_shape");
  if (static_cast<int64_t>(k.size()) != spatial) return false;
  const bool count_include_pad = !is_max && node.GetInt("count_include_pad", 0) != 0;
  if (count_include_pad) p.algorithm = dnnl::algorithm::pooling_avg_include_padding;
  // The pads do not depend on ceil_mode; the output sizes are y's.
  const ConvWindow win = ResolveConvWindow(node, x, k, node.GetInt("ceil_mode", 0) != 0);
  const std::vector<int64_t>& s = win.strides;
  const std::vector<int64_t>& d = win.dilations;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = x[2 + i], out = y[2 + i];
    const int64_t k_eff = win.EffectiveKernel(i);
    int64_t pl = win.pad_begin[i], pr = win.pad_end[i];
    if (pl < 0 || pr < 0) return false;
    // oneDNN sizes the output with floor division. ceil_mode's extra window (and any other rounding the schema
    // chose) is expressed by growing padding_r until the floor formula gives the inferred output size.
    const int64_t span = in + pl + pr - k_eff;
    if (span < 0 || span / s[i] + 1 != out) {
      const int64_t needed = (out - 1) * s[i] + k_eff - in - pl;
      if (needed < pr) return false;
      // count_include_pad counts the declared padding, not ceil_mode's overhang past it (ONNX >= 1.18, ONNX Runtime,
      // PyTorch); oneDNN would count the grown padding too. Without declared padding the two averages agree.
      if (count_include_pad) {
        if (std::any_of(win.pad_begin.begin(), win.pad_begin.end(), [](int64_t v) { return v != 0; }) ||
            std::any_of(win.pad_end.begin(), win.pad_end.end(), [](int64_t v) { return v != 0; }))
          return false;
        p.algorithm = dnnl::algorithm::pooling_avg_exclude_padding;
      }
      pr = needed;
    }
    // A window lying wholly in padding has no defined oneDNN result.
    if (pl >= k_eff || (out - 1) * s[i] - pl >= in) return false;
    p.kernel.push_back(k[i]);
    p.strides.push_back(s[i]);
    p.dilation.push_back(d[i] - 1);
    p.pad_l.push_back(pl);
    p.pad_r.push_back(pr);
  }
  return true;
}

// The pooling primitive with source and destination in `layout`, or an empty descriptor where oneDNN offers only its
// reference implementation. Shared by the factory and the channels-last support test, so the two agree.
dnnl::pooling_forward::primitive_desc MakePoolPd(const PoolGeometry& p, Layout layout) {
  dnnl::pooling_forward::primitive_desc pd(CpuEngine(), dnnl::prop_kind::forward_inference, p.algorithm,
                                           ActivationDesc(p.x, layout, p.type), ActivationDesc(p.y, layout, p.type),
                                           p.strides, p.kernel, p.dilation, p.pad_l, p.pad_r, BaseAttr(),
                                           /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return {};
  return pd;
}

// Channels-last tensors exist only for rank-4 activations, and pools have one input and one output.
bool PoolLayoutsPossible(const KernelBuildContext& ctx) {
  for (size_t i = 1; i < ctx.input_layouts.size(); ++i)
    if (ctx.input_layouts[i] != Layout::kPlain) return false;
  for (size_t i = 1; i < ctx.output_layouts.size(); ++i)
    if (ctx.output_layouts[i] != Layout::kPlain) return false;
  return !ctx.input_shapes.empty() && ChannelsLastRank(ctx.input_shapes[0].size());
}

std::unique_ptr<Kernel> CreateNhwcPool(const KernelBuildContext& ctx) {
  const char* op = ctx.node.op_type.c_str();
  PoolGeometry p;
  if (!PoolLayoutsPossible(ctx) || !ComputePoolGeometry(ctx, p))
    ThrowUnsupportedLayouts(ctx.node, op, "this pooling node has no fast channels-last kernel");
  try {
    OmpThreadsGuard threads(ctx.num_threads);
    dnnl::pooling_forward::primitive_desc pd = MakePoolPd(p, Layout::kNhwc);
    if (!pd) ThrowUnsupportedLayouts(ctx.node, p.name, "oneDNN has only a reference implementation for it");
    // A global pool's [N, C, 1, 1] output has the same bytes in both layouts: the primitive writes it directly.
    memory::desc user_dst_md = p.global ? pd.dst_desc() : ActivationDesc(p.y, ctx.OutLayout(0), p.type);
    // Where one tensor is plain, the primitive still works on NHWC (a primitive reading one layout and writing the
    // other is a reference implementation in oneDNN 2.6) and a reorder converts that tensor.
    return std::make_unique<DnnlUnaryKernel>(p.name, dnnl::pooling_forward(pd), pd, p.x, ctx.InLayout(0),
                                             ActivationDesc(p.x, ctx.InLayout(0), p.type), p.y, ctx.OutLayout(0),
                                             user_dst_md, p.dtype);
  } catch (const dnnl::error& e) {
    ThrowUnsupportedLayouts(ctx.node, p.name, std::string("oneDNN failed: ") + e.what());
  }
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlPool(const KernelBuildContext& ctx) {
  if (AnyNhwc(ctx)) return CreateNhwcPool(ctx);
  PoolGeometry p;
  if (!ComputePoolGeometry(ctx, p)) return nullptr;
  OmpThreadsGuard threads(ctx.num_threads);
  dnnl::pooling_forward::primitive_desc pd = MakePoolPd(p, Layout::kPlain);
  // oneDNN pools (u)int8 only channels-last (jit:uni_i8i8), and plain float32 with a scalar loop ("simple_nchw"):
  // reorders bridge plain tensors to a channels-last jit kernel (ResNet's stem pool, [1, 64, 112, 112]: 4 ms -> 0.2 ms
  // for uint8 against the reference kernel; 5.7 ms -> 0.44 ms for float32, where a quantised tf2onnx export
  // leaves it plain).
  if ((!pd || std::strncmp(pd.impl_info_str(), "simple", 6) == 0) && p.x.size() == 4)
    if (auto nhwc = MakePoolPd(p, Layout::kNhwc)) pd = nhwc;
  if (!pd) return nullptr;
  const memory::desc src_md = PlainDesc(ToDims(p.x), p.type), dst_md = PlainDesc(ToDims(p.y), p.type);
  return std::make_unique<DnnlUnaryKernel>(p.name, dnnl::pooling_forward(pd), pd, p.x, Layout::kPlain, src_md, p.y,
                                           Layout::kPlain, dst_md, p.dtype);
}

double DnnlNhwcPoolMs(const KernelBuildContext& ctx) {
  PoolGeometry p;
  if (ctx.input_shapes.empty() || ctx.input_shapes[0].size() != 4 || !ComputePoolGeometry(ctx, p)) return 1e30;
  OmpThreadsGuard threads(ctx.num_threads);
  const dnnl::pooling_forward::primitive_desc pd = MakePoolPd(p, Layout::kNhwc);
  return pd ? PrimitiveMs(pd, 3) : 1e30;
}

bool DnnlPoolSupportsNhwc(const KernelBuildContext& ctx) {
  PoolGeometry p;
  if (ctx.input_shapes.empty() || !ChannelsLastRank(ctx.input_shapes[0].size()) || !ComputePoolGeometry(ctx, p))
    return false;
  OmpThreadsGuard threads(ctx.num_threads);
  return static_cast<bool>(MakePoolPd(p, Layout::kNhwc));
}

std::unique_ptr<Kernel> CreateDnnlSoftmax(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (!AllFloat32(ctx) || ctx.input_shapes.size() != 1 || ctx.output_shapes.size() != 1) return nullptr;
  const Shape& x = ctx.input_shapes[0];
  if (x.empty() || x.size() > 6 || !AllPositive(x) || ctx.output_shapes[0] != x) return nullptr;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = node.GetInt("axis", ctx.opset >= 13 ? -1 : 1);
  if (axis < -rank || axis >= rank) return nullptr;
  if (axis < 0) axis += rank;
  // Before opset 13 the op flattens to 2-D at `axis`; that equals a softmax over one axis only for the last axis.
  if (ctx.opset < 13 && axis != rank - 1) return nullptr;
  const bool log = node.op_type == "LogSoftmax";
  const memory::desc md = PlainDesc(ToDims(x));

  OmpThreadsGuard threads(ctx.num_threads);
  dnnl::softmax_forward::primitive_desc pd(
      CpuEngine(), dnnl::prop_kind::forward_inference,
      log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md, md, static_cast<int>(axis), BaseAttr(),
      /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return CreateStridedSoftmax(ctx, axis);
  return std::make_unique<DnnlUnaryKernel>(log ? "LogSoftmaxF32Dnnl" : "SoftmaxF32Dnnl", dnnl::softmax_forward(pd), pd,
                                           x, Layout::kPlain, md, x, Layout::kPlain, md);
}

}  // namespace osprey::cpu
