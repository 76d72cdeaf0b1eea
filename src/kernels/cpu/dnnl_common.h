#pragma once
// Shared plumbing for the oneDNN kernels: the process-wide engine, per-thread streams and scratch memory, plain
// memory descriptors, fused-activation post-ops and weight prepacking.
//
// Thread-safety: oneDNN primitives are immutable once created and may be executed from several threads at once.
// Everything a Run call mutates (stream, scratch memory, dnnl::memory handles) is per calling thread or lent to one
// call at a time (PerCaller).
#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/thread_scratch.h"
#include "kernels/kernel.h"

namespace osprey::cpu {

/// The CPU engine, created on first use and shared by every kernel in the process.
const dnnl::engine& CpuEngine();

/// A stream on CpuEngine() owned by the calling thread (a stream is not meant to be shared between threads).
dnnl::stream& ThreadStream();

/// Sets the OpenMP thread count of the calling thread for the guard's lifetime. oneDNN (OpenMP runtime) fixes a
/// primitive's thread partitioning when the primitive is created, so kernels are created under this guard with the
/// plan's thread count. num_threads <= 0 leaves the setting alone.
class OmpThreadsGuard {
 public:
  explicit OmpThreadsGuard(int num_threads);
  ~OmpThreadsGuard();
  OmpThreadsGuard(const OmpThreadsGuard&) = delete;
  OmpThreadsGuard& operator=(const OmpThreadsGuard&) = delete;

 private:
  int previous_ = 0;
};

/// oneDNN dims from an osprey shape.
dnnl::memory::dims ToDims(const Shape& shape);

/// Dense row-major descriptor for `dims` (the layout of every osprey tensor), float32 unless `type` says otherwise.
dnnl::memory::desc PlainDesc(const dnnl::memory::dims& dims,
                             dnnl::memory::data_type type = dnnl::memory::data_type::f32);

/// `md` (a strided descriptor, no inner blocks) with its element type replaced, e.g. the bf16 twin of an fp32
/// descriptor.
inline dnnl::memory::desc WithDataType(const dnnl::memory::desc& md, dnnl::memory::data_type type) {
  return dnnl::memory::desc(md.get_dims(), type, md.get_strides());
}

/// Wraps a caller-owned buffer (no copy). oneDNN takes a non-const handle; read-only inputs are never written.
inline dnnl::memory WrapMemory(const dnnl::memory::desc& desc, const void* data) {
  return dnnl::memory(desc, CpuEngine(), const_cast<void*>(data));
}

/// A memory of `desc` with no buffer yet: a kernel's run state points it at each run's buffer with Point.
inline dnnl::memory UnboundMemory(const dnnl::memory::desc& desc) {
  return dnnl::memory(desc, CpuEngine(), DNNL_MEMORY_NONE);
}

/// Points `memory` at `data` for this run (no allocation; oneDNN's handle is non-const, inputs are never written).
inline void Point(const dnnl::memory& memory, const void* data) { memory.set_data_handle(const_cast<void*>(data)); }

/// The arguments of one primitive execution, put together once: the memories a kernel's run state points at each
/// run's buffers (Point), and fixed ones (packed weights). Execute passes them to oneDNN as a ready array. Making the
/// dnnl::memory objects and the argument map per run cost an aligned allocation and a descriptor copy per argument,
/// 1.5 us of a small convolution's 2.6 us step (docs/performance.md, "Fifteenth session").
class ExecArgs {
 public:
  ExecArgs& Add(int arg, const dnnl::memory& memory) {
    memories_.push_back(memory);
    args_.push_back({arg, memory.get()});
    return *this;
  }
  void Execute(const dnnl::primitive& primitive, const dnnl::stream& stream) const {
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(primitive.get(), stream.get(), static_cast<int>(args_.size()), args_.data()),
        "could not execute a primitive");
  }

 private:
  std::vector<dnnl::memory> memories_;  // keeps the handles in args_ alive
  std::vector<dnnl_exec_arg_t> args_;
};

