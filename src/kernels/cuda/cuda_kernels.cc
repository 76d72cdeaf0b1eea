// CreateKernel of the CUDA backend: which node gets which device kernel, with everything derivable from shapes,
// attributes and constant inputs computed here, at build time (geometry, strides, constants), so Run only launches.
// Conv (cuDNN) is in cuda_conv.cc, Gemm/MatMul (cuBLAS) in cuda_gemm.cc. A nullptr means "run this step on the host";
// every case a kernel does not implement exactly as the reference kernel does is declined that way.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ops/slice.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/reference/reference.h"
#include "ops/activation.h"
#include "ops/op_registry.h"

namespace osprey::cuda {

namespace {

// The device code of an activation (kUnaryIdentity for kNone).
int UnaryCodeOf(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kNone:
      return kUnaryIdentity;
    case ActivationKind::kRelu:
      return kUnaryRelu;
    case ActivationKind::kLeakyRelu:
      return kUnaryLeakyRelu;
    case ActivationKind::kClip:
      return kUnaryClip;
    case ActivationKind::kSigmoid:
      return kUnarySigmoid;
    case ActivationKind::kTanh:
      return kUnaryTanh;
    case ActivationKind::kHardSigmoid:
      return kUnaryHardSigmoid;
    case ActivationKind::kHardSwish:
      return kUnaryHardSwish;
    case ActivationKind::kSilu:
      return kUnarySilu;
    case ActivationKind::kGelu:
      return kUnaryGelu;
    case ActivationKind::kGeluTanh:
      return kUnaryGeluTanh;
  }
  return kUnaryIdentity;
}

Activation ToDevice(const osprey::Activation& act) {
  Activation a;
  a.op = UnaryCodeOf(act.kind);
  a.alpha = act.alpha;
  a.beta = act.beta;
  return a;
}

}  // namespace

bool FusedActivation(const Node& node, Activation* act) {
  osprey::Activation fused;
  if (!osprey::Activation::FromFusedNode(node, &fused)) return false;
  *act = ToDevice(fused);
  return true;
}

namespace {

using RunFn = std::function<cudaError_t(KernelContext&, cudaStream_t)>;

// A kernel whose Run is one function of the context (all build-time state captured by value).
class FnKernel final : public CudaKernel {
 public:
  FnKernel(std::string name, int ordinal, RunFn fn, size_t workspace = 0)
      : CudaKernel(std::move(name), ordinal), fn_(std::move(fn)) {
    workspace_bytes_ = workspace;
  }

 protected:
  void RunOn(KernelContext& ctx, cudaStream_t stream) override { Check(fn_(ctx, stream)); }

 private:
  RunFn fn_;
};

std::unique_ptr<Kernel> Make(const KernelBuildContext& bc, const std::string& suffix, RunFn fn) {
  return std::make_unique<FnKernel>(bc.node.op_type + suffix, bc.device.ordinal, std::move(fn));
}

bool Present(const KernelBuildContext& bc, int i) {
  return i >= 0 && i < static_cast<int>(bc.present.size()) && bc.present[i];
}
const Tensor* Constant(const KernelBuildContext& bc, int i) {
  return Present(bc, i) && i < static_cast<int>(bc.input_values.size()) ? bc.input_values[i] : nullptr;
}
bool InF32(const KernelBuildContext& bc, int i) {
  return Present(bc, i) && i < static_cast<int>(bc.input_dtypes.size()) && bc.input_dtypes[i] == DType::kF32;
}
bool OutIs(const KernelBuildContext& bc, int i, DType dtype) {
  return i < static_cast<int>(bc.output_dtypes.size()) && bc.output_dtypes[i] == dtype;
}
// Outputs after the first that the graph uses (optional outputs such as MaxPool's indices or Dropout's mask).
bool ExtraOutputsUsed(const KernelBuildContext& bc) {
  for (size_t i = 1; i < bc.node.outputs.size(); ++i)
    if (bc.node.outputs[i] >= 0) return true;
  return false;
}

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

std::vector<int64_t> ContiguousStrides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

int64_t Axis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

const void* In(KernelContext& ctx, int i) { return ctx.HasIn(i) ? ctx.In(i).raw() : nullptr; }
const float* InF(KernelContext& ctx, int i) { return static_cast<const float*>(In(ctx, i)); }
float* OutF(KernelContext& ctx, int i = 0) { return static_cast<float*>(ctx.Out(i).raw()); }

bool ElementSizeOk(size_t es) { return es == 1 || es == 2 || es == 4 || es == 8; }

// ---------------------------------------------------------------- geometry

// The broadcast of `inputs` to `out` (BroadcastPlan's rule): output dims of size 1 dropped, neighbouring dims merged
// where every operand walks them as one. False when more than kMaxRank dims remain or a shape does not broadcast.
bool MakeBroadcast(const Shape& out, const std::vector<Shape>& inputs, BroadcastGeometry* g) {
  const size_t rank = out.size();
  const int n = static_cast<int>(inputs.size());
  if (n > 3) return false;
  std::vector<std::vector<int64_t>> full(n, std::vector<int64_t>(rank, 0));
  for (int k = 0; k < n; ++k) {
    const Shape& in = inputs[k];
    if (in.size() > rank) return false;
    int64_t stride = 1;
    for (size_t j = rank; j-- > 0;) {
      const size_t lead = rank - in.size();
      const int64_t d = j < lead ? 1 : in[j - lead];
      if (d != out[j] && d != 1) return false;
      full[k][j] = d == 1 ? 0 : stride;
      stride *= d;
    }
    g->contiguous[k] = NumElements(in) == NumElements(out);
  }
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides(n);
  for (size_t j = 0; j < rank; ++j) {
    if (out[j] == 1) continue;
    bool merge = !dims.empty();
    for (int k = 0; k < n && merge; ++k) merge = strides[k].back() == full[k][j] * out[j];
    if (merge) {
      dims.back() *= out[j];
      for (int k = 0; k < n; ++k) strides[k].back() = full[k][j];
    } else {
      dims.push_back(out[j]);
      for (int k = 0; k < n; ++k) strides[k].push_back(full[k][j]);
    }
  }
  if (dims.size() > static_cast<size_t>(kMaxRank)) return false;
  g->rank = static_cast<int>(dims.size());
  g->total = NumElements(out);
  for (size_t d = 0; d < dims.size(); ++d) {
    g->dims[d] = dims[d];
    for (int k = 0; k < n; ++k) g->strides[k][d] = strides[k][d];
  }
  return true;
}

// A strided copy over `dims` with size-1 dims dropped and mergeable neighbours merged.
bool MakeCopy(const Shape& dims, const std::vector<int64_t>& src, const std::vector<int64_t>& dst,
              StridedCopyGeometry* g) {
  std::vector<int64_t> d2, s2, t2;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    if (!d2.empty() && s2.back() == src[d] * dims[d] && t2.back() == dst[d] * dims[d]) {
      d2.back() *= dims[d];
      s2.back() = src[d];
      t2.back() = dst[d];
    } else {
      d2.push_back(dims[d]);
      s2.push_back(src[d]);
      t2.push_back(dst[d]);
    }
  }
  if (d2.size() > static_cast<size_t>(kMaxRank)) return false;
  *g = StridedCopyGeometry{};
  g->rank = static_cast<int>(d2.size());
  g->total = NumElements(dims);
  for (size_t d = 0; d < d2.size(); ++d) {
    g->dims[d] = d2[d];
    g->src_strides[d] = s2[d];
    g->dst_strides[d] = t2[d];
  }
  return true;
}

