// The layout conversion kernel the runtime's layout pass inserts between a channels-last (NHWC) producer and a
// consumer that needs plain NCHW, or the reverse: one oneDNN reorder primitive, created once.
#include <string>

#include "kernels/cpu/dnnl_common.h"

namespace osprey::cpu {
namespace {

constexpr const char* kReorderName = "LayoutReorderF32";

const char* LayoutName(Layout layout) { return layout == Layout::kNhwc ? "NHWC" : "plain"; }

// Input 0 in `from` -> output 0 in `to`. Run is thread-safe: the primitive is immutable and the stream and scratch
// memory belong to the calling thread.
class LayoutReorderKernel final : public Kernel {
 public:
  LayoutReorderKernel(const Shape& shape, Layout from, Layout to, int num_threads)
      : shape_(shape), from_(from), to_(to), numel_(NumElements(shape)) {
    if (numel_ == 0) return;  // nothing to move; oneDNN rejects zero-sized descriptors for reorders
    OmpThreadsGuard threads(num_threads);
    from_md_ = ActivationDesc(shape, from);
    to_md_ = ActivationDesc(shape, to);
    dnnl::reorder::primitive_desc pd(CpuEngine(), from_md_, CpuEngine(), to_md_, BaseAttr());
    reorder_ = dnnl::reorder(pd);
    scratch_md_ = pd.scratchpad_desc();
  }

  const char* Name() const override { return kReorderName; }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    if (ctx.inputs.empty() || ctx.outputs.empty() || !ctx.HasIn(0) || ctx.outputs[0] == nullptr)
      throw Error(ErrorCode::kInternal, node.Describe() + ": " + kReorderName + " needs one input and one output");
    CheckActivation(node, kReorderName, "input", ctx.In(0), shape_, from_);
    CheckActivation(node, kReorderName, "output", ctx.Out(0), shape_, to_);
    if (numel_ == 0) return;
    if (ctx.In(0).raw() == ctx.Out(0).raw())
      throw Error(ErrorCode::kInternal, node.Describe() + ": " + kReorderName + " cannot convert in place");
    RunDnnl(node, kReorderName, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(scratch_md_.get_size());
      const auto run = runs_.Acquire([this] {
        RunState r{UnboundMemory(from_md_), UnboundMemory(to_md_), UnboundMemory(scratch_md_), {}};
        r.args.Add(DNNL_ARG_FROM, r.from).Add(DNNL_ARG_TO, r.to).Add(DNNL_ARG_SCRATCHPAD, r.scratchpad);
        return r;
      });
      Point(run->from, ctx.In(0).raw());
      Point(run->to, ctx.Out(0).raw());
      Point(run->scratchpad, scratch);
      run->args.Execute(reorder_, stream);
      stream.wait();
    });
  }

 private:
  // The memories and argument array of one run (one set per concurrent caller, PerCaller).
  struct RunState {
    dnnl::memory from, to, scratchpad;
    ExecArgs args;
  };
  Shape shape_;
  Layout from_, to_;
  int64_t numel_;
  dnnl::memory::desc from_md_, to_md_, scratch_md_;
  dnnl::reorder reorder_;
  PerCaller<RunState> runs_;
};

}  // namespace

std::unique_ptr<Kernel> CreateDnnlLayoutReorder(const Shape& shape, Layout from, Layout to, int num_threads) {
  if (!ChannelsLastRank(shape.size()))
    throw Error(ErrorCode::kInternal,
                std::string(kReorderName) + ": layouts convert only rank-4 and rank-5 tensors, got shape " +
                    ShapeToString(shape) + " (" + LayoutName(from) + " to " + LayoutName(to) + ")");
  for (int64_t d : shape)
    if (d < 0)
      throw Error(ErrorCode::kInternal,
                  std::string(kReorderName) + ": negative dimension in shape " + ShapeToString(shape));
  try {
    return std::make_unique<LayoutReorderKernel>(shape, from, to, num_threads);
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string(kReorderName) + ": oneDNN could not build the reorder for " +
                                          ShapeToString(shape) + ": " + e.what());
  }
}

}  // namespace osprey::cpu