/// The memories around a primitive that reads a kernel's input 0 and writes its output 0 through reorders where their
/// layouts differ from the primitive's (Conv, pools): the user tensors, the primitive's src/dst (the user tensors
/// themselves without a reorder), its scratchpad and the reorders', laid out in the thread's scratch as
/// [src | dst | scratchpad | reorder scratchpad] (sizes rounded with ThreadScratch::Align); and the reorders'
/// arguments.
struct ReorderedIo {
  ReorderedIo(const dnnl::memory::desc& user_src_md, const dnnl::memory::desc& src_md,
              const dnnl::memory::desc& user_dst_md, const dnnl::memory::desc& dst_md,
              const dnnl::memory::desc& scratch_md, const dnnl::memory::desc& reorder_scratch_md)
      : reorder_src(src_md != user_src_md), reorder_dst(dst_md != user_dst_md) {
    user_src = UnboundMemory(user_src_md);
    user_dst = UnboundMemory(user_dst_md);
    src = reorder_src ? UnboundMemory(src_md) : user_src;
    dst = reorder_dst ? UnboundMemory(dst_md) : user_dst;
    scratchpad = UnboundMemory(scratch_md);
    reorder_scratchpad = UnboundMemory(reorder_scratch_md);
    if (reorder_src)
      src_reorder.Add(DNNL_ARG_FROM, user_src).Add(DNNL_ARG_TO, src).Add(DNNL_ARG_SCRATCHPAD, reorder_scratchpad);
    if (reorder_dst)
      dst_reorder.Add(DNNL_ARG_FROM, dst).Add(DNNL_ARG_TO, user_dst).Add(DNNL_ARG_SCRATCHPAD, reorder_scratchpad);
  }
  /// Points every memory at this run's buffers: `in`, `out` and the regions of `scratch`.
  void Point(const void* in, void* out, char* scratch, size_t src_bytes, size_t dst_bytes, size_t scratch_bytes) const {
    cpu::Point(user_src, in);
    cpu::Point(user_dst, out);
    if (reorder_src) cpu::Point(src, scratch);
    if (reorder_dst) cpu::Point(dst, scratch + src_bytes);
    cpu::Point(scratchpad, scratch + src_bytes + dst_bytes);
    cpu::Point(reorder_scratchpad, scratch + src_bytes + dst_bytes + scratch_bytes);
  }

  bool reorder_src, reorder_dst;
  dnnl::memory user_src, user_dst, src, dst, scratchpad, reorder_scratchpad;
  ExecArgs src_reorder, dst_reorder;
};

/// State a kernel keeps from run to run, one T per concurrent caller (one plan may serve several threads at once):
/// Acquire lends a free one, made by `make()` when none is free, until the lease ends. Grows to the most callers
/// seen at once.
template <class T>
class PerCaller {
 public:
  class Lease {
   public:
    Lease(PerCaller* owner, std::unique_ptr<T> item) : owner_(owner), item_(std::move(item)) {}
    Lease(Lease&&) noexcept = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (item_) owner_->Return(std::move(item_));
    }
    T& operator*() const { return *item_; }
    T* operator->() const { return item_.get(); }

   private:
    PerCaller* owner_;
    std::unique_ptr<T> item_;
  };

  template <class Make>
  Lease Acquire(const Make& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        std::unique_ptr<T> item = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(item));
      }
    }
    return Lease(this, std::make_unique<T>(make()));
  }

 private:
  void Return(std::unique_ptr<T> item) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(item));
  }
  std::mutex mutex_;
  std::vector<std::unique_ptr<T>> free_;
};

