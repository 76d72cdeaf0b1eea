#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>

#include "kernels/cpu/dnnl_common.h"
#include "ops/matmul_views.h"
#include "ops/op_registry.h"

namespace osprey {

std::unique_ptr<Kernel> CreateCpuLayerNormalization(const KernelBuildContext& ctx);  // layernorm.cc
std::unique_ptr<Kernel> CreateCpuGroupNorm(const KernelBuildContext& ctx);           // groupnorm.cc
bool CpuGroupNormSupportsNhwc(const KernelBuildContext& ctx);                        // groupnorm.cc
std::unique_ptr<Kernel> CreateAugmentKernel(const KernelBuildContext& ctx);  // augment_kernels.cc
std::unique_ptr<Kernel> CreateRecurrentKernel(const KernelBuildContext& ctx);  // recurrent_kernels.cc
namespace cpu {
std::unique_ptr<Kernel> CreateResize(const KernelBuildContext& ctx);  // resize_kernel.cc
}  // namespace cpu

namespace {

// oneDNN sizes its JIT kernels' loops and blocks in 32-bit ints, and so do parts of osprey's own: a tensor of more than
// 2^31 - 1 elements, or a window attribute above 2^20, made primitive creation divide by zero or crash (fuzzed models:
// a Conv with strides [2, 2^31 - 1]; a MaxPool pad of 2^31, whose [1, 32, 2^30 + 4, 8] output reached the next Conv).
// Such nodes run on the reference kernels, which index in 64 bits.
constexpr int64_t kMaxFastElements = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxFastWindowAttr = int64_t{1} << 20;

bool WithinFastKernelLimits(const KernelBuildContext& ctx) {
  for (const std::vector<Shape>* shapes : {&ctx.input_shapes, &ctx.output_shapes})
    for (const Shape& s : *shapes) {
      int64_t n = 1;
      for (int64_t d : s) {
        if (d > kMaxFastElements) return false;
        n = d == 0 ? 0 : std::min(n * d, kMaxFastElements + 1);  // both factors <= 2^31: no overflow
      }
      if (n > kMaxFastElements) return false;
    }
  for (const char* name : {"strides", "pads", "dilations", "kernel_shape", "output_padding"})
    for (int64_t v : ctx.node.GetInts(name, {}))
      if (v > kMaxFastWindowAttr || v < -kMaxFastWindowAttr) return false;
  return true;
}

}  // namespace

std::unique_ptr<Kernel> CreateCpuKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (ctx.node.domain == kOspreyDomain) {
    if (std::unique_ptr<Kernel> k = CreateAugmentKernel(ctx)) return k;
    return CreateImageKernel(ctx);
  }
  if (!ctx.node.domain.empty() || !WithinFastKernelLimits(ctx)) return nullptr;
  try {
    if (op == "Conv" && ctx.node.Has("_int8")) return cpu::CreateDnnlConvInt8(ctx);
    if (op == "MatMul" && ctx.node.Has("_int8")) return cpu::CreateDnnlMatMulInt8(ctx);
    if (op == "MatMul" || op == "Gemm" || op == "Conv")
      if (std::unique_ptr<Kernel> k = cpu::CreateGemv(ctx)) return k;
    if (op == "Conv")
      if (std::unique_ptr<Kernel> k = cpu::CreateFirConv(ctx)) return k;
    if (op == "Conv") return cpu::CreateDnnlConv(ctx);
    if (op == "ConvTranspose") return cpu::CreateDnnlDeconv(ctx);
    if (op == "ConvInteger" || op == "MatMulInteger" || op == "DynamicQuantizeLinear" || op == "QuantizeLinear" ||
        op == "DequantizeLinear")
      return cpu::CreateIntegerKernel(ctx);
    if (op == "MatMul") return cpu::CreateDnnlMatMul(ctx);
    if (op == kMatMulViewsOp) return cpu::CreateDnnlMatMulViews(ctx);
    if (op == kAttentionViewsOp) return cpu::CreateAttentionViews(ctx);
    if (op == "Gemm") return cpu::CreateDnnlGemm(ctx);
    if (op == "GlobalAveragePool" || op == "GlobalMaxPool")
      if (std::unique_ptr<Kernel> k = CreateGlobalPool(ctx)) return k;
    if (op == "MaxPool" || op == "AveragePool")
      if (std::unique_ptr<Kernel> k = cpu::CreatePlainPool(ctx)) return k;
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool")
      return cpu::CreateDnnlPool(ctx);
    if (op == "Softmax" || op == "LogSoftmax") return cpu::CreateDnnlSoftmax(ctx);
    if (op == "BatchNormalization") return cpu::CreateBatchNorm(ctx);
    if (op == "LayerNormalization") return CreateCpuLayerNormalization(ctx);
    if (op == "InstanceNormalization" || op == "GroupNormalization" || op == kGroupNormOp)
      return CreateCpuGroupNorm(ctx);
    if (op == "RNN" || op == "GRU" || op == "LSTM") return CreateRecurrentKernel(ctx);
    if (op == "Resize" || op == "Upsample") return cpu::CreateResize(ctx);
    if (op == "STFT") return cpu::CreateStftKernel(ctx);
    if (op == "DFT") return cpu::CreateDftKernel(ctx);
    if (op == "Concat" || op == "Slice" || op == "Split" || op == "Gather" || op == kChannelShuffleOp)
      return CreateChannelKernel(ctx);
    if (op == "Pad") return CreatePadKernel(ctx);
    if (op == "Col2Im") return CreateCol2ImKernel(ctx);
    if (op == "Transpose") return CreateTransposeKernel(ctx);
    if (op == "GridSample") return CreateGridSampleKernel(ctx);
    if (op.rfind("Reduce", 0) == 0) return CreateReduceKernel(ctx);
    if (op == "Where" || op == "Less" || op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual" ||
        op == "Equal")
      return CreateSelectKernel(ctx);
    if (std::unique_ptr<Kernel> k = CreateElementwiseKernel(ctx)) return k;
  } catch (const dnnl::error&) {
    // oneDNN could not build a primitive for this case (unsupported combination): the reference kernel runs it.
    return nullptr;
  }
  return nullptr;
}

}  // namespace osprey

