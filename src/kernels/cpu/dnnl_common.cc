#include "kernels/cpu/dnnl_common.h"

#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/bf16_support.h"
#include "ops/activation.h"

namespace osprey::cpu {

const dnnl::engine& CpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

namespace {

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

struct ScratchBlock {
  std::unique_ptr<char, FreeDeleter> data;
  size_t capacity = 0;
};

}  // namespace

char* ThreadScratch::Reserve(size_t bytes) {
  thread_local ScratchBlock block;
  if (bytes == 0) bytes = 64;
  if (bytes > block.capacity) {
    // Grow by half again so a thread that sees slowly increasing sizes does not reallocate on every call.
    size_t capacity = Align(std::max(bytes, block.capacity + block.capacity / 2));
    char* p = static_cast<char*>(std::aligned_alloc(64, capacity));
    if (p == nullptr)
      throw Error(ErrorCode::kResourceExhausted,
                  "oneDNN scratch memory: could not allocate " + std::to_string(capacity) + " bytes");
    block.data.reset(p);
    block.capacity = capacity;
  }
  return block.data.get();
}

OmpThreadsGuard::OmpThreadsGuard(int num_threads) {
  if (num_threads <= 0) return;
  previous_ = omp_get_max_threads();
  omp_set_num_threads(num_threads);
}

OmpThreadsGuard::~OmpThreadsGuard() {
  if (previous_ > 0) omp_set_num_threads(previous_);
}

dnnl::memory::dims ToDims(const Shape& shape) { return dnnl::memory::dims(shape.begin(), shape.end()); }

dnnl::memory::desc PlainDesc(const dnnl::memory::dims& dims) {
  dnnl::memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * std::max<int64_t>(dims[i + 1], 1);
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

bool AppendFusedActivation(const Node& node, dnnl::post_ops& ops) {
  Activation act;
  if (!Activation::FromFusedNode(node, &act)) return false;
  const float alpha = act.alpha, beta = act.beta;
  using dnnl::algorithm;
  switch (act.kind) {
    case ActivationKind::kNone:
      break;
    case ActivationKind::kRelu:
      ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      break;
    case ActivationKind::kLeakyRelu:
      ops.append_eltwise(1.f, algorithm::eltwise_relu, alpha, 0.f);
      break;
    case ActivationKind::kClip:
      ops.append_eltwise(1.f, algorithm::eltwise_clip_v2, alpha, beta);
      break;
    case ActivationKind::kSigmoid:
      ops.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f);
      break;
    case ActivationKind::kTanh:
      ops.append_eltwise(1.f, algorithm::eltwise_tanh, 0.f, 0.f);
      break;
    case ActivationKind::kHardSigmoid:
      // oneDNN 2.6 has no hardsigmoid: clip(alpha * x + beta, 0, 1) as two post-ops.
      ops.append_eltwise(1.f, algorithm::eltwise_linear, alpha, beta);
      ops.append_eltwise(1.f, algorithm::eltwise_clip_v2, 0.f, 1.f);
      break;
    case ActivationKind::kHardSwish:
      ops.append_eltwise(1.f, algorithm::eltwise_hardswish, 0.f, 0.f);  // x * clip(x / 6 + 1/2, 0, 1)
      break;
    case ActivationKind::kSilu:
      ops.append_eltwise(1.f, algorithm::eltwise_swish, 1.f, 0.f);
      break;
    case ActivationKind::kGelu:
      ops.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f);
      break;
  }
  return true;
}

bool AllFloat32(const KernelBuildContext& ctx) {
  for (size_t i = 0; i < ctx.input_dtypes.size(); ++i) {
    bool present = i < ctx.present.size() && ctx.present[i];
    if (present && ctx.input_dtypes[i] != DType::kF32) return false;
  }
  for (DType d : ctx.output_dtypes)
    if (d != DType::kF32) return false;
  return true;
}

bool IsReferenceImpl(const dnnl::primitive_desc_base& pd) {
  const char* impl = pd.impl_info_str();
  return impl == nullptr || std::strncmp(impl, "ref", 3) == 0;
}