/// Appends the post-ops for the node's fused activation (`_activation`, `_alpha`, `_beta`: ops/activation.h, see
/// docs/architecture.md). Returns false when `_activation` names no activation, so the caller can fall back to the
/// reference kernel.
bool AppendFusedActivation(const Node& node, dnnl::post_ops& ops);
/// Whether the node's fused activation is SiLU and the kernel should apply it itself after its primitive
/// (SiluInPlace, where the fast pass exists) instead of as oneDNN's swish post-op, ~2.3x slower per element
/// (dnnl_conv.cc, dnnl_matmul.cc).
bool OwnSiluActivation(const Node& node);
/// Whether the node's fused activation is GELU's tanh form and a MatMul kernel should apply it itself after its
/// primitive (GeluTanhInPlace) instead of as oneDNN's gelu_tanh post-op: on gemm:jit (AVX2) that made a Keras ViT's
/// [1568, 192] x [192, 768] take 5.2-6.2 ms against 3.7 with the pass (the product alone ~2.6-3.1). The erf form
/// stays a post-op (even within the noise: torchvision's vit_b_16 and convnext_tiny, 2-vCPU EPYC Zen 3).
/// OSPREY_OWN_GELU=0 leaves it to oneDNN in the plans compiled while it is set (comparisons).
bool OwnGeluActivation(const Node& node);

/// True when every present input and every output is float32.
bool AllFloat32(const KernelBuildContext& ctx);

/// True when the primitive oneDNN picked is one of its slow reference implementations; osprey's own reference
/// kernel is then at least as good, so the factory declines.
bool IsReferenceImpl(const dnnl::primitive_desc_base& pd);

/// For a plain (row-major, dense) weights layout whose row stride is a multiple of 256 elements, the same layout with
/// 16 more elements per row (rows stay 64-byte aligned); else a zero desc (is_zero(): a memory::desc converts to true
/// either way). Rows 1 KiB apart put the rows a GEMM packs together into the same few cache sets (dnnl_matmul.cc).
dnnl::memory::desc PaddedRows(const dnnl::memory::desc& md);

/// A weight reordered into the layout a primitive prefers, in a host buffer shared through the weight store when the
/// build context has one (charged to it) and private otherwise.
struct PackedWeight {
  std::shared_ptr<Buffer> buffer;
  dnnl::memory memory;
};

/// The constant `source` (described by `from`) reordered into the layout `to`, multiplied by `scale` on the way: the
/// live pack of the same weight buffer, layouts and scale when the weight store has one (another plan, batch size or
/// model made it), else a new one. Runs on the calling thread at kernel creation.
PackedWeight PackWeight(const KernelBuildContext& ctx, const dnnl::memory::desc& from, const Tensor& source,
                        const dnnl::memory::desc& to, float scale = 1.f);

/// How a tuning key holds the size of an activation [N, C, spatial...]: C exactly, the product of the other dims
/// (images x pixels) by its size class, `n` with all but its two leading bits cleared (exact up to 16, then 16, 24, 32,
/// 48, 64, 96, ...). Shapes of one class share their choices: a model with free image dims (an OCR detector at each
/// page's size) was timed again at every new size, its first request 6x what it took with the choice remembered
/// (PP-OCRv4's detector: 950 against 150 ms, docs/performance.md "Forty-first session"). Which implementation wins
/// moves with the channels, the window and the amount of work, not with a few pixels more.
std::string TuningActivationKey(const dnnl::memory::dims& dims);

/// The same for a MatMul operand: its data type and layout (the order of its strides, dense or not, inner blocks) and
/// its dims: kExact all of them (a constant weight), kRowsByClass the last exactly and the product of the others by
/// size class (an activation [rows, K] by a constant weight: tokens or pixels vary, K and N do not), kAllByClass
/// each by size class (both operands computed: attention's [T, d] x [d, T] products vary in every dim with T).
enum class TuningDims { kExact, kRowsByClass, kAllByClass };
std::string TuningOperandKey(const dnnl::memory::desc& md, TuningDims dims);