namespace osprey {

bool CpuKernelSupportsNhwc(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (!ctx.node.domain.empty() || !WithinFastKernelLimits(ctx)) return false;
  try {
    if (op == "Conv" && ctx.node.Has("_int8")) return cpu::DnnlConvInt8SupportsNhwc(ctx);
    if (op == "Conv") return cpu::DnnlConvSupportsNhwc(ctx);
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool")
      return cpu::DnnlPoolSupportsNhwc(ctx);
    if (op == "BatchNormalization") return cpu::BatchNormSupportsNhwc(ctx);
    if (op == "InstanceNormalization" || op == "GroupNormalization" || op == kGroupNormOp)
      return CpuGroupNormSupportsNhwc(ctx);
    if (op == "ConvTranspose") return cpu::DnnlDeconvSupportsNhwc(ctx);
  } catch (const dnnl::error&) {
    return false;  // no primitive for this case: the factory would not build one either
  }
  return false;
}

bool CpuKernelFusesDepthwise(const KernelBuildContext& ctx) {
  if (!WithinFastKernelLimits(ctx)) return false;
  try {
    return cpu::DnnlConvFusesDepthwise(ctx);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool CpuKernelFusesPRelu(const KernelBuildContext& ctx) {
  if (!WithinFastKernelLimits(ctx)) return false;
  try {
    return cpu::DnnlConvFusesPRelu(ctx);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool CpuKernelTakesFusedInput(const KernelBuildContext& ctx) {
  if (!WithinFastKernelLimits(ctx)) return false;
  try {
    return cpu::CpuConvTakesFusedInput(ctx);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool CpuKernelFusesPool(const KernelBuildContext& ctx) {
  if (!WithinFastKernelLimits(ctx)) return false;
  try {
    return cpu::CpuConvFusesPool(ctx);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool CpuKernelTakesAttention(const KernelBuildContext& ctx) {
  return WithinFastKernelLimits(ctx) && cpu::CreateAttentionViews(ctx) != nullptr;
}

std::unique_ptr<Kernel> CreateLayoutReorderKernel(const Shape& shape, Layout from, Layout to, int num_threads) {
  return cpu::CreateDnnlLayoutReorder(shape, from, to, num_threads);
}

}  // namespace osprey