// Runs a strided copy: one device memcpy when both sides are contiguous.
cudaError_t RunCopy(cudaStream_t stream, const StridedCopyGeometry& g, const void* src, void* dst, size_t es) {
  if (g.total <= 0) return cudaSuccess;
  if (g.rank == 0 || (g.rank == 1 && g.src_strides[0] == 1 && g.dst_strides[0] == 1)) {
    return MemcpyAsync(dst, src, static_cast<size_t>(g.total) * es, stream);
  }
  return LaunchStridedCopy(stream, g, src, dst, static_cast<int>(es));
}

// ---------------------------------------------------------------- elementwise

bool UnaryOpFor(const KernelBuildContext& bc, Activation* a) {
  if (bc.node.Has("_quant_scale")) return false;  // a fused fake quantisation (CPU plans only): the CPU runs it
  const Node& node = bc.node;
  const std::string& op = node.op_type;
  *a = Activation{};
  // The activations with their parameters (ops/activation.h), but Clip: an absent bound is lowest() / max() here, as
  // in the reference Clip kernel, where a fused Clip has -inf / inf.
  osprey::Activation act;
  if (op != "Clip" && OpRegistry::TraitsOf(op).fusable_activation && ActivationOfNode(node, bc.opset, {}, &act)) {
    *a = ToDevice(act);
    return true;
  }
  if (op == "Exp")
    a->op = kUnaryExp;
  else if (op == "Log")
    a->op = kUnaryLog;
  else if (op == "Sqrt")
    a->op = kUnarySqrt;
  else if (op == "Reciprocal")
    a->op = kUnaryReciprocal;
  else if (op == "Neg")
    a->op = kUnaryNeg;
  else if (op == "Abs")
    a->op = kUnaryAbs;
  else if (op == "Erf")
    a->op = kUnaryErf;
  else if (op == "Floor")
    a->op = kUnaryFloor;
  else if (op == "Ceil")
    a->op = kUnaryCeil;
  else if (op == "Round")
    a->op = kUnaryRound;
  else if (op == "Sin")
    a->op = kUnarySin;
  else if (op == "Cos")
    a->op = kUnaryCos;
  else if (op == "Softplus")
    a->op = kUnarySoftplus;
  else if (op == "Softsign")
    a->op = kUnarySoftsign;
  else if (op == "Elu") {
    a->op = kUnaryElu;
    a->alpha = node.GetFloat("alpha", 1.f);
  } else if (op == "Mish")
    a->op = kUnaryMish;
  else if (op == "Sign")
    a->op = kUnarySign;
  else if (op == "Clip") {
    a->op = kUnaryClip;
    float lo = std::numeric_limits<float>::lowest(), hi = std::numeric_limits<float>::max();
    if (bc.opset < 11) {
      lo = node.GetFloat("min", lo);
      hi = node.GetFloat("max", hi);
    } else {
      for (int i = 1; i <= 2; ++i) {
        if (!Present(bc, i)) continue;
        const Tensor* bound = Constant(bc, i);
        // A bound computed at run time would need a device read: declined (the host runs it).
        if (bound == nullptr || bound->dtype() != DType::kF32 || bound->numel() != 1) return false;
        (i == 1 ? lo : hi) = bound->data<float>()[0];
      }
    }
    a->alpha = lo;
    a->beta = hi;
  } else {
    return false;
  }
  return true;
}