/// Position of the fastest of oneDNN's implementations of the operation `make()` describes (0: oneDNN's first
/// choice), timed on this machine at the calling thread's OpenMP thread count; remembered per `key` (which must
/// describe the operation, its attributes and layouts completely, its sizes at least by class: TuningActivationKey)
/// and thread count for the life of the process. `make` returns a new primitive descriptor each call (only a new one
/// can step through the list). See dnnl_common.cc.
int FastestImplPosition(const std::function<dnnl::primitive_desc()>& make, const std::string& key);

/// Moves `pd` on to the implementation remembered for `key` (FastestImplPosition's choice, in force) and returns true
/// when it has that name; false otherwise (`pd` may have moved: make a new one).
bool MoveToRememberedImpl(dnnl::primitive_desc& pd, const std::string& key);

/// The primitive descriptor `make()` returns, moved on to the fastest of oneDNN's implementations of its operation
/// (FastestImplPosition) when `ctx.tune`, else oneDNN's first choice; empty when `make()` is.
template <class Pd, class Make>
Pd FastestImpl(const KernelBuildContext& ctx, const Make& make, const std::string& key) {
  Pd pd = make();
  if (!pd || !ctx.tune) return pd;
  // A remembered choice costs this one descriptor (a new input shape builds every kernel again: PP-OCR's recogniser
  // at each new width).
  if (MoveToRememberedImpl(pd, key)) return pd;
  pd = make();
  const int position = FastestImplPosition([&make] { return dnnl::primitive_desc(make()); }, key);
  for (int i = 0; i < position; ++i)
    if (!pd.next_impl()) return make();  // cannot happen: the list does not change
  return pd;
}


/// For Bf16Use::kIfFaster: whether a kernel should run `bf16` (a primitive reading bf16 source and weights) rather
/// than `f32` (the same operation in float32). True when bf16 is faster on this machine, counting the reorders
/// between the kernel's float32 tensors `user_src` / `user_dst` and each primitive's layouts (timed like
/// FastestImplPosition and remembered under `key`), and when on a seeded random input with the real weights
/// (`weights`, laid out as `weights_plain`) its output is within 1% relative RMS of the float32 one. See
/// dnnl_common.cc.
bool PreferBf16(const std::string& key, const dnnl::primitive_desc& f32, const dnnl::primitive_desc& bf16,
                const dnnl::memory::desc& user_src, const dnnl::memory::desc& user_dst,
                const dnnl::memory::desc& weights_plain, const void* weights);

/// Writes back and drops the cache lines of [data, data + bytes) from every cache level, so the next read comes from
/// memory: how a layer's weights are met in a model, where the other layers' weights and activations pass through
/// the caches between two runs of it (timing a kernel alone with hot weights favoured kernels that read more of them).
void EvictFromCaches(const void* data, size_t bytes);

/// Whether a kernel of osprey's own is faster on this machine than the oneDNN primitive `pd` doing the same operation,
/// by a margin (timed at most `margin` x oneDNN's; by default 0.85: a near tie goes to oneDNN's, and a kernel whose
/// timing alone flatters it needs more): `time_own` returns its milliseconds per run (the
/// best of a few on zero-filled tensors with its weights evicted before each, as `pd` is timed); the two are timed
/// alternately, twice each, and the verdict remembered under `key` like the implementation choices (names "own" /
/// "onednn"; a verdict timed under load is provisional). `onednn_extra`, when given, returns the milliseconds oneDNN's
/// kernel spends outside the primitive on the same run (a reorder of its source, a SiLU pass), added to pd's. See
/// dnnl_common.cc.
inline constexpr double kOwnKernelMargin = 0.85;
bool PreferOwnKernel(const std::string& key, const std::function<double()>& time_own,
                     const dnnl::primitive_desc_base& pd, const std::function<double()>& onednn_extra = nullptr,
                     double margin = kOwnKernelMargin);
/// Whether `first` is faster than `second` on this machine (each returns its milliseconds per run), timed alternately
/// twice each and remembered under `key` (with the thread count) like every tuning choice; names `first_name` /
/// `second_name`. For choices between two ways of running osprey's own kernels.
bool PreferFirstTimed(const std::string& key, const char* first_name, const char* second_name,
                      const std::function<double()>& first, const std::function<double()>& second);
