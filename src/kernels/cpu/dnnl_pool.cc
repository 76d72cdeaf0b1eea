// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool on oneDNN's pooling primitive, and Softmax /
// LogSoftmax on its softmax primitives. All work on the plain layout directly: they are memory-bound, so a reorder
// would cost as much as the op itself.
#include <algorithm>
#include <unordered_map>

#include "kernels/cpu/dnnl_common.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;

// One primitive reading input 0 and writing output 0, both plain, with the same shapes on every run.
class DnnlUnaryKernel final : public Kernel {
 public:
  DnnlUnaryKernel(const char* name, dnnl::primitive primitive, const dnnl::primitive_desc_base& pd, Shape in_shape,
                  Shape out_shape)
      : name_(name),
        primitive_(std::move(primitive)),
        src_md_(PlainDesc(ToDims(in_shape))),
        dst_md_(PlainDesc(ToDims(out_shape))),
        scratch_md_(pd.scratchpad_desc()),
        in_shape_(std::move(in_shape)),
        out_shape_(std::move(out_shape)) {}

  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    CheckShape(ctx.node, name_, "input", ctx.In(0), in_shape_);
    CheckShape(ctx.node, name_, "output", ctx.Out(0), out_shape_);
    RunDnnl(ctx.node, name_, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(scratch_md_.get_size());
      primitive_.execute(stream, {{DNNL_ARG_SRC, WrapMemory(src_md_, ctx.In(0).raw())},
                                  {DNNL_ARG_DST, WrapMemory(dst_md_, ctx.Out(0).raw())},
                                  {DNNL_ARG_SCRATCHPAD, memory(scratch_md_, CpuEngine(), scratch)}});
      stream.wait();
    });
  }

 private:
  const char* name_;
  dnnl::primitive primitive_;
  memory::desc src_md_, dst_md_, scratch_md_;
  Shape in_shape_, out_shape_;
};

bool AllPositive(const Shape& s) {
  for (int64_t d : s)
    if (d <= 0) return false;
  return true;
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlPool(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  const std::string& op = node.op_type;
  // MaxPool's optional Indices output has no oneDNN equivalent in inference.
  if (!AllFloat32(ctx) || ctx.input_shapes.size() != 1 || ctx.output_shapes.size() != 1) return nullptr;
  const Shape& x = ctx.input_shapes[0];
  const Shape& y = ctx.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank < 3 || rank > 5 || static_cast<int64_t>(y.size()) != rank || !AllPositive(x) || !AllPositive(y))
    return nullptr;
  if (y[0] != x[0] || y[1] != x[1]) return nullptr;
  const int64_t spatial = rank - 2;
  const bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  const bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  const char* name = is_max ? (global ? "GlobalMaxPoolF32Dnnl" : "MaxPoolF32Dnnl")
                            : (global ? "GlobalAveragePoolF32Dnnl" : "AveragePoolF32Dnnl");

  memory::dims kernel, strides, dilation, pad_l, pad_r;
  dnnl::algorithm algorithm = is_max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  if (global) {
    for (int64_t i = 0; i < spatial; ++i) {
      if (y[2 + i] != 1) return nullptr;
      kernel.push_back(x[2 + i]);
      strides.push_back(1);
      dilation.push_back(0);
      pad_l.push_back(0);
      pad_r.push_back(0);
    }
  } else {
    std::vector<int64_t> k = node.GetInts("kernel_shape");
    std::vector<int64_t> s = node.GetInts("strides", std::vector<int64_t>(spatial, 1));
    std::vector<int64_t> d = node.GetInts("dilations", std::vector<int64_t>(spatial, 1));
    std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * spatial, 0));
    if (static_cast<int64_t>(k.size()) != spatial || static_cast<int64_t>(s.size()) != spatial ||
        static_cast<int64_t>(d.size()) != spatial || static_cast<int64_t>(pads.size()) != 2 * spatial)
      return nullptr;
    const bool count_include_pad = !is_max && node.GetInt("count_include_pad", 0) != 0;
    if (count_include_pad) algorithm = dnnl::algorithm::pooling_avg_include_padding;
    const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
    for (int64_t i = 0; i < spatial; ++i) {
      const int64_t in = x[2 + i], out = y[2 + i];
      if (k[i] <= 0 || s[i] <= 0 || d[i] <= 0) return nullptr;
      const int64_t k_eff = (k[i] - 1) * d[i] + 1;
      int64_t pl = pads[i], pr = pads[spatial + i];
      if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
        const int64_t total = std::max<int64_t>(0, ((in + s[i] - 1) / s[i] - 1) * s[i] + k_eff - in);
        pl = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        pr = total - pl;
      } else if (auto_pad == "VALID") {
        pl = pr = 0;
      } else if (auto_pad != "NOTSET") {
        return nullptr;
      }
      if (pl < 0 || pr < 0) return nullptr;
      // oneDNN sizes the output with floor division. ceil_mode's extra window (and any other rounding the schema
      // chose) is expressed by growing padding_r until the floor formula gives the inferred output size.
      const int64_t span = in + pl + pr - k_eff;
      if (span < 0 || span / s[i] + 1 != out) {
        const int64_t needed = (out - 1) * s[i] + k_eff - in - pl;
        if (needed < pr) return nullptr;
        // With count_include_pad both oneDNN and ONNX (reference and ONNX Runtime) divide by the whole kernel,
        // ceil_mode overhang included, so the grown padding changes nothing else.
        pr = needed;
      }
      // A window lying wholly in padding has no defined oneDNN result.
      if (pl >= k_eff || (out - 1) * s[i] - pl >= in) return nullptr;
      kernel.push_back(k[i]);
      strides.push_back(s[i]);
      dilation.push_back(d[i] - 1);
      pad_l.push_back(pl);
      pad_r.push_back(pr);
    }
  }

  OmpThreadsGuard threads(ctx.num_threads);
  dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, algorithm, PlainDesc(ToDims(x)),
                                      PlainDesc(ToDims(y)), strides, kernel, dilation, pad_l, pad_r);
  dnnl::pooling_v2_forward::primitive_desc pd(desc, BaseAttr(), CpuEngine(), /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return nullptr;
  return std::make_unique<DnnlUnaryKernel>(name, dnnl::pooling_v2_forward(pd), pd, x, y);
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
  if (log) {
    dnnl::logsoftmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, static_cast<int>(axis));
    dnnl::logsoftmax_forward::primitive_desc pd(desc, BaseAttr(), CpuEngine(), /*allow_empty=*/true);
    if (!pd || IsReferenceImpl(pd)) return nullptr;
    return std::make_unique<DnnlUnaryKernel>("LogSoftmaxF32Dnnl", dnnl::logsoftmax_forward(pd), pd, x, x);
  }
  dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, static_cast<int>(axis));
  dnnl::softmax_forward::primitive_desc pd(desc, BaseAttr(), CpuEngine(), /*allow_empty=*/true);
  if (!pd || IsReferenceImpl(pd)) return nullptr;
  return std::make_unique<DnnlUnaryKernel>("SoftmaxF32Dnnl", dnnl::softmax_forward(pd), pd, x, x);
}

}  // namespace osprey::cpu