std::unique_ptr<Kernel> CreateUnary(const KernelBuildContext& bc) {
  Activation a;
  if (!UnaryOpFor(bc, &a) || !InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  if (NumElements(bc.input_shapes[0]) != NumElements(bc.output_shapes[0])) return nullptr;
  const int64_t n = NumElements(bc.output_shapes[0]);
  return Make(bc, "F32Cuda",
              [a, n](KernelContext& ctx, cudaStream_t s) { return LaunchUnary(s, InF(ctx, 0), OutF(ctx), n, a); });
}

std::unique_ptr<Kernel> CreateBinary(const KernelBuildContext& bc) {
  const std::string& op = bc.node.op_type;
  int code;
  if (op == "Add" || op == "Sum")
    code = kBinAdd;
  else if (op == "Sub")
    code = kBinSub;
  else if (op == "Mul")
    code = kBinMul;
  else if (op == "Div")
    code = kBinDiv;
  else if (op == "Pow")
    code = kBinPow;
  else if (op == "Max")
    code = kBinMax;
  else if (op == "Min")
    code = kBinMin;
  else if (op == "PRelu")
    code = kBinPRelu;
  else if (op == "Mod" && bc.node.GetInt("fmod", 0) == 1)  // the float remainder of opset 28's fmod = 0: host
    code = kBinMod;
  else
    return nullptr;
  if (bc.node.inputs.size() != 2 || !Present(bc, 0) || !Present(bc, 1)) return nullptr;  // variadic: two only
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  const Shape& out = bc.output_shapes[0];
  // A constant scalar second operand is passed by value (Pow with an integer exponent included).
  const Tensor* b_const = Constant(bc, 1);
  const bool b_scalar = b_const != nullptr && b_const->numel() == 1 &&
                        (b_const->dtype() == DType::kF32 ||
                         (code == kBinPow && (b_const->dtype() == DType::kI64 || b_const->dtype() == DType::kI32)));
  if (!b_scalar && !InF32(bc, 1)) return nullptr;
  if (b_scalar && bc.input_shapes[0] == out) {
    const float value =
        b_const->dtype() == DType::kF32 ? b_const->data<float>()[0] : static_cast<float>(b_const->GetAsInt(0));
    const int64_t n = NumElements(out);
    if (code == kBinPow && (value == 2.f || value == 1.f)) {  // the reference's exact forms
      Activation a;
      a.op = value == 2.f ? kUnarySquare : kUnaryIdentity;
      return Make(bc, "F32Cuda",
                  [a, n](KernelContext& ctx, cudaStream_t s) { return LaunchUnary(s, InF(ctx, 0), OutF(ctx), n, a); });
    }
    BroadcastGeometry g;
    if (!MakeBroadcast(out, {bc.input_shapes[0], Shape{}}, &g)) return nullptr;
    g.contiguous[1] = false;
    return Make(bc, "F32Cuda", [g, code, value](KernelContext& ctx, cudaStream_t s) {
      return LaunchBinary(s, code, g, InF(ctx, 0), nullptr, value, OutF(ctx), Activation{});
    });
  }
  if (!InF32(bc, 1)) return nullptr;
  BroadcastGeometry g;
  if (!MakeBroadcast(out, {bc.input_shapes[0], bc.input_shapes[1]}, &g)) return nullptr;
  return Make(bc, "F32Cuda", [g, code](KernelContext& ctx, cudaStream_t s) {
    return LaunchBinary(s, code, g, InF(ctx, 0), InF(ctx, 1), 0.f, OutF(ctx), Activation{});
  });
}

std::unique_ptr<Kernel> CreateCompare(const KernelBuildContext& bc) {
  const std::string& op = bc.node.op_type;
  int code;
  if (op == "Equal")
    code = kCmpEqual;
  else if (op == "Less")
    code = kCmpLess;
  else if (op == "Greater")
    code = kCmpGreater;
  else if (op == "LessOrEqual")
    code = kCmpLessOrEqual;
  else if (op == "GreaterOrEqual")
    code = kCmpGreaterOrEqual;
  else
    return nullptr;
  if (!InF32(bc, 0) || !InF32(bc, 1) || !OutIs(bc, 0, DType::kBool)) return nullptr;
  BroadcastGeometry g;
  if (!MakeBroadcast(bc.output_shapes[0], {bc.input_shapes[0], bc.input_shapes[1]}, &g)) return nullptr;
  return Make(bc, "F32Cuda", [g, code](KernelContext& ctx, cudaStream_t s) {
    return LaunchCompare(s, code, g, InF(ctx, 0), InF(ctx, 1), static_cast<uint8_t*>(ctx.Out(0).raw()));
  });
}

std::unique_ptr<Kernel> CreateWhere(const KernelBuildContext& bc) {
  if (!Present(bc, 0) || bc.input_dtypes[0] != DType::kBool || !InF32(bc, 1) || !InF32(bc, 2) ||
      !OutIs(bc, 0, DType::kF32))
    return nullptr;
  BroadcastGeometry g;
  if (!MakeBroadcast(bc.output_shapes[0], {bc.input_shapes[0], bc.input_shapes[1], bc.input_shapes[2]}, &g))
    return nullptr;
  return Make(bc, "F32Cuda", [g](KernelContext& ctx, cudaStream_t s) {
    return LaunchWhere(s, g, static_cast<const uint8_t*>(In(ctx, 0)), InF(ctx, 1), InF(ctx, 2), OutF(ctx));
  });
}

// Identity, Dropout (inference), Cast to the same dtype, Reshape, Flatten, Squeeze, Unsqueeze: the same bytes.
std::unique_ptr<Kernel> CreateDeviceCopy(const KernelBuildContext& bc) {
  const std::string& op = bc.node.op_type;
  if (!Present(bc, 0) || bc.output_dtypes.empty() || bc.output_dtypes[0] != bc.input_dtypes[0]) return nullptr;
  if (ExtraOutputsUsed(bc)) return nullptr;  // Dropout's mask
  if (op == "Dropout" && bc.opset >= 12 && Present(bc, 2)) {
    // training_mode must be a known false (a true one with ratio != 0 is an error the reference kernel reports).
    const Tensor* training = Constant(bc, 2);
    if (training == nullptr || (training->numel() > 0 && training->GetAsInt(0) != 0)) return nullptr;
  }
  const size_t bytes = static_cast<size_t>(NumBytes(bc.input_dtypes[0], bc.input_shapes[0]));
  if (static_cast<int64_t>(bytes) != NumBytes(bc.output_dtypes[0], bc.output_shapes[0])) return nullptr;
  return Make(bc, "Cuda", [bytes](KernelContext& ctx, cudaStream_t s) -> cudaError_t {
    const void* src = ctx.In(0).raw();
    void* dst = ctx.Out(0).raw();
    return MemcpyAsync(dst, src, bytes, s);
  });
}

// ---------------------------------------------------------------- pools, normalisations, reductions

std::unique_ptr<Kernel> CreatePool(const KernelBuildContext& bc) {
  const std::string& op = bc.node.op_type;
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32) || ExtraOutputsUsed(bc)) return nullptr;
  const Shape& x = bc.input_shapes[0];
  const Shape& y = bc.output_shapes[0];
  if (x.size() < 3 || x.size() > 5 || y.size() != x.size()) return nullptr;
  const std::vector<int64_t> kernel = bc.node.GetInts("kernel_shape");
  if (kernel.size() != x.size() - 2) return nullptr;
  const Window3 w = MakeWindow(bc.node, x, y, kernel);
  PoolGeometry g;
  g.kind = op == "MaxPool" ? kPoolMax : op == "AveragePool" ? kPoolAverage : kPoolLp;
  g.count_include_pad = bc.node.GetInt("count_include_pad", 0) != 0;
  g.p = bc.node.GetInt("p", 2);
  g.planes = x[0] * x[1];
  for (int i = 0; i < 3; ++i) {
    g.in[i] = w.in[i];
    g.out[i] = w.out[i];
    g.k[i] = w.k[i];
    g.s[i] = w.s[i];
    g.d[i] = w.d[i];
    g.pb[i] = w.pb[i];
    g.pe[i] = w.pe[i];
  }
  return Make(bc, "F32Cuda",
              [g](KernelContext& ctx, cudaStream_t s) { return LaunchPool(s, g, InF(ctx, 0), OutF(ctx)); });
}