/// Milliseconds of one run of the primitive `pd` describes on zero-filled arguments, the best of `runs` after one
/// untimed; 1e30 when oneDNN cannot create or run it.
double PrimitiveMs(const dnnl::primitive_desc_base& pd, int runs);
/// The verdict PreferOwnKernel remembered for `key` (true: osprey's kernel) when one is in force, so a factory can
/// build only the kernel it will use.
std::optional<bool> RememberedOwnVerdict(const std::string& key);

/// `fn()`, or a value-initialised result when oneDNN throws: building or measuring a bf16 primitive that fails (seen
/// once: "could not create a memory object" while timing a batch-8 convolution) leaves the kernel on fp32 instead of
/// failing the compile.
template <class Fn>
auto TryBf16(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const dnnl::error&) {
    return {};
  }
}

/// sqrt(sum (got - want)^2 / sum want^2): 0 for equal vectors, huge when sizes differ or only `want` is all zero.
double RelativeRmsDifference(const std::vector<float>& want, const std::vector<float>& got);

/// Bytes describing a blocked or plain descriptor (dims, type, layout), for keys; empty for other format kinds.
std::string BlockedDescKey(const dnnl::memory::desc& md);

/// Scratchpad bytes the primitive needs per execution (user scratchpad mode).
inline size_t ScratchpadBytes(const dnnl::primitive_desc_base& pd) { return pd.scratchpad_desc().get_size(); }

/// Attributes every osprey primitive starts from: user-managed scratchpad (allocated per call from ThreadScratch),
/// which keeps concurrent executions of one primitive independent.
dnnl::primitive_attr BaseAttr();

/// What ReorderedIo needs, made once at kernel build for a primitive reading `src` and writing `dst` where the kernel's
/// user tensors are `user_src` / `user_dst`: the reorders where the layouts differ, the reorders' scratchpad
/// descriptor, and the byte sizes of ReorderedIo's scratch regions (ThreadScratch::Reserve(TotalBytes())).
struct IoReorders {
  IoReorders() = default;
  IoReorders(const dnnl::memory::desc& user_src_md, const dnnl::memory::desc& src_md,
             const dnnl::memory::desc& user_dst_md, const dnnl::memory::desc& dst_md,
             const dnnl::memory::desc& scratchpad_md)
      : user_src(user_src_md), src(src_md), user_dst(user_dst_md), dst(dst_md), scratchpad(scratchpad_md) {
    reorder_src = src != user_src;
    reorder_dst = dst != user_dst;
    size_t reorder_scratch = 0;
    auto make = [&](const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
      dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, BaseAttr());
      reorder_scratch = std::max(reorder_scratch, pd.scratchpad_desc().get_size());
      return dnnl::reorder(pd);
    };
    if (reorder_src) src_reorder = make(user_src, src);
    if (reorder_dst) dst_reorder = make(dst, user_dst);
    reorder_scratchpad = dnnl::memory::desc({static_cast<int64_t>(std::max<size_t>(reorder_scratch, 1))},
                                            dnnl::memory::data_type::u8, dnnl::memory::format_tag::x);
    src_bytes = reorder_src ? ThreadScratch::Align(src.get_size()) : 0;
    dst_bytes = reorder_dst ? ThreadScratch::Align(dst.get_size()) : 0;
    scratch_bytes = ThreadScratch::Align(scratchpad.get_size());
    reorder_scratch_bytes = ThreadScratch::Align(reorder_scratch);
  }
  size_t TotalBytes() const { return src_bytes + dst_bytes + scratch_bytes + reorder_scratch_bytes; }
  /// A fresh set of memories and reorder arguments for one caller.
  ReorderedIo MakeIo() const { return ReorderedIo(user_src, src, user_dst, dst, scratchpad, reorder_scratchpad); }
  /// Points `io` at this run's buffers (`scratch`: TotalBytes() from ThreadScratch).
  void Point(const ReorderedIo& io, const void* in, void* out, char* scratch) const {
    io.Point(in, out, scratch, src_bytes, dst_bytes, scratch_bytes);
  }

  dnnl::memory::desc user_src, src, user_dst, dst, scratchpad, reorder_scratchpad;
  bool reorder_src = false, reorder_dst = false;
  dnnl::reorder src_reorder, dst_reorder;
  size_t src_bytes = 0, dst_bytes = 0, scratch_bytes = 0, reorder_scratch_bytes = 0;
};

