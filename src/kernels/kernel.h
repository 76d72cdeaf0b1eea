#pragma once
// The kernel interface shared by reference and fast (oneDNN) kernels.
// Life cycle (after XNNPACK): a factory creates and prepares a kernel for concrete shapes at compile time; Run is
// called per execution with buffers and must not allocate large memory.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "osprey/device.h"
#include "osprey/graph.h"

namespace osprey {

/// Buffers for one execution of one node. Outputs are preallocated with the shapes computed at compile time.
struct KernelContext {
  const Node& node;
  int opset = 17;
  std::vector<const Tensor*> inputs;  // nullptr where omitted
  std::vector<Tensor*> outputs;
  const Tensor& In(int i) const { return *inputs[i]; }
  bool HasIn(int i) const { return i < static_cast<int>(inputs.size()) && inputs[i] != nullptr; }
  Tensor& Out(int i) const { return *outputs[i]; }
  /// Device steps: the run's stream (DeviceBackend::AcquireStream; work is queued on it, not waited for); host steps:
  /// null. `workspace`: Kernel::WorkspaceBytes() of scratch memory reserved for this step in the run's arena (the
  /// device's for device steps, the host's for host steps), null when the kernel asks for none.
  void* stream = nullptr;
  void* workspace = nullptr;
};

/// A reference kernel: plain, obviously-correct C++. The oracle for every fast kernel.
using ReferenceKernel = void (*)(KernelContext& ctx);

/// Physical memory order of a tensor. Shapes are always logical (ONNX order, e.g. NCHW); a kNhwc tensor of logical
/// shape [N, C, H, W] is stored as [N, H, W, C] (channels last), one of shape [N, C, D, H, W] as [N, D, H, W, C]. Only
/// float32 activations of rank 4 or 5 (ChannelsLastRank) are ever kNhwc.
enum class Layout : uint8_t { kPlain, kNhwc };

/// The ranks a kNhwc tensor may have: 4 (images) and 5 (volumes, video clips).
inline bool ChannelsLastRank(size_t rank) { return rank == 4 || rank == 5; }

/// The memory order of a kNhwc tensor of logical shape [N, C, spatial...]: [N, spatial..., C].
inline Shape ChannelsLastShape(const Shape& logical) {
  Shape r;
  r.reserve(logical.size());
  r.push_back(logical[0]);
  r.insert(r.end(), logical.begin() + 2, logical.end());
  r.push_back(logical[1]);
  return r;
}

/// Shape of the memory holding a tensor of logical shape `logical` in `layout` (ChannelsLastShape for kNhwc; shapes of
/// other ranks have no channels-last form and stay as they are).
inline Shape PhysicalShape(const Shape& logical, Layout layout) {
  return layout == Layout::kNhwc && ChannelsLastRank(logical.size()) ? ChannelsLastShape(logical) : logical;
}

/// How a kernel may use bfloat16. kIfFaster: per kernel, whichever of its bf16 and fp32 forms is faster on this
/// machine (timed at build time, including the conversion of its input to bf16) and, for bf16, agrees with fp32 on a
/// test input (cpu::PreferBf16); kYes: bf16 wherever oneDNN has a fast bf16 kernel.
enum class Bf16Use : uint8_t { kNo, kIfFaster, kYes };

/// What a fast-kernel factory sees at compile time.
struct KernelBuildContext {
  const Node& node;
  int opset = 17;
  std::vector<bool> present;
  std::vector<DType> input_dtypes;
  std::vector<Shape> input_shapes;
  std::vector<const Tensor*> input_values;  // non-null for constants (weights)
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;
  int num_threads = 1;
  /// Whether Conv/Gemm/MatMul factories may compute in bfloat16 (bf16 input and weights, fp32 accumulation, fp32 in
  /// and out) where oneDNN offers it (CompileOptions::precision; compile.cc maps it).
  Bf16Use bf16 = Bf16Use::kNo;
  /// Whether Conv/Gemm/MatMul factories time oneDNN's implementations and keep the fastest (FastestImpl); false: its
  /// first choice (CompileOptions::tune and OSPREY_TUNE=0).
  bool tune = true;
  /// Where the kernel runs. For a device (DeviceBackend::CreateKernel) every input and output of the step is a
  /// device tensor at run time, constants included (uploaded once); input_values still gives constants' host copies,
  /// for reading shapes, axes and scales at build time. Device steps are always kPlain (row-major, ONNX order).
  DeviceSpec device;
  /// Device kernels: compute Conv/Gemm/MatMul in float16 (fp32 in and out, fp32 accumulation where the library
  /// allows). CompileOptions::precision == kFp16.
  bool fp16 = false;
  /// Shares what a factory derives from a constant input (prepacked weights) across plans, batch sizes and models:
  /// returns the live buffer derived from `source` under `key`, or a new accounted one of `bytes` written by `fill`.
  /// Empty when compiling without a weight store; the factory then allocates its own.
  std::function<std::shared_ptr<Buffer>(const Tensor& source, const std::string& key, size_t bytes,
                                        const std::function<void(void* data)>& fill)>
      derive_weight;
  /// Layout of each input / output. Empty means all kPlain. A factory must honour these exactly (or return nullptr
  /// when they are all kPlain and it declines).
  std::vector<Layout> input_layouts;
  std::vector<Layout> output_layouts;
  Layout InLayout(int i) const { return i < static_cast<int>(input_layouts.size()) ? input_layouts[i] : Layout::kPlain; }
  Layout OutLayout(int i) const {
    return i < static_cast<int>(output_layouts.size()) ? output_layouts[i] : Layout::kPlain;
  }
};

/// A prepared fast kernel.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void Run(KernelContext& ctx) = 0;
  /// Name saying op, dtype and path, e.g. "ConvF32Dnnl".
  virtual const char* Name() const = 0;
  /// Scratch bytes each run needs (given as KernelContext::workspace, planned in the run's arena so concurrent runs
  /// never share it and a run allocates nothing). Device kernels must not allocate or synchronise in Run.
  virtual size_t WorkspaceBytes() const { return 0; }
  /// Host kernels: true when output 0 may share input `i`'s buffer (same bytes, same layout; element j of the output
  /// written only after element j of that input was read). The memory plan then gives them one buffer where the input
  /// dies at this step and no other input of the step reads its bytes (compile.cc). Convolutions with a residual say
  /// so for it; elementwise kernels do not (measured slower in place after a oneDNN producer, docs/architecture.md).
  virtual bool MayOverwriteInput(int /*i*/) const { return false; }
};

}  // namespace osprey