std::unique_ptr<Kernel> CreateGlobalPool(const KernelBuildContext& bc) {
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  const Shape& x = bc.input_shapes[0];
  if (x.size() < 2) return nullptr;
  const int64_t planes = x[0] * x[1], size = Product(x, 2, x.size());
  const bool is_max = bc.node.op_type == "GlobalMaxPool";
  return Make(bc, "F32Cuda", [planes, size, is_max](KernelContext& ctx, cudaStream_t s) {
    return LaunchGlobalPool(s, InF(ctx, 0), OutF(ctx), planes, size, is_max);
  });
}

std::unique_ptr<Kernel> CreateBatchNorm(const KernelBuildContext& bc) {
  for (int i = 0; i < 5; ++i)
    if (!InF32(bc, i)) return nullptr;
  if (!OutIs(bc, 0, DType::kF32) || ExtraOutputsUsed(bc)) return nullptr;
  if (bc.node.GetInt("training_mode", 0) != 0 || bc.node.GetInt("spatial", 1) == 0) return nullptr;
  const Shape& x = bc.input_shapes[0];
  if (x.size() < 2) return nullptr;
  const int64_t channels = x[1];
  for (int i = 1; i < 5; ++i)
    if (NumElements(bc.input_shapes[i]) != channels) return nullptr;
  Activation act;
  if (!FusedActivation(bc.node, &act)) return nullptr;
  const float epsilon = bc.node.GetFloat("epsilon", 1e-5f);
  const int64_t batch = x[0], spatial = Product(x, 2, x.size());
  return Make(bc, "F32Cuda", [=](KernelContext& ctx, cudaStream_t s) {
    return LaunchBatchNorm(s, InF(ctx, 0), OutF(ctx), InF(ctx, 1), InF(ctx, 2), InF(ctx, 3), InF(ctx, 4), epsilon,
                           batch, channels, spatial, act);
  });
}

std::unique_ptr<Kernel> CreateSoftmax(const KernelBuildContext& bc) {
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  const Shape& s = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(s.size());
  if (rank == 0) return nullptr;
  const bool legacy = bc.opset < 13;
  const int64_t axis = Axis(bc.node.GetInt("axis", legacy ? 1 : -1), rank);
  if (axis < 0 || axis >= rank) return nullptr;
  const int64_t outer = Product(s, 0, axis);
  const int64_t len = legacy ? Product(s, axis, s.size()) : s[axis];
  const int64_t inner = legacy ? 1 : Product(s, axis + 1, s.size());
  const int kind = bc.node.op_type == "Softmax" ? kSoftmax : kLogSoftmax;
  return Make(bc, "F32Cuda", [=](KernelContext& ctx, cudaStream_t st) {
    return LaunchSoftmax(st, InF(ctx, 0), OutF(ctx), outer, len, inner, kind);
  });
}

std::unique_ptr<Kernel> CreateLayerNorm(const KernelBuildContext& bc) {
  if (!InF32(bc, 0) || !InF32(bc, 1) || !OutIs(bc, 0, DType::kF32) || ExtraOutputsUsed(bc)) return nullptr;
  if (Present(bc, 2) && !InF32(bc, 2)) return nullptr;
  const Shape& x = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  const int64_t axis = Axis(bc.node.GetInt("axis", -1), rank);
  if (axis < 0 || axis >= rank) return nullptr;
  const int64_t rows = Product(x, 0, axis), size = Product(x, axis, x.size());
  // Scale and bias of the normalised shape (or one value); other broadcasts run on the host.
  auto stride_of = [size](const Shape& p, int64_t* stride) {
    const int64_t n = NumElements(p);
    if (n == size)
      *stride = 1;
    else if (n == 1)
      *stride = 0;
    else
      return false;
    return true;
  };
  int64_t scale_stride = 1, shift_stride = 0;
  if (!stride_of(bc.input_shapes[1], &scale_stride)) return nullptr;
  const bool has_shift = Present(bc, 2);
  if (has_shift && !stride_of(bc.input_shapes[2], &shift_stride)) return nullptr;
  const float epsilon = bc.node.GetFloat("epsilon", 1e-5f);
  return Make(bc, "F32Cuda", [=](KernelContext& ctx, cudaStream_t s) {
    return LaunchLayerNorm(s, InF(ctx, 0), OutF(ctx), InF(ctx, 1), scale_stride, has_shift ? InF(ctx, 2) : nullptr,
                           shift_stride, rows, size, epsilon);
  });
}