/// Descriptor of an activation of logical shape `shape` stored in `layout`: plain row-major, or (kNhwc, ranks 4 and 5)
/// channels last. Dims are always the logical ones; only the strides differ. Float32 unless `type` says otherwise.
dnnl::memory::desc ActivationDesc(const Shape& shape, Layout layout,
                                  dnnl::memory::data_type type = dnnl::memory::data_type::f32);

/// True when the build context asks for kNhwc on any input or output.
bool AnyNhwc(const KernelBuildContext& ctx);

/// Like CheckShape for a tensor the kernel reads or writes in `layout`. A kNhwc tensor's shape may be its physical one
/// ([N, H, W, C], as the runtime's channels-last views have) or the logical one; both describe the same bytes.
void CheckActivation(const Node& node, const char* kernel_name, const char* what, const Tensor& tensor,
                     const Shape& logical, Layout layout, DType dtype = DType::kF32);

/// Thrown by a factory asked for channels-last layouts it cannot honour (the runtime should have asked
/// CpuKernelSupportsNhwc first): falling back to a plain reference kernel would read the memory wrongly.
[[noreturn]] void ThrowUnsupportedLayouts(const Node& node, const char* kernel_name, const std::string& why);

/// Runs `fn`, translating a dnnl::error into osprey Error(kInternal) naming the node.
template <class Fn>
void RunDnnl(const Node& node, const char* kernel_name, Fn&& fn) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, node.Describe() + ": " + kernel_name + " failed in oneDNN: " + e.what());
  }
}

/// Throws kInternal when a run-time tensor does not have the shape (and type, float32 unless given) the kernel was
/// built for.
void CheckShape(const Node& node, const char* kernel_name, const char* what, const Tensor& tensor,
                const Shape& expected, DType dtype = DType::kF32);