namespace {
// Everything that decides where a weight element lands in a plain or blocked descriptor, as bytes; empty for other
// format kinds (Winograd, packed RNN weights), whose packs are then not shared.
std::string BlockedDescKey(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return {};
  std::string key;
  auto put = [&key](const auto& value) { key.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  put(d.ndims);
  put(d.data_type);
  put(d.offset0);
  for (int i = 0; i < d.ndims; ++i) {
    put(d.dims[i]);
    put(d.padded_dims[i]);
    put(d.padded_offsets[i]);
    put(d.format_desc.blocking.strides[i]);
  }
  put(d.format_desc.blocking.inner_nblks);
  for (int i = 0; i < d.format_desc.blocking.inner_nblks; ++i) {
    put(d.format_desc.blocking.inner_blks[i]);
    put(d.format_desc.blocking.inner_idxs[i]);
  }
  put(d.extra.flags);
  put(d.extra.compensation_mask);
  put(d.extra.scale_adjust);
  put(d.extra.asymm_compensation_mask);
  return key;
}
}  // namespace

PackedWeight PackWeight(const KernelBuildContext& ctx, const dnnl::memory::desc& from, const Tensor& source,
                        const dnnl::memory::desc& to, float scale) {
  auto fill = [&](void* data) {
    // A plain layout with gaps (padded row strides, dnnl_matmul.cc) gets zeros there, so the bytes of a packed weight
    // are always defined (blocked layouts' padding is zeroed by the reorder itself).
    if (to.data.format_kind == dnnl_blocked && to.data.format_desc.blocking.inner_nblks == 0 &&
        to.get_size() > static_cast<size_t>(source.nbytes()))
      std::memset(data, 0, to.get_size());
    dnnl::memory src = WrapMemory(from, source.raw());
    dnnl::memory dst(to, CpuEngine(), data);
    dnnl::primitive_attr attr;
    if (scale != 1.f) attr.set_output_scales(0, {scale});
    dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, attr);
    dnnl::stream& stream = ThreadStream();
    dnnl::reorder(pd).execute(stream, src, dst);
    stream.wait();
  };
  PackedWeight packed;
  const std::string from_key = BlockedDescKey(from), to_key = BlockedDescKey(to);
  if (ctx.derive_weight && source.buffer() && !from_key.empty() && !to_key.empty()) {
    std::string key = "dnnl:" + from_key + "->" + to_key;
    key.append(reinterpret_cast<const char*>(&scale), sizeof(scale));
    packed.buffer = ctx.derive_weight(source, key, to.get_size(), fill);
  } else {
    packed.buffer = Allocator::Host().Allocate(std::max<size_t>(to.get_size(), 64));
    fill(packed.buffer->data());
  }
  packed.memory = dnnl::memory(to, CpuEngine(), packed.buffer->data());
  return packed;
}

dnnl::primitive_attr BaseAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void CheckShape(const Node& node, const char* kernel_name, const char* what, const Tensor& tensor,
                const Shape& expected) {
  if (tensor.dtype() != DType::kF32 || tensor.shape() != expected || (tensor.numel() > 0 && tensor.raw() == nullptr))
    throw Error(ErrorCode::kInternal, node.Describe() + ": " + kernel_name + " was built for " + what + " float32 " +
                                          ShapeToString(expected) + ", got " + DTypeName(tensor.dtype()) + " " +
                                          ShapeToString(tensor.shape()));
}

dnnl::memory::desc ActivationDesc(const Shape& shape, Layout layout) {
  if (layout == Layout::kPlain) return PlainDesc(ToDims(shape));
  if (shape.size() != 4)
    throw Error(ErrorCode::kInternal, "channels-last layout asked for a rank-" + std::to_string(shape.size()) +
                                          " tensor " + ShapeToString(shape) + " (only rank 4 has one)");
  return dnnl::memory::desc(ToDims(shape), dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc);
}

Shape PhysicalShape(const Shape& logical, Layout layout) {
  if (layout == Layout::kPlain || logical.size() != 4) return logical;
  return {logical[0], logical[2], logical[3], logical[1]};
}

bool AnyNhwc(const KernelBuildContext& ctx) {
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return true;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return true;
  return false;
}

void CheckActivation(const Node& node, const char* kernel_name, const char* what, const Tensor& tensor,
                     const Shape& logical, Layout layout) {
  if (layout == Layout::kPlain) return CheckShape(node, kernel_name, what, tensor, logical);
  const Shape physical = PhysicalShape(logical, layout);
  const bool shape_ok = tensor.shape() == physical || tensor.shape() == logical;
  if (tensor.dtype() != DType::kF32 || !shape_ok || (tensor.numel() > 0 && tensor.raw() == nullptr))
    throw Error(ErrorCode::kInternal, node.Describe() + ": " + kernel_name + " was built for " + what +
                                          " float32 NHWC " + ShapeToString(physical) + " (logical " +
                                          ShapeToString(logical) + "), got " + DTypeName(tensor.dtype()) + " " +
                                          ShapeToString(tensor.shape()));
}

void ThrowUnsupportedLayouts(const Node& node, const char* kernel_name, const std::string& why) {
  throw Error(ErrorCode::kInternal,
              node.Describe() + ": " + kernel_name + " was asked for channels-last (NHWC) tensors but " + why);
}

namespace {

const char* IsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "unknown";
  }
}

// CPUID leaf 7 sub-leaf 1, EAX bit 5: AVX512_BF16.
bool CpuidHasAvx512Bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return (eax >> 5) & 1u;
}

}  // namespace

bool CpuSupportsBf16(std::string* description) {
  const bool cpuid = CpuidHasAvx512Bf16();
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  const auto bits = static_cast<unsigned>(isa), bf16_bits = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  const bool dnnl_ok = (bits & bf16_bits) == bf16_bits;
  if (description != nullptr)
    *description = std::string("oneDNN ISA ") + IsaName(isa) + (cpuid ? ", AVX512_BF16 in cpuid" : ", no AVX512_BF16");
  return cpuid && dnnl_ok;
}

}  // namespace osprey::cpu