// ReduceMean / ReduceSum whose reduced axes are one block of the (size-1-dims-dropped) shape: [outer, reduce, inner].
std::unique_ptr<Kernel> CreateReduce(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  const Shape& x = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  const int axes_input_opset = node.op_type == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  if (bc.opset < axes_input_opset) {
    axes = node.GetInts("axes");
  } else if (Present(bc, 1)) {
    const Tensor* t = Constant(bc, 1);
    if (t == nullptr) return nullptr;
    axes = t->ToInt64Vector();
  }
  std::vector<bool> mask(rank, false);
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) == 0) mask.assign(rank, true);
  } else {
    for (int64_t a : axes) {
      const int64_t n = Axis(a, rank);
      if (n < 0 || n >= rank) return nullptr;
      mask[n] = true;
    }
  }
  // Walk the non-trivial dims: kept* reduced* kept* only.
  int64_t outer = 1, reduce = 1, inner = 1;
  int phase = 0;  // 0: before the reduced block, 1: in it, 2: after it
  for (int64_t d = 0; d < rank; ++d) {
    if (x[d] == 1) continue;
    if (mask[d]) {
      if (phase == 2) return nullptr;
      phase = 1;
      reduce *= x[d];
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? outer : inner) *= x[d];
    }
  }
  if (NumElements(x) == 0) return nullptr;
  const int kind = node.op_type == "ReduceMean" ? kReduceMean : kReduceSum;
  return Make(bc, "F32Cuda", [=](KernelContext& ctx, cudaStream_t s) {
    return LaunchReduce(s, InF(ctx, 0), OutF(ctx), outer, reduce, inner, kind);
  });
}

// ---------------------------------------------------------------- data movement (any dtype)

std::unique_ptr<Kernel> CreateTranspose(const KernelBuildContext& bc) {
  if (!Present(bc, 0)) return nullptr;
  const size_t es = DTypeSize(bc.input_dtypes[0]);
  if (!ElementSizeOk(es)) return nullptr;
  const Shape& in = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> perm = bc.node.GetInts("perm");
  if (!bc.node.Has("perm"))
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
  if (static_cast<int64_t>(perm.size()) != rank) return nullptr;
  const std::vector<int64_t> in_strides = ContiguousStrides(in);
  Shape out(rank);
  std::vector<int64_t> src(rank);
  for (int64_t i = 0; i < rank; ++i) {
    if (perm[i] < 0 || perm[i] >= rank) return nullptr;
    out[i] = in[perm[i]];
    src[i] = in_strides[perm[i]];
  }
  if (out != bc.output_shapes[0]) return nullptr;
  StridedCopyGeometry g;
  if (!MakeCopy(out, src, ContiguousStrides(out), &g)) return nullptr;
  return Make(bc, "Cuda", [g, es](KernelContext& ctx, cudaStream_t s) {
    return RunCopy(s, g, ctx.In(0).raw(), ctx.Out(0).raw(), es);
  });
}

std::unique_ptr<Kernel> CreateSlice(const KernelBuildContext& bc) {
  if (!Present(bc, 0)) return nullptr;
  const size_t es = DTypeSize(bc.input_dtypes[0]);
  if (!ElementSizeOk(es)) return nullptr;
  const Shape& in = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  SliceArgs args;
  bool constant = true;  // every argument given is a constant (run-time arguments: the host runs it)
  auto input = [&](int i) -> const Tensor* {
    if (!Present(bc, i)) return nullptr;
    if (!Constant(bc, i)) constant = false;
    return Constant(bc, i);
  };
  if (!ReadSliceArgs(bc.node, bc.opset, input, &args) || !constant) return nullptr;
  SliceRange range;
  try {
    range = ResolveSlice(in, args, bc.node);
  } catch (const Error&) {
    return nullptr;
  }
  for (int64_t st : range.step)
    if (st == INT64_MIN) return nullptr;
  const std::vector<int64_t>& first = range.first;
  const std::vector<int64_t>& step = range.step;
  const Shape& expected = range.out;
  if (expected != bc.output_shapes[0]) return nullptr;
  std::vector<int64_t> strides = ContiguousStrides(in);
  int64_t base = 0;
  for (int64_t d = 0; d < rank; ++d) {
    base += first[d] * strides[d];
    strides[d] *= step[d];
  }
  StridedCopyGeometry g;
  if (!MakeCopy(expected, strides, ContiguousStrides(expected), &g)) return nullptr;
  const int64_t base_bytes = NumElements(expected) == 0 ? 0 : base * static_cast<int64_t>(es);
  return Make(bc, "Cuda", [g, es, base_bytes](KernelContext& ctx, cudaStream_t s) {
    return RunCopy(s, g, static_cast<const char*>(ctx.In(0).raw()) + base_bytes, ctx.Out(0).raw(), es);
  });
}