// Factories, one per op family; each returns nullptr for cases it does not handle.
std::unique_ptr<Kernel> CreateDnnlConv(const KernelBuildContext& ctx);
std::unique_ptr<Kernel> CreateDnnlMatMul(const KernelBuildContext& ctx);
std::unique_ptr<Kernel> CreateDnnlMatMulViews(const KernelBuildContext& ctx);  // _MatMulViews, dnnl_matmul.cc
/// A Conv carrying `_int8` attributes (fusion_qdq.cc: QDQ's DequantizeLinear -> Conv -> QuantizeLinear ->
/// DequantizeLinear) on oneDNN's u8 x s8 convolution, float32 in and out (dnnl_conv_int8.cc); nullptr where oneDNN
/// offers only a reference implementation. Input 0 and output 0 may be NHWC.
std::unique_ptr<Kernel> CreateDnnlConvInt8(const KernelBuildContext& ctx);
std::unique_ptr<Kernel> CreateDnnlMatMulInt8(const KernelBuildContext& ctx);  // dnnl_matmul_int8.cc
std::unique_ptr<Kernel> CreateStftKernel(const KernelBuildContext& ctx);      // signal_kernels.cc
std::unique_ptr<Kernel> CreateDftKernel(const KernelBuildContext& ctx);       // signal_kernels.cc
/// A Conv of one input channel along one axis under 1-8 filters (a FIR filter bank: audio resamplers), fir_conv.cc.
std::unique_ptr<Kernel> CreateFirConv(const KernelBuildContext& ctx);
bool DnnlConvInt8SupportsNhwc(const KernelBuildContext& ctx);
/// The oneDNN implementation a CreateDnnlConvInt8 kernel runs ("" for another kernel).
const char* DnnlConvInt8Implementation(const Kernel& kernel);
std::unique_ptr<Kernel> CreateDnnlGemm(const KernelBuildContext& ctx);
/// One row times a constant matrix (MatMul / Gemm with one row, a 1x1 Conv on a 1x1 image; no activation): the
/// batch-1 classifier, with weights packed in 64-column panels (gemv_kernel.cc); nullptr otherwise or without AVX-512.
std::unique_ptr<Kernel> CreateGemv(const KernelBuildContext& ctx);
std::unique_ptr<Kernel> CreateDnnlPool(const KernelBuildContext& ctx);
/// MaxPool / AveragePool of plain float32 [N, C, W] or [N, C, H, W] data (plain_pool.cc: along the rows, where
/// oneDNN has a scalar loop or reorders), or nullptr.
std::unique_ptr<Kernel> CreatePlainPool(const KernelBuildContext& ctx);
/// ConvInteger / MatMulInteger with constant weights on the float32 kernels above, and DynamicQuantizeLinear
/// (integer_kernels.cc).
std::unique_ptr<Kernel> CreateIntegerKernel(const KernelBuildContext& ctx);
/// ConvTranspose on oneDNN's deconvolution (dnnl_deconv.cc).
std::unique_ptr<Kernel> CreateDnnlDeconv(const KernelBuildContext& ctx);
std::unique_ptr<Kernel> CreateDnnlSoftmax(const KernelBuildContext& ctx);
/// Hand-written BatchNormalization (inference) with the fused activation; plain for rank >= 2, kNhwc for rank 4.
std::unique_ptr<Kernel> CreateBatchNorm(const KernelBuildContext& ctx);

// Channels-last support tests behind CpuKernelSupportsNhwc: true when the factory above builds a kernel for this node
// that honours kNhwc on input 0 (Conv: and input 3, the residual) and output 0 in every combination.
bool DnnlConvSupportsNhwc(const KernelBuildContext& ctx);
/// Whether a Conv carrying a fused depthwise convolution (ops/fused_depthwise.h) gets oneDNN's fused kernel (not its
/// reference implementation, which runs the two convolutions one after the other) on NHWC tensors.
bool DnnlConvFusesDepthwise(const KernelBuildContext& ctx);
/// Whether a Conv carrying a fused PRelu (ops/activation.h HasFusedPRelu) gets a oneDNN kernel with the PRelu as a
/// post-op (not its reference implementation).
bool DnnlConvFusesPRelu(const KernelBuildContext& ctx);
/// True when `ctx.node`, a Conv with a fused input affine or parts (ops/conv_input_scale.h), gets osprey's 1x1 kernel
/// (pointwise_conv.cc): every part, the residual and the output channels-last, float32, a window it takes.
bool CpuConvTakesFusedInput(const KernelBuildContext& ctx);
/// True when `ctx.node`, a Conv carrying a fused MaxPool (ops/fused_pool.h), gets osprey's first-layer kernel
/// (stem_conv.cc), the only one that runs it.
bool CpuConvFusesPool(const KernelBuildContext& ctx);
bool DnnlPoolSupportsNhwc(const KernelBuildContext& ctx);
/// Milliseconds of one run of oneDNN's pool for the pooling node `ctx.node` on channels-last tensors (1e30: none).
double DnnlNhwcPoolMs(const KernelBuildContext& ctx);
bool BatchNormSupportsNhwc(const KernelBuildContext& ctx);
bool DnnlDeconvSupportsNhwc(const KernelBuildContext& ctx);

/// The layout conversion kernel of CreateLayoutReorderKernel (cpu_kernels.h), a oneDNN reorder.
std::unique_ptr<Kernel> CreateDnnlLayoutReorder(const Shape& shape, Layout from, Layout to, int num_threads);

}  // namespace osprey::cpu