// out = input (shape in) broadcast or tiled: a strided copy with the given source strides over the output's dims.
std::unique_ptr<Kernel> CreateExpandTile(const KernelBuildContext& bc) {
  if (!Present(bc, 0)) return nullptr;
  const size_t es = DTypeSize(bc.input_dtypes[0]);
  if (!ElementSizeOk(es)) return nullptr;
  const Shape& in = bc.input_shapes[0];
  const Shape& out = bc.output_shapes[0];
  const int64_t r_in = static_cast<int64_t>(in.size()), r_out = static_cast<int64_t>(out.size());
  const std::vector<int64_t> in_strides = ContiguousStrides(in);
  Shape view;
  std::vector<int64_t> src, dst;
  if (bc.node.op_type == "Expand") {
    if (r_in > r_out) return nullptr;
    view = out;
    src.assign(r_out, 0);
    for (int64_t i = 0; i < r_out; ++i) {
      const int64_t j = i - (r_out - r_in);
      if (j < 0 || in[j] == 1) continue;
      if (in[j] != out[i]) return nullptr;
      src[i] = in_strides[j];
    }
    dst = ContiguousStrides(out);
  } else {  // Tile: output dim d * r seen as [r, d]
    if (r_in != r_out) return nullptr;
    for (int64_t d = 0; d < r_in; ++d) {
      const int64_t reps = in[d] == 0 ? 0 : out[d] / in[d];
      if (reps * in[d] != out[d]) return nullptr;
      view.push_back(reps);
      src.push_back(0);
      view.push_back(in[d]);
      src.push_back(in_strides[d]);
    }
    dst = ContiguousStrides(view);
  }
  StridedCopyGeometry g;
  if (!MakeCopy(view, src, dst, &g)) return nullptr;
  return Make(bc, "Cuda", [g, es](KernelContext& ctx, cudaStream_t s) {
    return RunCopy(s, g, ctx.In(0).raw(), ctx.Out(0).raw(), es);
  });
}

std::unique_ptr<Kernel> CreateConcat(const KernelBuildContext& bc) {
  if (bc.output_shapes.empty()) return nullptr;
  const Shape& out = bc.output_shapes[0];
  const DType dtype = bc.output_dtypes[0];
  const size_t es = DTypeSize(dtype);
  if (!ElementSizeOk(es)) return nullptr;
  const int64_t rank = static_cast<int64_t>(out.size());
  const int64_t axis = Axis(bc.node.GetInt("axis", 0), rank);
  if (axis < 0 || axis >= rank) return nullptr;
  const int64_t outer = Product(out, 0, axis), inner = Product(out, axis + 1, out.size());
  struct Part {
    StridedCopyGeometry g;
    int64_t dst_offset;  // elements
  };
  std::vector<Part> parts;
  int64_t offset = 0;
  for (size_t i = 0; i < bc.node.inputs.size(); ++i) {
    if (!Present(bc, static_cast<int>(i)) || bc.input_dtypes[i] != dtype) return nullptr;
    const Shape& s = bc.input_shapes[i];
    if (static_cast<int64_t>(s.size()) != rank) return nullptr;
    const int64_t row = s[axis] * inner;
    Part p;
    if (!MakeCopy({outer, row}, {row, 1}, {out[axis] * inner, 1}, &p.g)) return nullptr;
    p.dst_offset = offset;
    parts.push_back(p);
    offset += row;
  }
  if (offset != out[axis] * inner) return nullptr;
  return Make(bc, "Cuda", [parts, es](KernelContext& ctx, cudaStream_t s) -> cudaError_t {
    char* dst = static_cast<char*>(ctx.Out(0).raw());
    for (size_t i = 0; i < parts.size(); ++i) {
      cudaError_t e = RunCopy(s, parts[i].g, ctx.inputs[i]->raw(), dst + parts[i].dst_offset * es, es);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

std::unique_ptr<Kernel> CreateSplit(const KernelBuildContext& bc) {
  if (!Present(bc, 0)) return nullptr;
  const Shape& in = bc.input_shapes[0];
  const size_t es = DTypeSize(bc.input_dtypes[0]);
  if (!ElementSizeOk(es)) return nullptr;
  const int64_t rank = static_cast<int64_t>(in.size());
  const int64_t axis = Axis(bc.node.GetInt("axis", 0), rank);
  if (axis < 0 || axis >= rank) return nullptr;
  const int64_t n = static_cast<int64_t>(bc.node.outputs.size());
  const int64_t dim = in[axis];
  // The parts' sizes are the outputs' sizes along the axis, which the shape rule (ops/shape.cc) already resolved
  // from `split` / `num_outputs`.
  if (static_cast<int64_t>(bc.output_shapes.size()) != n) return nullptr;
  std::vector<int64_t> split;
  int64_t sum = 0;
  for (const Shape& o : bc.output_shapes) {
    if (static_cast<int64_t>(o.size()) != rank) return nullptr;
    split.push_back(o[axis]);
    sum += o[axis];
  }
  if (sum != dim) return nullptr;
  const int64_t outer = Product(in, 0, axis), inner = Product(in, axis + 1, in.size());
  struct Part {
    StridedCopyGeometry g;
    int64_t src_offset;
    bool used;
  };
  std::vector<Part> parts;
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = split[i] * inner;
    Part p;
    p.used = bc.node.outputs[i] >= 0;
    if (p.used) {
      Shape expected = in;
      expected[axis] = split[i];
      if (static_cast<size_t>(i) >= bc.output_shapes.size() || bc.output_shapes[i] != expected) return nullptr;
    }
    if (!MakeCopy({outer, row}, {dim * inner, 1}, {row, 1}, &p.g)) return nullptr;
    p.src_offset = offset;
    parts.push_back(p);
    offset += row;
  }
  return Make(bc, "Cuda", [parts, es](KernelContext& ctx, cudaStream_t s) -> cudaError_t {
    const char* src = static_cast<const char*>(ctx.In(0).raw());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].used || i >= ctx.outputs.size() || ctx.outputs[i] == nullptr) continue;
      cudaError_t e = RunCopy(s, parts[i].g, src + parts[i].src_offset * es, ctx.outputs[i]->raw(), es);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

std::unique_ptr<Kernel> CreateGather(const KernelBuildContext& bc) {
  if (!Present(bc, 0) || !Present(bc, 1)) return nullptr;
  const size_t es = DTypeSize(bc.input_dtypes[0]);
  if (!ElementSizeOk(es)) return nullptr;
  const Tensor* indices = Constant(bc, 1);
  // Indices computed at run time could be out of range (an error the host reports): only constant ones.
  if (indices == nullptr || (indices->dtype() != DType::kI64 && indices->dtype() != DType::kI32)) return nullptr;
  const Shape& data = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(data.size());
  const int64_t axis = Axis(bc.node.GetInt("axis", 0), rank);
  if (axis < 0 || axis >= rank) return nullptr;
  const int64_t dim = data[axis];
  for (int64_t v : indices->ToInt64Vector())
    if (v < -dim || v >= dim) return nullptr;
  const int64_t outer = Product(data, 0, axis), inner = Product(data, axis + 1, data.size());
  const int64_t count = indices->numel();
  if (NumElements(bc.output_shapes[0]) != outer * count * inner) return nullptr;
  const bool i64 = indices->dtype() == DType::kI64;
  return Make(bc, "Cuda", [=](KernelContext& ctx, cudaStream_t s) {
    return LaunchGather(s, ctx.In(0).raw(), ctx.In(1).raw(), i64, ctx.Out(0).raw(), outer, dim, count, inner,
                        static_cast<int>(es));
  });
}

std::unique_ptr<Kernel> CreatePad(const KernelBuildContext& bc) {
  if (!Present(bc, 0)) return nullptr;
  const DType dtype = bc.input_dtypes[0];
  const size_t es = DTypeSize(dtype);
  if (!ElementSizeOk(es)) return nullptr;
  const Shape& in = bc.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  if (rank == 0 || rank > kMaxRank) return nullptr;
  const std::string mode = bc.node.GetString("mode", "constant");
  PadGeometry g;
  if (mode == "constant")
    g.mode = kPadConstant;
  else if (mode == "edge")
    g.mode = kPadEdge;
  else if (mode == "reflect")
    g.mode = kPadReflect;
  else if (mode == "wrap")
    g.mode = kPadWrap;
  else
    return nullptr;
  std::vector<int64_t> pads, axes;
  if (bc.opset < 11) {
    pads = bc.node.GetInts("pads");
    const float value = bc.node.GetFloat("value", 0.f);
    if (value != 0.f) {
      if (dtype != DType::kF32) return nullptr;
      std::memcpy(&g.fill, &value, sizeof(float));
    }
  } else {
    const Tensor* t_pads = Constant(bc, 1);
    if (t_pads == nullptr) return nullptr;
    pads = t_pads->ToInt64Vector();
    if (Present(bc, 2)) {
      const Tensor* v = Constant(bc, 2);
      if (v == nullptr || v->dtype() != dtype) return nullptr;
      if (v->numel() > 0) std::memcpy(&g.fill, v->raw(), es);
    }
    if (Present(bc, 3)) {
      const Tensor* t_axes = Constant(bc, 3);
      if (t_axes == nullptr) return nullptr;
      for (int64_t a : t_axes->ToInt64Vector()) {
        const int64_t n = Axis(a, rank);
        if (n < 0 || n >= rank) return nullptr;
        axes.push_back(n);
      }
    }
  }
  if (axes.empty() && !(bc.opset >= 11 && Present(bc, 3)))
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  const int64_t n = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * n) return nullptr;
  std::vector<int64_t> begin(rank, 0), end(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    begin[axes[i]] = pads[i];
    end[axes[i]] = pads[i + n];
  }
  const std::vector<int64_t> strides = ContiguousStrides(in);
  Shape expected(rank);
  g.rank = static_cast<int>(rank);
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t crop_begin = std::max<int64_t>(0, -begin[d]);
    const int64_t kept = in[d] - crop_begin - std::max<int64_t>(0, -end[d]);
    expected[d] = in[d] + begin[d] + end[d];
    if (kept < 0 || expected[d] < 0) return nullptr;
    if (kept == 0 && g.mode != kPadConstant && expected[d] > 0) return nullptr;  // the reference's error
    g.out_dims[d] = expected[d];
    g.in_strides[d] = strides[d];
    g.pad_begin[d] = std::max<int64_t>(0, begin[d]);
    g.crop_begin[d] = crop_begin;
    g.kept[d] = kept;
  }
  if (expected != bc.output_shapes[0]) return nullptr;
  g.total = NumElements(expected);
  return Make(bc, "Cuda", [g, es](KernelContext& ctx, cudaStream_t s) {
    return LaunchPad(s, g, ctx.In(0).raw(), ctx.Out(0).raw(), static_cast<int>(es));
  });
}

// Resize / Upsample, nearest and linear, the reference's parameters (GetResizeParams in kernels/reference/shape.cc).
std::unique_ptr<Kernel> CreateResize(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (!InF32(bc, 0) || !OutIs(bc, 0, DType::kF32)) return nullptr;
  const Shape& x = bc.input_shapes[0];
  const Shape& y = bc.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank == 0 || rank > kMaxRank || static_cast<int64_t>(y.size()) != rank) return nullptr;
  for (int64_t d : x)
    if (d == 0) return nullptr;
  ResizeGeometry g;
  const std::string mode = node.GetString("mode", "nearest");
  if (mode == "linear" || mode == "bilinear" || mode == "trilinear")
    g.linear = true;
  else if (mode != "nearest")
    return nullptr;  // cubic
  g.legacy = node.op_type == "Upsample" || bc.opset < 11;
  std::vector<double> scales(rank, 1.0);
  if (g.legacy) {
    std::vector<double> s;
    if (node.op_type == "Upsample" && bc.opset < 9) {
      for (float v : node.GetFloats("scales")) s.push_back(v);
    } else {
      const Tensor* t = Constant(bc, 1);
      if (t == nullptr) return nullptr;
      for (int64_t i = 0; i < t->numel(); ++i) s.push_back(t->GetAsDouble(i));
    }
    if (static_cast<int64_t>(s.size()) != rank) return nullptr;
    scales = s;
  } else {
    const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
    if (coord == "half_pixel")
      g.coord = kCoordHalfPixel;
    else if (coord == "asymmetric")
      g.coord = kCoordAsymmetric;
    else if (coord == "align_corners")
      g.coord = kCoordAlignCorners;
    else if (coord == "pytorch_half_pixel")
      g.coord = kCoordPytorchHalfPixel;
    else if (coord == "tf_half_pixel_for_nn")
      g.coord = kCoordTfHalfPixelForNn;
    else if (coord == "half_pixel_symmetric")
      g.coord = kCoordHalfPixelSymmetric;
    else
      return nullptr;  // tf_crop_and_resize
    const std::string nearest = node.GetString("nearest_mode", "round_prefer_floor");
    if (nearest == "round_prefer_floor")
      g.nearest_mode = kNearestRoundPreferFloor;
    else if (nearest == "round_prefer_ceil")
      g.nearest_mode = kNearestRoundPreferCeil;
    else if (nearest == "floor")
      g.nearest_mode = kNearestFloor;
    else if (nearest == "ceil")
      g.nearest_mode = kNearestCeil;
    else
      return nullptr;
    std::vector<int64_t> axes;
    if (node.Has("axes")) {
      for (int64_t a : node.GetInts("axes")) {
        const int64_t n = Axis(a, rank);
        if (n < 0 || n >= rank) return nullptr;
        axes.push_back(n);
      }
    } else {
      for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    }
    const size_t n = axes.size();
    const Tensor* sizes_t = Constant(bc, 3);
    if (Present(bc, 3) && sizes_t == nullptr) return nullptr;
    if (sizes_t != nullptr && sizes_t->numel() > 0) {
      const std::vector<int64_t> sizes = sizes_t->ToInt64Vector();
      if (sizes.size() != n) return nullptr;
      const std::string policy = node.GetString("keep_aspect_ratio_policy", "stretch");
      std::vector<double> s(n);
      for (size_t i = 0; i < n; ++i) s[i] = static_cast<double>(sizes[i]) / static_cast<double>(x[axes[i]]);
      if (policy == "not_larger" && n > 0) s.assign(n, *std::min_element(s.begin(), s.end()));
      if (policy == "not_smaller" && n > 0) s.assign(n, *std::max_element(s.begin(), s.end()));
      for (size_t i = 0; i < n; ++i) scales[axes[i]] = s[i];
    } else {
      const Tensor* t = Constant(bc, 2);
      if (t == nullptr || static_cast<size_t>(t->numel()) != n) return nullptr;
      for (size_t i = 0; i < n; ++i) scales[axes[i]] = t->GetAsDouble(static_cast<int64_t>(i));
    }
  }
  const std::vector<int64_t> strides = ContiguousStrides(x);
  g.rank = static_cast<int>(rank);
  g.total = NumElements(y);
  for (int64_t d = 0; d < rank; ++d) {
    if (!(scales[d] > 0)) return nullptr;
    g.in_dims[d] = x[d];
    g.out_dims[d] = y[d];
    g.in_strides[d] = strides[d];
    g.scales[d] = scales[d];
  }
  return Make(bc, "F32Cuda",
              [g](KernelContext& ctx, cudaStream_t s) { return LaunchResize(s, g, InF(ctx, 0), OutF(ctx)); });
}

}  // namespace

std::unique_ptr<Kernel> CreateCudaKernel(const KernelBuildContext& bc) {
  const std::string& op = bc.node.op_type;
  if (!bc.node.domain.empty() && bc.node.domain != "ai.onnx") return nullptr;
  // Layouts other than plain never reach a device step; refuse them rather than misread memory.
  for (size_t i = 0; i < bc.input_layouts.size(); ++i)
    if (bc.input_layouts[i] != Layout::kPlain) return nullptr;
  for (size_t i = 0; i < bc.output_layouts.size(); ++i)
    if (bc.output_layouts[i] != Layout::kPlain) return nullptr;
  if (bc.output_shapes.empty() || bc.output_dtypes.size() != bc.output_shapes.size()) return nullptr;
  if (bc.input_shapes.size() != bc.present.size() || bc.input_dtypes.size() != bc.present.size()) return nullptr;

  if (op == "Conv") return CreateConvKernel(bc);
  if (op == "ConvTranspose") return CreateConvTransposeKernel(bc);
  if (op == "Gemm") return CreateGemmKernel(bc);
  if (op == "MatMul") return CreateMatMulKernel(bc);
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" || op == "Max" || op == "Min" ||
      op == "Sum" || op == "PRelu" || op == "Mod")
    return CreateBinary(bc);
  if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual")
    return CreateCompare(bc);
  if (op == "Where") return CreateWhere(bc);
  if (op == "Identity" || op == "Dropout" || op == "Reshape" || op == "Flatten" || op == "Squeeze" ||
      op == "Unsqueeze" || op == "Cast")
    return CreateDeviceCopy(bc);
  if (op == "MaxPool" || op == "AveragePool" || op == "LpPool") return CreatePool(bc);
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") return CreateGlobalPool(bc);
  if (op == "BatchNormalization") return CreateBatchNorm(bc);
  if (op == "Softmax" || op == "LogSoftmax") return CreateSoftmax(bc);
  if (op == "LayerNormalization") return CreateLayerNorm(bc);
  if (op == "ReduceMean" || op == "ReduceSum") return CreateReduce(bc);
  if (op == "Transpose") return CreateTranspose(bc);
  if (op == "Slice") return CreateSlice(bc);
  if (op == "Expand" || op == "Tile") return CreateExpandTile(bc);
  if (op == "Concat") return CreateConcat(bc);
  if (op == "Split") return CreateSplit(bc);
  if (op == "Gather") return CreateGather(bc);
  if (op == "Pad") return CreatePad(bc);
  if (op == "Resize" || op == "Upsample") return CreateResize(bc);
  if (op == kChannelShuffleOp) return CreateChannelShuffleKernel(bc);
  return CreateUnary(bc);
}

}  // namespace osprey::cuda
